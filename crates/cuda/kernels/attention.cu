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
// attention_decode: flash-decoding. The query heads of one KV head attend to positions
//   first..n_pos, score s = (q * scale) . k, soft-capped to softcap * tanh(s / softcap) when
//   softcap > 0 (Gemma 2), then softmax; with `sinks` (null: none; gpt-oss) head h's sink logit
//   sinks[h] joins the softmax's max and normaliser as one more score without a value:
//   out = sum_p e^(s_p - M) v_p / (e^(sink - M) + sum_p e^(s_p - M)), M the largest of the
//   scores and the sink (one chunk: here; more: in attention_merge, once). The positions
//   are cut into chunks of `chunk` (gridDim.z = ceil((n_pos - first) / chunk), each chunk
//   non-empty); block (x, y, z) takes query heads y * group + x * ATT_GROUP .. + ATT_GROUP of
//   KV head y (group = n_heads / n_kv_heads: K and V are read once for all of them) over
//   chunk z. One position's row is
//   read by a segment of `lpp` lanes (the row's 16-byte pieces rounded up to a power of two),
//   16 bytes per lane and load when head_dim fills whole pieces (else element by element,
//   padded with 0), 32 / lpp positions at once per warp, ATT_WARPS warps: each segment keeps a
//   running max, normaliser and unnormalised output per query head; segments, then warps, are
//   merged in a fixed order (the same bits on every run). With one chunk the block writes
//   out = acc / l; with more it writes its (acc, max, l) to part ([n_heads][n_chunks][head_dim
//   + 2]) and attention_merge combines the chunks in order.
//   head_dim <= ATT_MAX_HEAD_DIM; first < n_pos. Launch: blockDim.x = ATT_WARPS * 32, static
//   shared memory only.
// attention_merge: out[h] = sum_c acc_c exp(m_c - M) / (e^(sink - M) + sum_c l_c exp(m_c - M)),
//   M = max(sink, max_c m_c), over the n_chunks partial states of head h = blockIdx.x
//   (gridDim.x = n_heads), chunks in order; sink = sinks[h], or none (the term 0, M over the
//   chunks) when sinks is null. blockDim.x = 256.

#define ATT_WARPS 4
#define ATT_GROUP 4
#define ATT_MAX_HEAD_DIM 256
// Output values a lane keeps per query head: 8 (one 16-byte piece of f16, two of f32).
#define ATT_LANE_VALS 8

// A cache element from an f32 value, and back: f16 bits (round to nearest even), or f32 as is.
__device__ __forceinline__ void kv_put(u16* p, float v) { *p = f32_to_f16(v); }
__device__ __forceinline__ void kv_put(float* p, float v) { *p = v; }
__device__ __forceinline__ float kv_get(u16 h) { return f16_to_f32(h); }
__device__ __forceinline__ float kv_get(float v) { return v; }

// The bits of one cache element as a u32 (f16 in the low half).
__device__ __forceinline__ u32 kv_bits(u16 h) { return (u32)h; }
__device__ __forceinline__ u32 kv_bits(float v) { return (u32)__float_as_int(v); }

template <typename T>
__device__ __forceinline__ void kv_store_impl(const float* k, const float* v, int kv_dim, int pos,
                                              T* cache_k, T* cache_v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= kv_dim) return;
    kv_put(&cache_k[(i64)pos * kv_dim + i], k[i]);
    kv_put(&cache_v[(i64)pos * kv_dim + i], v[i]);
}

// Piece j (16 bytes: 16 / sizeof(T) elements) of a cache row of head_dim elements: one load
// when `vec` (head_dim fills whole pieces; the row then starts 16-byte aligned), else element
// by element with the elements past head_dim 0.
template <typename T>
__device__ __forceinline__ Vec16 kv_piece(const T* row, int j, int head_dim, bool vec) {
    constexpr int E = 16 / sizeof(T);
    if (vec) return *(const Vec16*)(row + j * E);
    u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int i = j * E + e;
        const u32 b = i < head_dim ? kv_bits(row[i]) : 0u;
        if (sizeof(T) == 2) {
            w[e / 2] |= b << (16 * (e % 2));
        } else {
            w[e] = b;
        }
    }
    Vec16 v;
    v.a = w[0];
    v.b = w[1];
    v.c = w[2];
    v.d = w[3];
    return v;
}

// The elements of a piece as floats (E = 8 for f16, 4 for f32).
__device__ __forceinline__ void piece_floats(Vec16 v, const u16*, float* f) {
    const u32 w[4] = {v.a, v.b, v.c, v.d};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[2 * k] = f16_to_f32((u16)(w[k] & 0xffffu));
        f[2 * k + 1] = f16_to_f32((u16)(w[k] >> 16));
    }
}
__device__ __forceinline__ void piece_floats(Vec16 v, const float*, float* f) {
    f[0] = __int_as_float((int)v.a);
    f[1] = __int_as_float((int)v.b);
    f[2] = __int_as_float((int)v.c);
    f[3] = __int_as_float((int)v.d);
}

