// A mixture of experts' routing applied on the GPU to the hot neurons of a layer. Thread per
// element; blockDim.x = 256, grid ceil(n / 256).
//
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
