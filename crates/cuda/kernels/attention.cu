// Decode attention over a KV cache in VRAM, grouped-query, online softmax.
//
// Cache layout per layer: cache_k, cache_v are [context, kv_dim] (kv_dim = n_kv_heads *
// head_dim), position p's row at p * kv_dim, as the plan accounts them. The cache holds f16
// (u16 bits; the default) or f32: KV_CACHE_KERNELS below emits both kernels per element type,
// `kv_store` / `attention_decode` for f16 and `kv_store_f32` / `attention_decode_f32` for f32,
// with the same parameters (but for the caches' type) and the same launch geometry.
//
// kv_store: writes one position's k and v (f32) into the caches: rounded to f16 (nearest
//   even), or as they are. Thread per element.
// attention_decode: the query over positions first..n_pos (first > 0: a sliding window), score
//   s = (q * scale) . k, soft-capped to softcap * tanh(s / softcap) when softcap > 0 (Gemma 2),
//   then softmax. One block per query head (gridDim.x = n_heads), ATT_WARPS warps; warp w
//   takes positions first + w, first + w + ATT_WARPS, ... and keeps its own running max,
//   normaliser and output (each lane holds head_dim / 32 of the output); the warps' states are
//   merged at the end. Query head h reads kv head h / (n_heads / n_kv_heads).
//   head_dim <= 32 * ATT_MAX_PER_LANE; first < n_pos.

#define ATT_WARPS 4
#define ATT_MAX_PER_LANE 8
#define ATT_MAX_HEAD_DIM (WARP * ATT_MAX_PER_LANE)

// A cache element from an f32 value, and back: f16 bits (round to nearest even), or f32 as is.
__device__ __forceinline__ void kv_put(u16* p, float v) { *p = f32_to_f16(v); }
__device__ __forceinline__ void kv_put(float* p, float v) { *p = v; }
__device__ __forceinline__ float kv_get(u16 h) { return f16_to_f32(h); }
__device__ __forceinline__ float kv_get(float v) { return v; }

template <typename T>
__device__ __forceinline__ void kv_store_impl(const float* k, const float* v, int kv_dim, int pos,
                                              T* cache_k, T* cache_v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    kv_put(&cache_k[(i64)pos * kv_dim + i], k[i]);
    kv_put(&cache_v[(i64)pos * kv_dim + i], v[i]);
}

template <typename T>
__device__ __forceinline__ void attention_decode_impl(const float* q, const T* cache_k,
                                                      const T* cache_v, int first, int n_pos,
                                                      int n_heads, int n_kv_heads, int head_dim,
                                                      float scale, float softcap, float* out) {
    SHARED_ARRAY(float, qs, [ATT_MAX_HEAD_DIM]);
    SHARED_ARRAY(float, wm, [ATT_WARPS]);
    SHARED_ARRAY(float, wl, [ATT_WARPS]);
    SHARED_ARRAY(float, wacc, [ATT_WARPS][ATT_MAX_HEAD_DIM]);
    const int h = blockIdx.x;
    const int kvh = h / (n_heads / n_kv_heads);
    const int kv_dim = n_kv_heads * head_dim;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) qs[i] = q[(i64)h * head_dim + i] * scale;
    __syncthreads();

    float m = NEG_INF, l = 0.0f;
    float acc[ATT_MAX_PER_LANE];
#pragma unroll
    for (int t = 0; t < ATT_MAX_PER_LANE; ++t) acc[t] = 0.0f;
    for (int p = first + warp; p < n_pos; p += ATT_WARPS) {
        const T* kp = cache_k + (i64)p * kv_dim + (i64)kvh * head_dim;
        const T* vp = cache_v + (i64)p * kv_dim + (i64)kvh * head_dim;
        float s = 0.0f;
        for (int i = lane; i < head_dim; i += WARP) s += qs[i] * kv_get(kp[i]);
        s = warp_sum(s);
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
        const float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int t = 0; t < ATT_MAX_PER_LANE; ++t) {
            const int i = lane + t * WARP;
            if (i < head_dim) acc[t] = acc[t] * corr + e * kv_get(vp[i]);
        }
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < ATT_MAX_PER_LANE; ++t) {
        const int i = lane + t * WARP;
        if (i < head_dim) wacc[warp][i] = acc[t];
    }
    __syncthreads();
    float gm = NEG_INF;
    for (int w = 0; w < ATT_WARPS; ++w) gm = fmaxf(gm, wm[w]);
    float denom = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) denom += wl[w] * expf(wm[w] - gm);  // idle warps: l = 0
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) {
            if (wl[w] > 0.0f) o += wacc[w][i] * expf(wm[w] - gm);
        }
        out[(i64)h * head_dim + i] = o / denom;
    }
}

// The entries of one cache element type T, named KV_STORE and ATTENTION_DECODE.
#define KV_CACHE_KERNELS(KV_STORE, ATTENTION_DECODE, T)                                         \
    KERNEL KV_STORE(const float* k, const float* v, int kv_dim, int pos, T* cache_k,            \
                    T* cache_v) {                                                               \
        kv_store_impl<T>(k, v, kv_dim, pos, cache_k, cache_v);                                  \
    }                                                                                           \
    EMU_ENTRY(KV_STORE)                                                                         \
    KERNEL_N(ATT_WARPS * WARP) ATTENTION_DECODE(                                                \
        const float* q, const T* cache_k, const T* cache_v, int first, int n_pos, int n_heads,  \
        int n_kv_heads, int head_dim, float scale, float softcap, float* out) {                 \
        attention_decode_impl<T>(q, cache_k, cache_v, first, n_pos, n_heads, n_kv_heads,        \
                                 head_dim, scale, softcap, out);                                \
    }                                                                                           \
    EMU_ENTRY(ATTENTION_DECODE)

KV_CACHE_KERNELS(kv_store, attention_decode, u16)
KV_CACHE_KERNELS(kv_store_f32, attention_decode_f32, float)
