// Elementwise f32 kernels. Thread per element; blockDim.x = 256, grid ceil(n / 256).
//
// add: y[i] += x[i] (residual adds, and merging the CPU's partial FFN sum into the GPU's).
// threshold_mask: h[i] = 0 where |h[i]| < t (threshold-mode sparsity: small activations of the
//   gate/up product are dropped before the down pass).
// softcap: y[i] = cap * tanh(y[i] / cap), cap > 0 (Gemma 2's final logits).
// copy: dst[i] = src[i] (the residual saved for a parallel attention + FFN block).
// fill: y[i] = v (an FFN output buffer cleared before the down passes add into it).

KERNEL add(float* y, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
EMU_ENTRY(add)

KERNEL threshold_mask(float* h, int n, float t) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && fabsf(h[i]) < t) h[i] = 0.0f;
}
EMU_ENTRY(threshold_mask)

KERNEL softcap(float* y, int n, float cap) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = cap * tanhf(y[i] / cap);
}
EMU_ENTRY(softcap)

KERNEL copy(float* dst, const float* src, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
EMU_ENTRY(copy)

KERNEL fill(float* y, int n, float v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}
EMU_ENTRY(fill)

// Mixture-of-experts routing on the hot neurons of a layer's flattened neuron space (the routed
// experts' neurons, expert e holding e * expert_ffn .. (e + 1) * expert_ffn, then the shared
// expert's from `routed` on). `w` holds the token's weight of each expert (0: not routed) and,
// at n_expert, the shared expert's scale.
__device__ __forceinline__ int expert_of(int id, int expert_ffn, int routed, int n_expert) {
    return id < routed ? id / expert_ffn : n_expert;
}

// expert_flags: flags[j] = (w[expert of j] != 0) for j in 0..n: the routed experts' neurons
// active for the hot gate/up pass (its `flags`), the others not read.
KERNEL expert_flags(const float* w, int expert_ffn, int routed, int n_expert, int n, int* flags) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) flags[j] = w[expert_of(j, expert_ffn, routed, n_expert)] != 0.0f;
}
EMU_ENTRY(expert_flags)

// expert_scale: h[s] *= w[expert of slot s's neuron] for the hot slots s in 0..n (ids read from
// the slabs through ids_l; a padding slot, id -1, is left alone): each hot neuron's activation
// weighted by its expert's routing weight before the down pass sums them.
KERNEL expert_scale(const u8* slabs, RowLayout ids_l, const float* w, int expert_ffn, int routed,
                    int n_expert, int n, float* h) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n) return;
    const int id = *(const int*)row_ptr(slabs, ids_l, s);
    if (id >= 0) h[s] *= w[expert_of(id, expert_ffn, routed, n_expert)];
}
EMU_ENTRY(expert_scale)
