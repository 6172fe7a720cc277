// RMSNorm, LayerNorm and rotary position embeddings on f32 rows.
//
// rms_norm: out = x / sqrt(mean(x^2) + eps) * w, one block per row (rows = gridDim.x, each n
//   long), blockDim.x a multiple of 32 up to 1024; a thread's loads go NORM_BATCH at a time
//   (below), the order of the sums unchanged.
//   With xq (not null; n a multiple of 32) a norm also writes its output quantized for the
//   integer dots (common.cuh's XQ_BLOCK blocks, row r's at xq + r * n / 32 * XQ_BLOCK), the
//   bytes `quantize_x` would write for it: one launch fewer before each quantized matvec that
//   reads a norm. Each warp of the output loop holds exactly one block of 32 consecutive values
//   (blockDim.x is a multiple of 32), so it quantizes what it stores.
// layer_norm: out = (x - mean) / sqrt(var + eps) * w + b with the biased variance
//   mean((x - mean)^2) (OPT, Falcon), one block per row as rms_norm, two block reductions
//   (the mean, then the variance around it); xq as rms_norm's.
// rope: rotates the first 2 * n_pairs values of every head of q (nq heads x head_dim,
//   contiguous) and of k (nk heads; null when nk = 0) in place for position pos, the rest of
//   each head unchanged (partial RoPE): the queries and keys of a layer in one launch. Style 0 =
//   "norm" (adjacent pairs 2i, 2i+1: GGUF llama), 1 = "neox" (i, i + n_pairs: HF). Pair i turns
//   by the angle whose cosine and sine are a.cos[i], a.sin[i]: pos times the model's angle per
//   position (theta^(-2i/rope_dims) over its scaling factors), formed and evaluated by the host
//   in double, as on the CPU (positions reach tens of thousands of radians, where f32 loses the
//   phase; a double sincos here would need a stack frame for its argument reduction), passed by
//   value. With qn (kn) not null each head of q (k) is first RMS-normed over its head_dim
//   values with weight qn (kn) and eps (the per-head q/k norm of Qwen3, Gemma 3: one launch for
//   norm and rotation). A warp per head (grid covers 32 * (nq + nk) threads): the norm's sum of
//   squares over the head, then lane l takes pairs l, l + 32, ... (both values of a pair) and,
//   when normed, the unrotated values 2 * n_pairs + l, ...: each value read and written by one
//   lane.

#define MAX_ROPE_PAIRS 256
struct RopeAngles {
    float cos[MAX_ROPE_PAIRS];
    float sin[MAX_ROPE_PAIRS];
};

// The sum of v over the block, returned to every thread (each warp sums the warps' partial
// sums in the same order, so all get the same bits). `partial` is WARP floats of shared
// memory; every thread of the block must call it, and it may be called again at once.
__device__ __forceinline__ float block_sum(float v, float* partial) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    v = warp_sum(v);
    __syncthreads();  // the previous call's reads of partial are done
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_sum(lane < (int)(blockDim.x / WARP) ? partial[lane] : 0.0f);
}

// A thread's elements i = threadIdx.x + k * blockDim.x are visited NORM_BATCH at a time: the
// round's loads into registers first, then the arithmetic (and the stores) in the same order as
// one at a time. On an H200 (benchmarks/gpu/NOTES.md) `#pragma unroll` on the plain loop still
// loaded every element into the same register after the previous one's use (and the stores
// through `o` may alias x), so rms_norm of 4096 values took 14-15 us: a DRAM round trip each.
#define NORM_BATCH 8

// v[j] = p[i0 + j * blockDim.x], 0 past n: one round's loads, issued together.
__device__ __forceinline__ void load_batch(const float* p, int i0, int n, float* v) {
#pragma unroll
    for (int j = 0; j < NORM_BATCH; ++j) {
        const int i = i0 + j * (int)blockDim.x;
        v[j] = i < n ? p[i] : 0.0f;
    }
}

