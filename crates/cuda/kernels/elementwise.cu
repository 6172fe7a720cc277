// Elementwise f32 kernels. Thread per element; blockDim.x = 256, grid ceil(n / 256).
//
// act_mul: g[i] = act(g[i]) * u[i] (the dense FFN's gating, when gate and up were computed by
//   separate matvecs).
// add: y[i] += x[i] (residual adds, and merging the CPU's partial FFN sum into the GPU's).
// threshold_mask: h[i] = 0 where |h[i]| < t (threshold-mode sparsity: small activations of the
//   gate/up product are dropped before the down pass).

extern "C" __global__ void act_mul(float* g, const float* u, int n, int act) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = apply_act(act, g[i]) * u[i];
}
EMU_ENTRY(act_mul)

extern "C" __global__ void add(float* y, const float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
EMU_ENTRY(add)

extern "C" __global__ void threshold_mask(float* h, int n, float t) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && fabsf(h[i]) < t) h[i] = 0.0f;
}
EMU_ENTRY(threshold_mask)
