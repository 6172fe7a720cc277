// Decode attention over an f16 KV cache in VRAM, grouped-query, online softmax.
//
// Cache layout per layer: cache_k, cache_v are [context, kv_dim] f16 (kv_dim = n_kv_heads *
// head_dim), position p's row at p * kv_dim, as the plan accounts them.
//
// kv_store: writes one position's k and v (f32) into the caches as f16. Thread per element.
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

extern "C" __global__ void kv_store(const float* k, const float* v, int kv_dim, int pos,
                                    u16* cache_k, u16* cache_v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    cache_k[(i64)pos * kv_dim + i] = f32_to_f16(k[i]);
    cache_v[(i64)pos * kv_dim + i] = f32_to_f16(v[i]);
}
EMU_ENTRY(kv_store)

extern "C" __global__ void attention_decode(const float* q, const u16* cache_k, const u16* cache_v,
                                            int first, int n_pos, int n_heads, int n_kv_heads,
                                            int head_dim, float scale, float softcap, float* out) {
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
        const u16* kp = cache_k + (i64)p * kv_dim + (i64)kvh * head_dim;
        const u16* vp = cache_v + (i64)p * kv_dim + (i64)kvh * head_dim;
        float s = 0.0f;
        for (int i = lane; i < head_dim; i += WARP) s += qs[i] * f16_to_f32(kp[i]);
        s = warp_sum(s);
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
        const float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int t = 0; t < ATT_MAX_PER_LANE; ++t) {
            const int i = lane + t * WARP;
            if (i < head_dim) acc[t] = acc[t] * corr + e * f16_to_f32(vp[i]);
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
EMU_ENTRY(attention_decode)