// Store value r of output element i (loop round i0, batch element j) and, with xq, quantize the
// warp's block of 32 (uniform over the warp: n is then a multiple of 32, and the warp's
// elements are 32 consecutive ones starting at a multiple of 32).
__device__ __forceinline__ void store_norm(float* o, u8* xq, int i, int n, float r) {
    if (i < n) o[i] = r;
    if (xq != nullptr && i - (int)(threadIdx.x % WARP) < n) {
        quantize_block_warp(r, xq + XQ_BLOCK * (i / QK));
    }
}

KERNEL rms_norm(const float* x, const float* w, int n, float eps, float* out, u8* xq) {
    SHARED_ARRAY(float, partial, [WARP]);
    const float* xr = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    u8* q = xq == nullptr ? nullptr : xq + (i64)blockIdx.x * (n / QK) * XQ_BLOCK;
    const int step = NORM_BATCH * blockDim.x;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += step) {
        float v[NORM_BATCH];
        load_batch(xr, i0, n, v);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) ss += v[j] * v[j];  // + 0 past n: the same bits
    }
    const float scale = rsqrtf(block_sum(ss, partial) / (float)n + eps);
    for (int i0 = threadIdx.x; i0 < n; i0 += step) {
        float v[NORM_BATCH], g[NORM_BATCH];
        load_batch(xr, i0, n, v);
        load_batch(w, i0, n, g);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) store_norm(o, q, i0 + j * (int)blockDim.x, n, v[j] * scale * g[j]);
    }
}
EMU_ENTRY(rms_norm)

KERNEL layer_norm(const float* x, const float* w, const float* b, int n, float eps, float* out,
                  u8* xq) {
    SHARED_ARRAY(float, partial, [WARP]);
    const float* xr = x + (i64)blockIdx.x * n;
    float* o = out + (i64)blockIdx.x * n;
    u8* q = xq == nullptr ? nullptr : xq + (i64)blockIdx.x * (n / QK) * XQ_BLOCK;
    const int step = NORM_BATCH * blockDim.x;
    float s = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += step) {
        float v[NORM_BATCH];
        load_batch(xr, i0, n, v);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) s += v[j];
    }
    const float mean = block_sum(s, partial) / (float)n;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += step) {
        float v[NORM_BATCH];
        load_batch(xr, i0, n, v);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) {
            const float d = i0 + j * (int)blockDim.x < n ? v[j] - mean : 0.0f;
            ss += d * d;
        }
    }
    const float scale = rsqrtf(block_sum(ss, partial) / (float)n + eps);
    for (int i0 = threadIdx.x; i0 < n; i0 += step) {
        float v[NORM_BATCH], g[NORM_BATCH], c[NORM_BATCH];
        load_batch(xr, i0, n, v);
        load_batch(w, i0, n, g);
        load_batch(b, i0, n, c);
#pragma unroll
        for (int j = 0; j < NORM_BATCH; ++j) {
            const float r = (v[j] - mean) * scale * g[j] + c[j];
            store_norm(o, q, i0 + j * (int)blockDim.x, n, r);
        }
    }
}
EMU_ENTRY(layer_norm)

KERNEL rope(float* q, int nq, float* k, int nk, int head_dim, int n_pairs,
            const __grid_constant__ RopeAngles ang, int neox, const float* qn, const float* kn,
            float eps) {
    const int lane = threadIdx.x % WARP;
    const int head = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (head >= nq + nk) return;  // whole warps
    float* h = head < nq ? q + (i64)head * head_dim : k + (i64)(head - nq) * head_dim;
    const float* w = head < nq ? qn : kn;
    float scale = 1.0f;
    if (w != nullptr) {
        float ss = 0.0f;
        for (int j = lane; j < head_dim; j += WARP) ss += h[j] * h[j];
        scale = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
        for (int j = 2 * n_pairs + lane; j < head_dim; j += WARP) h[j] = h[j] * scale * w[j];
    }
    for (int i = lane; i < n_pairs; i += WARP) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + n_pairs : 2 * i + 1;
        float x0 = h[a], x1 = h[b];
        if (w != nullptr) {
            x0 = x0 * scale * w[a];
            x1 = x1 * scale * w[b];
        }
        const float cf = ang.cos[i], sf = ang.sin[i];
        h[a] = x0 * cf - x1 * sf;
        h[b] = x0 * sf + x1 * cf;
    }
}
EMU_ENTRY(rope)