// Online-softmax state b merged into a: (max, normaliser, output) of two position sets; a set
// with no position has max -inf and weighs nothing.
__device__ __forceinline__ void softmax_merge(float& m, float& l, float* acc, float mo, float lo,
                                              const float* acco) {
    const float mn = fmaxf(m, mo);
    const float a = m == NEG_INF ? 0.0f : expf(m - mn);
    const float b = mo == NEG_INF ? 0.0f : expf(mo - mn);
    l = l * a + lo * b;
#pragma unroll
    for (int t = 0; t < ATT_LANE_VALS; ++t) acc[t] = acc[t] * a + acco[t] * b;
    m = mn;
}

template <typename T>
__device__ __forceinline__ void attention_decode_impl(const float* q, const T* cache_k,
                                                      const T* cache_v, int first, int n_pos,
                                                      int group, int head_dim, int kv_dim,
                                                      float scale, float softcap,
                                                      const float* sinks, int chunk, float* part,
                                                      float* out) {
    constexpr int E = 16 / sizeof(T);      // elements per 16-byte piece
    constexpr int CPL = ATT_LANE_VALS / E;  // pieces per lane
    SHARED_ARRAY(float, qs, [ATT_GROUP][ATT_MAX_HEAD_DIM]);
    SHARED_ARRAY(float, wm, [ATT_WARPS][ATT_GROUP]);
    SHARED_ARRAY(float, wl, [ATT_WARPS][ATT_GROUP]);
    SHARED_ARRAY(float, wacc, [ATT_WARPS][ATT_GROUP][ATT_MAX_HEAD_DIM]);
    const int kvh = blockIdx.y;
    const int h0 = kvh * group + blockIdx.x * ATT_GROUP;
    const int gh = min(ATT_GROUP, kvh * group + group - h0);  // query heads of this block
    const int c = blockIdx.z, n_chunks = gridDim.z;
    const int p0 = first + c * chunk, p1 = min(n_pos, p0 + chunk);
    const int nch = (head_dim + E - 1) / E;  // pieces per row
    int lsh = 0;
    while ((1 << lsh) < nch && (1 << lsh) < WARP) ++lsh;
    const int lpp = 1 << lsh, ppw = WARP >> lsh;  // lanes per position, positions per warp
    const bool vec = head_dim % E == 0;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int seg = lane >> lsh, j0 = lane & (lpp - 1);
    const int padded = nch * E;
    for (int g = 0; g < ATT_GROUP; ++g) {
        for (int d = threadIdx.x; d < padded; d += blockDim.x) {
            qs[g][d] = g < gh && d < head_dim ? q[(i64)(h0 + g) * head_dim + d] * scale : 0.0f;
        }
    }
    __syncthreads();

    float m[ATT_GROUP], l[ATT_GROUP], acc[ATT_GROUP][ATT_LANE_VALS];
#pragma unroll
    for (int g = 0; g < ATT_GROUP; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_LANE_VALS; ++t) acc[g][t] = 0.0f;
    }
    // The warp walks its positions together (the shuffles need every lane); a segment past the
    // chunk's end reads nothing and keeps its state.
    for (int base = p0 + warp * ppw; base < p1; base += ATT_WARPS * ppw) {
        const int p = base + seg;
        const bool on = p < p1;
        const T* kr = cache_k + (i64)p * kv_dim + (i64)kvh * head_dim;
        const T* vr = cache_v + (i64)p * kv_dim + (i64)kvh * head_dim;
        Vec16 kp[CPL], vp[CPL];
#pragma unroll
        for (int t = 0; t < CPL; ++t) {  // every load first
            const int j = j0 + (t << lsh);
            const bool in = on && j < nch;
            kp[t] = in ? kv_piece(kr, j, head_dim, vec) : Vec16{0u, 0u, 0u, 0u};
            vp[t] = in ? kv_piece(vr, j, head_dim, vec) : Vec16{0u, 0u, 0u, 0u};
        }
        float kf[ATT_LANE_VALS], vf[ATT_LANE_VALS];
#pragma unroll
        for (int t = 0; t < CPL; ++t) {
            piece_floats(kp[t], cache_k, kf + t * E);
            piece_floats(vp[t], cache_v, vf + t * E);
        }
#pragma unroll
        for (int g = 0; g < ATT_GROUP; ++g) {
            float s = 0.0f;
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = j0 + (t << lsh);
                if (j < nch) {
#pragma unroll
                    for (int e = 0; e < E; ++e) s += qs[g][j * E + e] * kf[t * E + e];
                }
            }
            for (int o = lpp / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (on && g < gh) {
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                const float m_new = fmaxf(m[g], s);
                const float corr = expf(m[g] - m_new);  // 0 at the first position (m = -inf)
                const float e = expf(s - m_new);
                l[g] = l[g] * corr + e;
#pragma unroll
                for (int t = 0; t < ATT_LANE_VALS; ++t) acc[g][t] = acc[g][t] * corr + e * vf[t];
                m[g] = m_new;
            }
        }
    }
    // The warp's segments merged (butterfly over the segment bits: both sides of each exchange
    // compute the same bits), then its state to shared memory by segment 0.
