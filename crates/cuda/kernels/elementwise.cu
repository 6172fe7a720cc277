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
