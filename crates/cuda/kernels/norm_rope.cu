// RMSNorm and rotary position embeddings on f32 rows.
//
// rms_norm: out = x / sqrt(mean(x^2) + eps) * w, one block per row (rows = gridDim.x, each n
//   long), blockDim.x a multiple of 32 up to 1024.
// rope: rotates every head of x (n_heads x head_dim, contiguous) in place for position pos;
//   style 0 = "norm" (adjacent pairs 2i, 2i+1: GGUF llama), 1 = "neox" (halves i, i + d/2: HF).
//   Angles pos * theta^(-2i/d) are computed in double, as on the CPU (positions reach tens of
//   thousands of radians, where f32 loses the phase). Thread per (head, i), grid covers
//   n_heads * head_dim / 2 threads.

extern "C" __global__ void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
    __shared__ float partial[WARP];
    const float* xr = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float v = lane < (int)(blockDim.x / WARP) ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0) partial[0] = v;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

extern "C" __global__ void rope(float* x, int n_heads, int head_dim, int pos, float theta, int neox) {
    const int half = head_dim / 2;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_heads * half) return;
    const int head = t / half, i = t % half;
    const double inv_freq = pow((double)theta, -2.0 * (double)i / (double)head_dim);
    double s, c;
    sincos((double)pos * inv_freq, &s, &c);
    float* h = x + (i64)head * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    const float cf = (float)c, sf = (float)s;
    h[a] = x0 * cf - x1 * sf;
    h[b] = x0 * sf + x1 * cf;
}
