// The integer dots of sparse_matvec.cu's quantized kernels (prepended to it after common.cuh:
// kernels.rs `SPARSE_MATVEC.header`, and included by the emulator's build).
//
// x is quantized once per input vector by `quantize_x` (sparse_matvec.cu) into blocks of 32
// values, XQ_BLOCK = 80 bytes each: h[32] and l[32] (signed bytes, weight order), then the f32
// scale, the f32 sums of x[0..16] and x[16..32], and the i32 Σ q. The block's int16 values are
// q[j] = 256·h[j] + l[j] = round(x[j] / scale), scale = max|x| / 32639: the CPU engine's int16 x
// (crates/cpu/src/kernels/avx2/int16.rs, split as its split8.rs), so the GPU multiplies the same
// x̂ = scale·q the CPU does, and each block's Σ w_q·q is exact in i32: two `__dp4a` per four
// weights, Σ w·h and Σ w·l, then 256·Σh + Σl. Against f32 x the loop reads half the bytes of x
// from shared memory (64 of quants and 16 of header per 32 weights, all 16-byte loads) and does
// 16 integer dot instructions per 32 weights instead of 32 conversions and 32 FMAs.
//
// The 80-byte stride puts the 8 lanes of each quarter-warp on disjoint banks when they read
// consecutive blocks' 16-byte pieces (lane k at word 20k: banks 0, 20, 8, 28, 16, 4, 24, 12),
// and for Q4_K/Q5_K's eight lanes of a super-block (blocks 2c, at words 40c + 4·(e % 2)).
// Q6_K's lanes read blocks 4n + a with two lanes per 4-bank group: 2-way conflicts there.

// XQ_BLOCK and XQ_MAX, and the warp that writes a block (`quantize_block_warp`), are in
// common.cuh: the norms write x's quantized copy as they write x (norm_rope.cu).