#pragma unroll
    for (int g = 0; g < ATT_GROUP; ++g) {
        for (int o = lpp; o < WARP; o <<= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
            float ao[ATT_LANE_VALS];
#pragma unroll
            for (int t = 0; t < ATT_LANE_VALS; ++t) ao[t] = __shfl_xor_sync(0xffffffffu, acc[g][t], o);
            softmax_merge(m[g], l[g], acc[g], mo, lo, ao);
        }
        if (seg == 0) {
#pragma unroll
            for (int t = 0; t < CPL; ++t) {
                const int j = j0 + (t << lsh);
                if (j < nch) {
#pragma unroll
                    for (int e = 0; e < E; ++e) wacc[warp][g][j * E + e] = acc[g][t * E + e];
                }
            }
        }
        if (lane == 0) {
            wm[warp][g] = m[g];
            wl[warp][g] = l[g];
        }
    }
    __syncthreads();
    // The warps merged in order, per query head and output value; with one chunk the head's
    // sink (if any) joins the max and the normaliser first (more chunks: attention_merge).
    const bool sink = sinks != nullptr && n_chunks == 1;
    for (int g = 0; g < gh; ++g) {
        const float sv = sink ? sinks[h0 + g] : NEG_INF;
        float gm = sv;
        for (int w = 0; w < ATT_WARPS; ++w) gm = fmaxf(gm, wm[w][g]);
        float den = sink ? expf(sv - gm) : 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w) {
            if (wl[w][g] > 0.0f) den += wl[w][g] * expf(wm[w][g] - gm);
        }
        float* pc = part + ((i64)(h0 + g) * n_chunks + c) * (head_dim + 2);
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float a = 0.0f;
            for (int w = 0; w < ATT_WARPS; ++w) {
                if (wl[w][g] > 0.0f) a += wacc[w][g][d] * expf(wm[w][g] - gm);
            }
            if (n_chunks == 1) {
                out[(i64)(h0 + g) * head_dim + d] = a / den;
            } else {
                pc[d] = a;
            }
        }
        if (n_chunks > 1 && threadIdx.x == 0) {
            pc[head_dim] = gm;
            pc[head_dim + 1] = den;
        }
    }
}

KERNEL attention_merge(const float* part, int n_chunks, int head_dim, const float* sinks,
                       float* out) {
    const int h = blockIdx.x;
    const float* ph = part + (i64)h * n_chunks * (head_dim + 2);
    const float sv = sinks ? sinks[h] : NEG_INF;
    float gm = sv;
    for (int c = 0; c < n_chunks; ++c) gm = fmaxf(gm, ph[(i64)c * (head_dim + 2) + head_dim]);
    float den = sinks ? expf(sv - gm) : 0.0f;
    for (int c = 0; c < n_chunks; ++c) {
        const float* pc = ph + (i64)c * (head_dim + 2);
        den += pc[head_dim + 1] * expf(pc[head_dim] - gm);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int c = 0; c < n_chunks; ++c) {
            const float* pc = ph + (i64)c * (head_dim + 2);
            a += pc[d] * expf(pc[head_dim] - gm);
        }
        out[(i64)h * head_dim + d] = a / den;
    }
}
EMU_ENTRY(attention_merge)

// The entries of one cache element type T, named KV_STORE and ATTENTION_DECODE.
#define KV_CACHE_KERNELS(KV_STORE, ATTENTION_DECODE, T)                                         \
    KERNEL KV_STORE(const float* k, const float* v, int kv_dim, int pos, T* cache_k,            \
                    T* cache_v) {                                                               \
        kv_store_impl<T>(k, v, kv_dim, pos, cache_k, cache_v);                                  \
    }                                                                                           \
    EMU_ENTRY(KV_STORE)                                                                         \
    KERNEL_N(ATT_WARPS * WARP) ATTENTION_DECODE(                                                \
        const float* q, const T* cache_k, const T* cache_v, int first, int n_pos, int group,    \
        int head_dim, int kv_dim, float scale, float softcap, const float* sinks, int chunk,    \
        float* part, float* out) {                                                              \
        attention_decode_impl<T>(q, cache_k, cache_v, first, n_pos, group, head_dim, kv_dim,    \
                                 scale, softcap, sinks, chunk, part, out);                      \
    }                                                                                           \
    EMU_ENTRY(ATTENTION_DECODE)

KV_CACHE_KERNELS(kv_store, attention_decode, u16)
KV_CACHE_KERNELS(kv_store_f32, attention_decode_f32, float)