// Four signed-byte products summed into c (`__dp4a`).
__device__ __forceinline__ int dp4(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

// Low nibbles of four bytes, as four bytes.
#define NIB 0x0f0f0f0fu

// Bit 4 of four bytes from four bits t (bit k to byte k): the four shifted copies of t in the
// product do not overlap, so bit k of copy k lands alone at bit 8k.
__device__ __forceinline__ u32 bit4_bytes(u32 t) { return ((t * 0x00204081u) & 0x01010101u) << 4; }

// Four unsigned bytes below 64, each minus 32, as signed bytes (no borrow crosses a byte: each
// is first raised by 128).
__device__ __forceinline__ u32 minus32_bytes(u32 q) {
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// Σ_j w_j · q_j over 16 weights: w as four words of signed bytes, x's high and low bytes h, l
// (16 each) of the same weights; exact (|sum| < 2^27).
__device__ __forceinline__ int idot16(const u32* w, const Vec16 h, const Vec16 l) {
    int sh = dp4(w[0], h.a, 0), sl = dp4(w[0], l.a, 0);
    sh = dp4(w[1], h.b, sh), sl = dp4(w[1], l.b, sl);
    sh = dp4(w[2], h.c, sh), sl = dp4(w[2], l.c, sl);
    sh = dp4(w[3], h.d, sh), sl = dp4(w[3], l.d, sl);
    return 256 * sh + sl;
}

// The header of an x block.
struct XqHead {
    float scale, sum_lo, sum_hi;
    int qsum;
};
__device__ __forceinline__ XqHead xq_head(const u8* xb, bool al) {
    const Vec16 v = ld_quants16(xb + 64, al);
    XqHead hd;
    hd.scale = __int_as_float((int)v.a), hd.sum_lo = __int_as_float((int)v.b);
    hd.sum_hi = __int_as_float((int)v.c), hd.qsum = (int)v.d;
    return hd;
}

// Σ_j w_j · q_j over the 16 weights at offset `at` (0 or 16) of x block `xb`, the weights' four
// words of signed bytes w.
__device__ __forceinline__ int idot_run(const u32* w, const u8* xb, int at, bool al) {
    return idot16(w, ld_quants16(xb + at, al), ld_quants16(xb + 32 + at, al));
}

// The four words of a Vec16.
#define WORDS(v) {(v).a, (v).b, (v).c, (v).d}

// Q8_0 (repacked: 32 quant bytes per block, then the f16 scales): lane l takes blocks l + 32t,
// loading LOAD_GROUP / 2 blocks' quants before their dots.
__device__ __forceinline__ float lane_dot_q8_0(const u8* row, const u8* xq, int cols,
                                               int lane) {
    const int nb = cols / QK;
    const u8* hd = row + 32 * nb;
    const bool al = ((unsigned long long)row & 15) == 0;
    const bool xal = ((unsigned long long)xq & 15) == 0;
    float s = 0.0f;
    constexpr int G = LOAD_GROUP / 2;
    for (int b0 = lane; b0 < nb; b0 += G * WARP) {
        Vec16 lo[G] = {}, hi[G] = {};
        u16 d[G] = {};
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int b = b0 + g * WARP;
            if (b < nb) {
                lo[g] = ld_quants16(row + 32 * b, al);
                hi[g] = ld_quants16(row + 32 * b + 16, al);
                d[g] = ld_u16(hd + 2 * b);
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int b = b0 + g * WARP;
            if (b < nb) {
                const u8* xb = xq + XQ_BLOCK * b;
                const u32 w0[4] = WORDS(lo[g]), w1[4] = WORDS(hi[g]);
                const int t = idot_run(w0, xb, 0, xal) + idot_run(w1, xb, 16, xal);
                s += f16_to_f32(d[g]) * xq_head(xb, xal).scale * (float)t;
            }
        }
    }
    return s;
}

// The 4- and 5-bit formats (repacked: 16 quant bytes per block, then the headers of HB bytes:
// f16 d, for Q4_1/Q5_1 the f16 min, for Q5 the u32 of fifth bits at QH_AT): weight j of a block
// is the low nibble of byte j, weight j + 16 the high one, with bit j (j + 16) of qh as its
// fifth bit. The bias (−8, −16) enters as bias·Σq; the min as m·Σx.
#define LANE_DOT_NIBBLES(NAME, HB, HAS_MIN, QH_AT, BIAS, G)                                     \
    __device__ __forceinline__ float lane_dot_##NAME(const u8* row, const u8* xq, int cols,     \
                                                     int lane) {                                \
        const int nb = cols / QK;                                                               \
        const u8* hd = row + 16 * nb;                                                           \
        const bool al = ((unsigned long long)row & 15) == 0;                                    \
        const bool xal = ((unsigned long long)xq & 15) == 0;                                    \
        float s = 0.0f;                                                                         \
        for (int b0 = lane; b0 < nb; b0 += (G) * WARP) {                                        \
            Vec16 q[G] = {};                                                                    \
            u32 qh[G] = {};                                                                     \
            u16 d[G] = {}, m[G] = {};                                                           \
            _Pragma("unroll") for (int g = 0; g < (G); ++g) {                                   \
                const int b = b0 + g * WARP;                                                    \
                if (b < nb) {                                                                   \
                    const u8* h = hd + HB * b;                                                  \
                    q[g] = ld_quants16(row + 16 * b, al);                                       \
                    if (QH_AT >= 0) qh[g] = ld_u32_2(h + (QH_AT >= 0 ? QH_AT : 0));             \
                    d[g] = ld_u16(h);                                                           \
                    if (HAS_MIN) m[g] = ld_u16(h + 2);                                          \
                }                                                                               \
            }                                                                                   \
            _Pragma("unroll") for (int g = 0; g < (G); ++g) {                                   \
                const int b = b0 + g * WARP;                                                    \
                if (b < nb) {                                                                   \
                    const u8* xb = xq + XQ_BLOCK * b;                                           \
                    const u32 w[4] = WORDS(q[g]);                                               \
                    u32 lo[4], hi[4];                                                           \
                    _Pragma("unroll") for (int i = 0; i < 4; ++i) {                             \
                        lo[i] = w[i] & NIB;                                                     \
                        hi[i] = (w[i] >> 4) & NIB;                                              \
                        if (QH_AT >= 0) {                                                       \
                            lo[i] |= bit4_bytes((qh[g] >> (4 * i)) & 15u);                      \
                            hi[i] |= bit4_bytes((qh[g] >> (16 + 4 * i)) & 15u);                 \
                        }                                                                       \
                    }                                                                           \
                    const XqHead xh = xq_head(xb, xal);                                         \
                    const int t = idot_run(lo, xb, 0, xal) + idot_run(hi, xb, 16, xal) +        \
                                  (BIAS) * xh.qsum;                                             \
                    s += f16_to_f32(d[g]) * xh.scale * (float)t;                                \
                    if (HAS_MIN) s += f16_to_f32(m[g]) * (xh.sum_lo + xh.sum_hi);               \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        return s;                                                                               \
    }

// Loads in groups of LOAD_GROUP blocks; of 2 for Q5_0 and 1 for Q5_1 (their fifth bits and mins
// take registers too; the static check keeps every kernel free of spills).
LANE_DOT_NIBBLES(q4_0, 2, false, -1, -8, LOAD_GROUP)
LANE_DOT_NIBBLES(q4_1, 4, true, -1, 0, LOAD_GROUP)
LANE_DOT_NIBBLES(q5_0, 6, false, 2, -16, 2)
LANE_DOT_NIBBLES(q5_1, 8, true, 4, 0, 1)

// Q4_K / Q5_K: eight lanes per super-block (k4_unit, common.cuh), lane e = l % 8 with c = e / 2,
// l0 = 16 (e % 2): the weights l0..l0 + 16 of sub-blocks 2c (low nibbles) and 2c + 1 (high),
// i.e. of x blocks 8·sb + 2c and + 1 at offset l0; their mins meet the sums of those 16 x.
__device__ __forceinline__ float lane_dot_k4(const u8* row, const u8* xq, int cols, int lane,
                                             bool five) {
    const int qb = five ? 160 : 128;
    const int nb = cols / QK_K;
    const u8* hd0 = row + qb * nb;
    const bool al = ((unsigned long long)row & 15) == 0;
    const bool xal = ((unsigned long long)xq & 15) == 0;
    const int e = lane % 8, c = e / 2, l0 = 16 * (e % 2);
    float s = 0.0f;
#pragma unroll 4
    for (int b = lane / 8; b < nb; b += WARP / 8) {
        const K4Unit k = k4_unit(row + qb * b, hd0 + 16 * b, c, l0, al, five);
        u32 q0[4], q1[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q0[i] = (k.w[i] & NIB) | (((k.hw[i] >> (2 * c)) & 0x01010101u) << 4);
            q1[i] = ((k.w[i] >> 4) & NIB) | (((k.hw[i] >> (2 * c + 1)) & 0x01010101u) << 4);
        }
        const u8* xb0 = xq + XQ_BLOCK * (8 * b + 2 * c);
        const u8* xb1 = xb0 + XQ_BLOCK;
        const XqHead h0 = xq_head(xb0, xal), h1 = xq_head(xb1, xal);
        const float t0 = h0.scale * (float)idot_run(q0, xb0, l0, xal);
        const float t1 = h1.scale * (float)idot_run(q1, xb1, l0, xal);
        const float x0 = l0 ? h0.sum_hi : h0.sum_lo, x1 = l0 ? h1.sum_hi : h1.sum_lo;
        s += k.d0 * t0 - k.m0 * x0;
        s += k.d1 * t1 - k.m1 * x1;
    }
    return s;
}
__device__ __forceinline__ float lane_dot_q4_k(const u8* row, const u8* xq, int cols,
                                               int lane) {
    return lane_dot_k4(row, xq, cols, lane, false);
}
__device__ __forceinline__ float lane_dot_q5_k(const u8* row, const u8* xq, int cols,
                                               int lane) {
    return lane_dot_k4(row, xq, cols, lane, true);
}

// Q6_K: lane e = l % 8 (n = e / 4, a = (e / 2) % 2, l0 = 16 (e % 2)) reads ql[64n + 32a + l0
// .. + 16] and qh[32n + l0 .. + 16]: weights 128n + 32a + l0 + j (low nibbles, top bits at 2a)
// of x block 8·sb + 4n + a, and 64 further (high nibbles, top bits at 2a + 4) of block + 2,
// each q − 32 as a signed byte.
__device__ __forceinline__ float lane_dot_q6_k(const u8* row, const u8* xq, int cols,
                                               int lane) {
    const int nb = cols / QK_K;
    const u8* hd0 = row + 192 * nb;
    const bool al = ((unsigned long long)row & 15) == 0;
    const bool xal = ((unsigned long long)xq & 15) == 0;
    const int e = lane % 8, n = e / 4, a = (e / 2) % 2, l0 = 16 * (e % 2);
    float s = 0.0f;
#pragma unroll 2
    for (int b = lane / 8; b < nb; b += WARP / 8) {
        const u8* q = row + 192 * b;
        const u8* hd = hd0 + 18 * b;
        const Vec16 lv = ld_quants16(q + 64 * n + 32 * a + l0, al);
        const Vec16 hv = ld_quants16(q + 128 + 32 * n + l0, al);
        const u32 lw[4] = WORDS(lv), hw[4] = WORDS(hv);
        u32 q0[4], q1[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            q0[i] = minus32_bytes((lw[i] & NIB) | (((hw[i] >> (2 * a)) & 0x03030303u) << 4));
            q1[i] = minus32_bytes(((lw[i] >> 4) & NIB) |
                                  (((hw[i] >> (2 * a + 4)) & 0x03030303u) << 4));
        }
        const float d = f16_to_f32(ld_u16(hd + 16));
        const float sc0 = (float)(i8)hd[8 * n + 2 * a + l0 / 16];
        const float sc1 = (float)(i8)hd[8 * n + 2 * (a + 2) + l0 / 16];
        const u8* xb0 = xq + XQ_BLOCK * (8 * b + 4 * n + a);
        const u8* xb1 = xb0 + 2 * XQ_BLOCK;
        const float t0 = xq_head(xb0, xal).scale * (float)idot_run(q0, xb0, l0, xal);
        const float t1 = xq_head(xb1, xal).scale * (float)idot_run(q1, xb1, l0, xal);
        s += d * (sc0 * t0 + sc1 * t1);
    }
    return s;
}
