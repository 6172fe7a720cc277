// Shared helpers prepended to every kernel source (NVRTC compiles one string per module, with
// no include paths and no CUDA headers): fixed-width types, f16/bf16 decoding without
// cuda_fp16.h, the GGUF block layouts, warp reductions and the FFN activations.
//
// Block layouts (bit for bit the ggml ones, see powerinfer_core::dtype):
//   Q8_0: 34 bytes = f16 d, 32 x i8 q;                 w = d * q
//   Q4_0: 18 bytes = f16 d, 16 bytes (q[j] low nibble of byte j, q[j+16] high); w = d * (q - 8)
//   Q4_1: 20 bytes = f16 d, f16 m, 16 bytes as Q4_0;   w = d * q + m
//   Q5_0: 22 bytes = f16 d, u32 qh (bit j = bit 4 of q[j]), 16 bytes of nibbles as Q4_0;
//         w = d * (q - 16)
//   Q5_1: 24 bytes = f16 d, f16 m, u32 qh, 16 bytes of nibbles;  w = d * q + m
// The K-quants (256-weight super-blocks, see powerinfer_core::dtype and core/src/dequantize.rs,
// whose order of float operations the decoders below keep: a sub-block's d*scale and dmin*min
// first, then w = (d*scale) * q - dmin*min):
//   Q4_K: 144 bytes = f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes qs. Weight
//         i = 64c + 32h + l is nibble h of qs[32c + l], sub-block s = 2c + h.
//   Q5_K: 176 bytes = as Q4_K with 32 bytes qh after the scales (bit s of qh[l] is bit 4 of q
//         for weight 32s + l), qs at 48.
//   Q6_K: 210 bytes = 128 bytes ql, 64 bytes qh, 16 x i8 scales, f16 d. Weight
//         i = 128n + 32k + l: low 4 bits from ql[64n + 32(k % 2) + l] (low nibble for k < 2,
//         high for k >= 2), high 2 bits (qh[32n + l] >> 2k) & 3; w = d * scales[i / 16] * (q - 32).
// Every field lies at an even offset of its block and every block size is even, so rows need
// only the 2-byte alignment layout.rs checks (f16 fields through ld_u16, the rest bytewise).
//
// On the device the 32-weight formats are REPACKED (crates/cuda/src/repack.rs): a row of nb
// blocks holds first the nb blocks' quants (QB = 16 bytes each, 32 for Q8_0: the bytes after
// the header above), then the nb headers (HB = 2 bytes for Q8_0/Q4_0: d; 4 for Q4_1: d, m; 6
// for Q5_0: d, qh; 8 for Q5_1: d, m, qh), in block order. Block b's quants start at QB * b and
// its header at QB * nb + HB * b, so a row that starts 16-byte aligned is read one 16-byte
// load per block. The K-quants keep GGUF's layout.

// Built for the GPU by NVRTC, or for the CPU after emu/cuda_emu.h (gpu-emu), which defines the
// three macros below its own way; everything else of these sources means the same in both.
#ifndef EMU_ENTRY
#define SHARED_ARRAY(T, name, dims) __shared__ T name dims
#define DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define EMU_ENTRY(kernel)
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;
typedef long long i64;

#define WARP 32
// Threads per block of every kernel but attention_decode (launch_spec.rs ROW_THREADS,
// ELEM_THREADS, NORM_THREADS): each kernel declares its block size with __launch_bounds__, so
// ptxas keeps its registers within what that many threads may hold.
#define BLOCK_THREADS 256
// An entry point launched with `threads` threads per block, and one launched with
// BLOCK_THREADS.
#define KERNEL_N(threads) extern "C" __global__ void __launch_bounds__(threads)
#define KERNEL KERNEL_N(BLOCK_THREADS)
#define QK 32
#define QK_K 256
#define NEG_INF __int_as_float(0xff800000)

// f16 bits -> f32 (the cvt instruction exists on every architecture NVRTC targets).
__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
#else
    return emu::f16_to_f32(h);
#endif
}

// f32 -> f16 bits, round to nearest even.
__device__ __forceinline__ u16 f32_to_f16(float f) {
#ifdef __CUDA_ARCH__
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
#else
    return emu::f32_to_f16(f);
#endif
}

// bf16 bits -> f32: the upper half of an f32.
__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __int_as_float(((u32)b) << 16);
}

// Little-endian u16 at a 2-aligned byte address.
__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return *(const u16*)p;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// x quantized for the integer dots (sparse_matvec.cuh says how they read it): blocks of 32
// values, XQ_BLOCK bytes each: h[32] and l[32], the signed bytes of the int16
// q = round(x · XQ_MAX / max|x|) (ties to even; h = (q + 128) >> 8, l = q − 256·h), then the f32
// scale max|x| / XQ_MAX, the f32 sums of x[0..16] and x[16..32], and the i32 Σq. A block with a
// NaN or an infinity (or halves whose sum overflows) gets NaN header floats and zero quants; one
// whose max|x| is below ~1e-34 (XQ_MAX / max|x| not finite) gets zero quants.
#define XQ_BLOCK 80
// Largest |q|: 127·256 + 127, so that q splits into two signed bytes (h = (q + 128) >> 8).
#define XQ_MAX 32639.0f

// One block of quantized x written by a whole warp, lane j holding value j of the block:
// `quantize_x` (sparse_matvec.cu), and the norms (norm_rope.cu) for the values they store, so
// that both write the same bytes for the same floats. Every lane of the warp must call it.
__device__ __forceinline__ void quantize_block_warp(float v, u8* xb) {
    const int lane = threadIdx.x % WARP;
    const float amax = warp_max(fabsf(v));
    float half = v;  // summed over each half-warp
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) half += __shfl_xor_sync(0xffffffffu, half, o);
    const float other = __shfl_xor_sync(0xffffffffu, half, 16);
    const float lo = lane < 16 ? half : other, hi = lane < 16 ? other : half;
    const bool finite = isfinite(amax) && isfinite(lo + hi);
    float inv = amax > 0.0f ? XQ_MAX / amax : 0.0f;
    if (!isfinite(inv)) inv = 0.0f;  // max|x| below ~1e-34
    const int q = finite ? __float2int_rn(v * inv) : 0;
    const int h = (q + 128) >> 8;
    xb[lane] = (u8)h;
    xb[32 + lane] = (u8)(q - 256 * h);
    const float qsum = warp_sum((float)q);  // |Σq| <= 32 · 32639 < 2^24: exact
    if (lane == 0) {
        const float nan = __int_as_float(0x7fc00000);
        float* hd = (float*)(xb + 64);
        hd[0] = finite ? amax / XQ_MAX : nan;
        hd[1] = finite ? lo : nan;
        hd[2] = finite ? hi : nan;
        ((int*)hd)[3] = (int)qsum;
    }
}

// Activation codes shared with the Rust side (powerinfer_cuda::Act).
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_SILU 2
#define ACT_GELU 3
#define ACT_GELU_ERF 4

__device__ __forceinline__ float apply_act(int act, float x) {
    switch (act) {
    case ACT_RELU: return fmaxf(x, 0.0f);
    case ACT_SILU: return x / (1.0f + expf(-x));
    case ACT_GELU: {
        const float c = 0.7978845608f;  // sqrt(2/pi), tanh approximation as the CPU side
        return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    case ACT_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    default: return x;
    }
}

// Where row r of a matrix lives: rows come in groups of `group_rows` (a slab of hot neurons),
// group g starting at g * group_stride bytes; inside a group, this matrix's rows start at
// `offset` and are `row_bytes` apart. A plain row-major matrix is one group (group_rows >= rows,
// group_stride 0, offset 0). The group is found without a division: r / group_rows is
// umulhi(r, div_mul) >> div_shr, the two computed on the host (layout.rs `fast_div`).
struct RowLayout {
    i64 group_stride;
    i64 offset;
    int group_rows;
    int row_bytes;
    u32 div_mul;
    u32 div_shr;
};

__device__ __forceinline__ int group_of(RowLayout l, int r) {
    return l.group_rows == 1 ? r : (int)(__umulhi((u32)r, l.div_mul) >> l.div_shr);
}

__device__ __forceinline__ const u8* row_ptr(const u8* base, RowLayout l, int r) {
    const int g = group_of(l, r);
    const int i = r - g * l.group_rows;
    return base + (i64)g * l.group_stride + l.offset + (i64)i * l.row_bytes;
}

// The neuron id of hot slot r: its i32 row in the slabs' id rows (padding slots of a partial
// slab hold -1).
__device__ __forceinline__ int slot_id(const u8* ids_base, RowLayout ids_l, int r) {
    return *(const int*)row_ptr(ids_base, ids_l, r);
}

// Weight j (0..cols) of one row of `cols` weights, decoded on its own (used where threads own
// columns). The 32-weight formats read the repacked row: quants at QB * b, header at
// QB * nb + HB * b for block b = j / 32.
__device__ __forceinline__ float w_f32(const u8* row, int j, int) { return ((const float*)row)[j]; }
__device__ __forceinline__ float w_f16(const u8* row, int j, int) {
    return f16_to_f32(ld_u16(row + 2 * j));
}
__device__ __forceinline__ float w_bf16(const u8* row, int j, int) {
    return bf16_to_f32(ld_u16(row + 2 * j));
}
__device__ __forceinline__ float w_q8_0(const u8* row, int j, int cols) {
    const u8* hd = row + 32 * (cols / QK) + 2 * (j / QK);
    return f16_to_f32(ld_u16(hd)) * (float)(i8)row[j];
}
// Nibble k (0..32) of a 4-bit block's 16 quant bytes q.
__device__ __forceinline__ int nibble(const u8* q, int k) {
    return k < 16 ? (q[k] & 15) : (q[k - 16] >> 4);
}
__device__ __forceinline__ float w_q4_0(const u8* row, int j, int cols) {
    const int b = j / QK;
    const u8* hd = row + 16 * (cols / QK) + 2 * b;
    return f16_to_f32(ld_u16(hd)) * (float)(nibble(row + 16 * b, j % QK) - 8);
}
__device__ __forceinline__ float w_q4_1(const u8* row, int j, int cols) {
    const int b = j / QK;
    const u8* hd = row + 16 * (cols / QK) + 4 * b;
    const float d = f16_to_f32(ld_u16(hd)), m = f16_to_f32(ld_u16(hd + 2));
    return d * (float)nibble(row + 16 * b, j % QK) + m;
}

// The u32 qh of a Q5 block at a 2-aligned address (two u16 loads).
__device__ __forceinline__ u32 ld_u32_2(const u8* p) {
    return (u32)ld_u16(p) | ((u32)ld_u16(p + 2) << 16);
}
__device__ __forceinline__ float w_q5_0(const u8* row, int j, int cols) {
    const int b = j / QK, k = j % QK;
    const u8* hd = row + 16 * (cols / QK) + 6 * b;
    const int q = nibble(row + 16 * b, k) | (int)(((ld_u32_2(hd + 2) >> k) & 1) << 4);
    return f16_to_f32(ld_u16(hd)) * (float)(q - 16);
}
__device__ __forceinline__ float w_q5_1(const u8* row, int j, int cols) {
    const int b = j / QK, k = j % QK;
    const u8* hd = row + 16 * (cols / QK) + 8 * b;
    const int q = nibble(row + 16 * b, k) | (int)(((ld_u32_2(hd + 4) >> k) & 1) << 4);
    return f16_to_f32(ld_u16(hd)) * (float)q + f16_to_f32(ld_u16(hd + 2));
}

// Scale and min of sub-block s (0..8) of a Q4_K/Q5_K block's 12 packed bytes `sm`
// (powerinfer_core::dequantize::k4_scale_min).
__device__ __forceinline__ void k4_scale_min(int s, const u8* sm, int* sc, int* mn) {
    if (s < 4) {
        *sc = sm[s] & 63;
        *mn = sm[s + 4] & 63;
    } else {
        *sc = (sm[s + 4] & 15) | ((sm[s - 4] >> 6) << 4);
        *mn = (sm[s + 4] >> 4) | ((sm[s] >> 6) << 4);
    }
}

// Weight i (0..256) of a repacked Q4_K (five = false) or Q5_K (five = true) super-block: its
// quants q (Q5_K: qh[32] then qs[128]; Q4_K: qs[128]) and its header hd (f16 d, f16 dmin, 12
// bytes of packed scales and mins).
__device__ __forceinline__ float w_k4(const u8* q, const u8* hd, int i, bool five) {
    const int c = i / 64, h = (i / 32) % 2, l = i % 32, s = i / 32;
    const u8 byte = q[(five ? 32 : 0) + 32 * c + l];
    int qv = h ? (byte >> 4) : (byte & 15);
    if (five) qv |= ((q[l] >> s) & 1) << 4;
    int sc, mn;
    k4_scale_min(s, hd + 4, &sc, &mn);
    const float d = f16_to_f32(ld_u16(hd)) * (float)sc;
    const float m = f16_to_f32(ld_u16(hd + 2)) * (float)mn;
    return d * (float)qv - m;
}
// The repacked K-quant rows: super-block b's quants at QB * b (QB = 128, 160, 192), its header
// at QB * nb + HB * b (HB = 16, 16, 18).
__device__ __forceinline__ float w_q4_k(const u8* row, int j, int cols) {
    const int b = j / QK_K;
    return w_k4(row + 128 * b, row + 128 * (cols / QK_K) + 16 * b, j % QK_K, false);
}
__device__ __forceinline__ float w_q5_k(const u8* row, int j, int cols) {
    const int b = j / QK_K;
    return w_k4(row + 160 * b, row + 160 * (cols / QK_K) + 16 * b, j % QK_K, true);
}
// Q6_K: quants ql[128] then qh[64]; header 16 i8 scales then f16 d.
__device__ __forceinline__ float w_q6_k(const u8* row, int j, int cols) {
    const int b = j / QK_K, i = j % QK_K;
    const u8* q = row + 192 * b;
    const u8* hd = row + 192 * (cols / QK_K) + 18 * b;
    const int n = i / 128, k = (i % 128) / 32, l = i % 32;
    const u8 lo = q[64 * n + 32 * (k % 2) + l];
    const int qv = (k < 2 ? (lo & 15) : (lo >> 4)) | (((q[128 + 32 * n + l] >> (2 * k)) & 3) << 4);
    const float d = f16_to_f32(ld_u16(hd + 16)) * (float)(i8)hd[i / 16];
    return d * (float)(qv - 32);
}

// lane_dot_<fmt>(row, x, cols, lane): one lane's share of dot(row, x) for a row of `cols`
// weights, summed over the warp by the caller. The float formats take x as floats (below), the
// quantized ones as int16 blocks (sparse_matvec.cuh).

// 16 bytes of a row, loaded at once (one LDG.E.128) when 16-byte aligned (named fields: an
// array member is loaded a word at a time).
struct alignas(16) Vec16 {
    u32 a, b, c, d;
};

// The dot of the 16 bytes `v` of a float row (4 f32, or 8 f16 / bf16 as 2 per u32, the low
// half first) with the matching x values.
__device__ __forceinline__ float dot16_f32(const Vec16 v16, const float* x) {
    const u32 w[4] = {v16.a, v16.b, v16.c, v16.d};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) s += __int_as_float((int)w[k]) * x[k];
    return s;
}
__device__ __forceinline__ float dot16_f16(const Vec16 v16, const float* x) {
    const u32 w[4] = {v16.a, v16.b, v16.c, v16.d};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        s += f16_to_f32((u16)(w[k] & 0xffff)) * x[2 * k];
        s += f16_to_f32((u16)(w[k] >> 16)) * x[2 * k + 1];
    }
    return s;
}
__device__ __forceinline__ float dot16_bf16(const Vec16 v16, const float* x) {
    const u32 w[4] = {v16.a, v16.b, v16.c, v16.d};
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        s += __int_as_float((int)(w[k] << 16)) * x[2 * k];
        s += __int_as_float((int)(w[k] & 0xffff0000u)) * x[2 * k + 1];
    }
    return s;
}

// The lane_dot_* functions load in groups: a lane issues the loads of LOAD_GROUP (fewer for
// the 5-bit and 8-bit formats) consecutive units of its share first, then computes them, in the
// same order as one unit at a time (the same bits). On an H200 the one-at-a-time loop left a
// warp with one 16-byte load per lane in flight, and a 4096 x 4096 Q4_0 product at 477 GB/s;
// `#pragma unroll` alone did not move the loads ahead of the arithmetic (the static check's
// cubins, read with nvdisasm).
#define LOAD_GROUP 4

// One lane's share of dot(row, x) for a float row (f32, f16, bf16) of `cols` weights: a row
// starting 16-byte aligned is read 16 bytes per lane and load (lane l takes bytes 16 (l + 32 t)
// .. +16: the warp reads 512 consecutive bytes at once), its tail of fewer than 16 bytes and
// an unaligned row (an odd-width slab) one weight per lane. The caller sums over the warp.
#define LANE_DOT_FLOAT(NAME, BYTES)                                                             \
    __device__ __forceinline__ float lane_dot_##NAME(const u8* row, const float* x, int cols,   \
                                                     int lane) {                                \
        constexpr int PER = 16 / BYTES; /* weights per 16 bytes */                              \
        float s = 0.0f;                                                                         \
        int j0 = 0;                                                                             \
        if (((unsigned long long)row & 15) == 0) {                                              \
            const int n16 = cols / PER;                                                         \
            const Vec16* v = (const Vec16*)row;                                                 \
            for (int b0 = lane; b0 < n16; b0 += LOAD_GROUP * WARP) {                            \
                Vec16 wv[LOAD_GROUP] = {};                                                      \
                _Pragma("unroll") for (int g = 0; g < LOAD_GROUP; ++g) {                        \
                    const int b = b0 + g * WARP;                                                \
                    if (b < n16) wv[g] = v[b];                                                  \
                }                                                                               \
                _Pragma("unroll") for (int g = 0; g < LOAD_GROUP; ++g) {                        \
                    const int b = b0 + g * WARP;                                                \
                    if (b < n16) s += dot16_##NAME(wv[g], x + PER * b);                         \
                }                                                                               \
            }                                                                                   \
            j0 = n16 * PER;                                                                     \
        }                                                                                       \
        for (int j = j0 + lane; j < cols; j += WARP) s += w_##NAME(row, j, cols) * x[j];        \
        return s;                                                                               \
    }

LANE_DOT_FLOAT(f32, 4)
LANE_DOT_FLOAT(f16, 2)
LANE_DOT_FLOAT(bf16, 2)
// The quantized formats' dots read x quantized to int16 blocks (sparse_matvec.cuh); their
// rows are repacked: quants first, 16 bytes per 32-weight block (32 for Q8_0), then the headers,
// so that a row starting 16-byte aligned is read with one 16-byte load per block and lane.

// The 16 bytes at q (2-aligned), as one 16-byte load when `aligned`, else eight u16 loads.
__device__ __forceinline__ Vec16 ld_quants16(const u8* q, bool aligned) {
    if (aligned) return *(const Vec16*)q;
    Vec16 v;
    v.a = (u32)ld_u16(q) | ((u32)ld_u16(q + 2) << 16);
    v.b = (u32)ld_u16(q + 4) | ((u32)ld_u16(q + 6) << 16);
    v.c = (u32)ld_u16(q + 8) | ((u32)ld_u16(q + 10) << 16);
    v.d = (u32)ld_u16(q + 12) | ((u32)ld_u16(q + 14) << 16);
    return v;
}

// The K-quants, repacked: eight lanes per super-block, four super-blocks per step of the warp
// (lane l takes super-blocks l / 8 + 4t), each lane reading 16 bytes of quants with one load
// when the row starts 16-byte aligned (the warp reads its four super-blocks' quants at once).
//
// Q4_K / Q5_K: lane e = l % 8 reads qs[32c + l0 .. + 16] (c = e / 2, l0 = 16 (e % 2)): the
// weights 64c + l0 + j (low nibbles, sub-block 2c) and 64c + 32 + l0 + j (high, 2c + 1), and
// for Q5_K qh[l0 .. + 16] (bits 2c and 2c + 1: their fifth bits).
// One Q4_K/Q5_K unit: lane e (c = e / 2, l0 = 16 (e % 2)) of the super-block whose quants start
// at q and header at hd: its 16 quant bytes, for Q5_K its 16 fifth-bit bytes (else 0), and the
// scale d·sc and min dmin·mn of its two sub-blocks 2c and 2c + 1. lane_dot_k4 and tile_k4
// read a unit the same way.
struct K4Unit {
    u32 w[4], hw[4];
    float d0, m0, d1, m1;
};
__device__ __forceinline__ K4Unit k4_unit(const u8* q, const u8* hd, int c, int l0, bool al,
                                          bool five) {
    K4Unit k;
    const Vec16 v = ld_quants16(q + (five ? 32 : 0) + 32 * c + l0, al);
    const Vec16 hv = five ? ld_quants16(q + l0, al) : Vec16{0u, 0u, 0u, 0u};
    k.w[0] = v.a, k.w[1] = v.b, k.w[2] = v.c, k.w[3] = v.d;
    k.hw[0] = hv.a, k.hw[1] = hv.b, k.hw[2] = hv.c, k.hw[3] = hv.d;
    int sc0, mn0, sc1, mn1;
    k4_scale_min(2 * c, hd + 4, &sc0, &mn0);
    k4_scale_min(2 * c + 1, hd + 4, &sc1, &mn1);
    const float d = f16_to_f32(ld_u16(hd)), dmin = f16_to_f32(ld_u16(hd + 2));
    k.d0 = d * (float)sc0, k.m0 = dmin * (float)mn0;
    k.d1 = d * (float)sc1, k.m1 = dmin * (float)mn1;
    return k;
}

// ---- Tiles: row sums over the columns of transposed matrices (axpy_down.cu, predictor.cu) ----
//
// A thread owns a unit of ROW_TILE consecutive columns of a row-major matrix whose rows are
// scaled and summed (y[c] += sum_k a[k] * W[k][c]): one 32-weight block of the repacked
// quantized formats, 16 bytes of an f16/bf16/f32 row, 16 bytes of a K-quant super-block's
// quants (32 weights in two runs of 16 columns). tile_<fmt>(row, u, cols, al, ak, acc) adds
// ak * row[TILE_COL_<fmt>(u, i)] to acc[i], reading the unit with 16-byte loads when the row
// starts 16-byte aligned (`al`).

// Values per thread (launch_spec.rs `row_tile`).
#define ROW_TILE_f32 4
#define ROW_TILE_f16 8
#define ROW_TILE_bf16 8
#define ROW_TILE_q8_0 32
#define ROW_TILE_q4_0 32
#define ROW_TILE_q4_1 32
#define ROW_TILE_q5_0 32
#define ROW_TILE_q5_1 32
#define ROW_TILE_q4_k 32
#define ROW_TILE_q5_k 32
#define ROW_TILE_q6_k 32

// The column of a tile's value i (0..ROW_TILE) in unit u: TILE * u + i for every format but the
// K-quants, whose units are the lanes of lane_dot_k4 / lane_dot_q6_k (eight per super-block,
// each two runs of 16 columns: 32 apart for Q4_K/Q5_K, 64 for Q6_K).
__device__ __forceinline__ int tile_col(int tile, int u, int i) { return tile * u + i; }
__device__ __forceinline__ int tile_col_k4(int u, int i) {
    const int e = u % 8, c = e / 2, l0 = 16 * (e % 2);
    return QK_K * (u / 8) + 64 * c + l0 + (i < 16 ? i : 16 + i);
}
__device__ __forceinline__ int tile_col_k6(int u, int i) {
    const int e = u % 8, n = e / 4, a = (e / 2) % 2, l0 = 16 * (e % 2);
    return QK_K * (u / 8) + 128 * n + 32 * a + l0 + (i < 16 ? i : 48 + i);
}
#define TILE_COL_f32(u, i) tile_col(4, u, i)
#define TILE_COL_f16(u, i) tile_col(8, u, i)
#define TILE_COL_bf16(u, i) tile_col(8, u, i)
#define TILE_COL_q8_0(u, i) tile_col(32, u, i)
#define TILE_COL_q4_0(u, i) tile_col(32, u, i)
#define TILE_COL_q4_1(u, i) tile_col(32, u, i)
#define TILE_COL_q5_0(u, i) tile_col(32, u, i)
#define TILE_COL_q5_1(u, i) tile_col(32, u, i)
#define TILE_COL_q4_k(u, i) tile_col_k4(u, i)
#define TILE_COL_q5_k(u, i) tile_col_k4(u, i)
#define TILE_COL_q6_k(u, i) tile_col_k6(u, i)

// The two 16-bit floats of a u32 (the low half first), for the f16/bf16 tiles.
__device__ __forceinline__ float lo_f16(u32 v) { return f16_to_f32((u16)(v & 0xffffu)); }
__device__ __forceinline__ float hi_f16(u32 v) { return f16_to_f32((u16)(v >> 16)); }
__device__ __forceinline__ float lo_bf16(u32 v) { return __int_as_float((int)(v << 16)); }
__device__ __forceinline__ float hi_bf16(u32 v) { return __int_as_float((int)(v & 0xffff0000u)); }

// acc[i] += ak * weight (TILE * u + i) of a float row's unit u: one 16-byte load when the row is
// 16-byte aligned and the unit whole, else weight by weight (none past cols).
__device__ __forceinline__ void tile_f32(const u8* row, int u, int cols, bool al, float ak,
                                         float* acc) {
    if (al && 4 * (u + 1) <= cols) {
        const Vec16 v = ((const Vec16*)row)[u];
        acc[0] += ak * __int_as_float((int)v.a);
        acc[1] += ak * __int_as_float((int)v.b);
        acc[2] += ak * __int_as_float((int)v.c);
        acc[3] += ak * __int_as_float((int)v.d);
        return;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (4 * u + i < cols) acc[i] += ak * w_f32(row, 4 * u + i, cols);
    }
}

#define TILE_HALF(NAME)                                                                         \
    __device__ __forceinline__ void tile_##NAME(const u8* row, int u, int cols, bool al,        \
                                                float ak, float* acc) {                         \
        if (al && 8 * (u + 1) <= cols) {                                                        \
            const Vec16 v = ((const Vec16*)row)[u];                                             \
            acc[0] += ak * lo_##NAME(v.a);                                                      \
            acc[1] += ak * hi_##NAME(v.a);                                                      \
            acc[2] += ak * lo_##NAME(v.b);                                                      \
            acc[3] += ak * hi_##NAME(v.b);                                                      \
            acc[4] += ak * lo_##NAME(v.c);                                                      \
            acc[5] += ak * hi_##NAME(v.c);                                                      \
            acc[6] += ak * lo_##NAME(v.d);                                                      \
            acc[7] += ak * hi_##NAME(v.d);                                                      \
            return;                                                                             \
        }                                                                                       \
        _Pragma("unroll") for (int i = 0; i < 8; ++i) {                                         \
            if (8 * u + i < cols) acc[i] += ak * w_##NAME(row, 8 * u + i, cols);                \
        }                                                                                       \
    }

TILE_HALF(f16)
TILE_HALF(bf16)

// The repacked 32-weight formats: block u's quants (QB bytes at QB * u) and header (at
// QB * nb + HB * u).
__device__ __forceinline__ void tile_q8_0(const u8* row, int u, int cols, bool al, float ak,
                                          float* acc) {
    const float d = ak * f16_to_f32(ld_u16(row + 32 * (cols / QK) + 2 * u));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const Vec16 v = ld_quants16(row + 32 * u + 16 * h, al);
        const u32 w4[4] = {v.a, v.b, v.c, v.d};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            acc[16 * h + i] += d * (float)(i8)((w4[i / 4] >> (8 * (i % 4))) & 255u);
        }
    }
}

#define TILE_NIBBLES(NAME, HB, HAS_MIN, QH_AT, BIAS)                                            \
    __device__ __forceinline__ void tile_##NAME(const u8* row, int u, int cols, bool al,        \
                                                float ak, float* acc) {                         \
        const u8* h = row + 16 * (cols / QK) + HB * u;                                          \
        const float d = ak * f16_to_f32(ld_u16(h));                                             \
        const float m = HAS_MIN ? ak * f16_to_f32(ld_u16(h + 2)) : 0.0f;                        \
        const u32 qh = QH_AT >= 0 ? ld_u32_2(h + (QH_AT >= 0 ? QH_AT : 0)) : 0u;                \
        const Vec16 v = ld_quants16(row + 16 * u, al);                                          \
        const u32 w4[4] = {v.a, v.b, v.c, v.d};                                                 \
        _Pragma("unroll") for (int j = 0; j < 16; ++j) {                                        \
            const int byte = (int)((w4[j / 4] >> (8 * (j % 4))) & 255u);                        \
            const int q0 = (byte & 15) | (int)(((qh >> j) & 1u) << 4);                          \
            const int q1 = (byte >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);                   \
            acc[j] += d * (float)(q0 + BIAS) + m;                                               \
            acc[j + 16] += d * (float)(q1 + BIAS) + m;                                          \
        }                                                                                       \
    }

TILE_NIBBLES(q4_0, 2, false, -1, -8)
TILE_NIBBLES(q4_1, 4, true, -1, 0)
TILE_NIBBLES(q5_0, 6, false, 2, -16)
TILE_NIBBLES(q5_1, 8, true, 4, 0)

// The K-quants' tiles: unit u = lane e = u % 8 of super-block u / 8, as lane_dot_k4 and
// lane_dot_q6_k read it (values 0..16 the first run of columns, 16..32 the second).
__device__ __forceinline__ void tile_k4(const u8* row, int u, int cols, bool al, float ak,
                                        float* acc, bool five) {
    const int qb = five ? 160 : 128;
    const int sb = u / 8, e = u % 8, c = e / 2, l0 = 16 * (e % 2);
    const K4Unit k = k4_unit(row + qb * sb, row + qb * (cols / QK_K) + 16 * sb, c, l0, al, five);
    const u32* w = k.w;
    const u32* hw = k.hw;
    const float d0 = ak * k.d0, m0 = ak * k.m0;
    const float d1 = ak * k.d1, m1 = ak * k.m1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int byte = (int)((w[j / 4] >> (8 * (j % 4))) & 255u);
        const int hb = (int)((hw[j / 4] >> (8 * (j % 4))) & 255u);
        acc[j] += d0 * (float)((byte & 15) | (((hb >> (2 * c)) & 1) << 4)) - m0;
        acc[16 + j] += d1 * (float)((byte >> 4) | (((hb >> (2 * c + 1)) & 1) << 4)) - m1;
    }
}
__device__ __forceinline__ void tile_q4_k(const u8* row, int u, int cols, bool al, float ak,
                                          float* acc) {
    tile_k4(row, u, cols, al, ak, acc, false);
}
__device__ __forceinline__ void tile_q5_k(const u8* row, int u, int cols, bool al, float ak,
                                          float* acc) {
    tile_k4(row, u, cols, al, ak, acc, true);
}
__device__ __forceinline__ void tile_q6_k(const u8* row, int u, int cols, bool al, float ak,
                                          float* acc) {
    const int sb = u / 8, e = u % 8, n = e / 4, a = (e / 2) % 2, l0 = 16 * (e % 2);
    const u8* q = row + 192 * sb;
    const u8* hd = row + 192 * (cols / QK_K) + 18 * sb;
    const Vec16 lv = ld_quants16(q + 64 * n + 32 * a + l0, al);
    const Vec16 hv = ld_quants16(q + 128 + 32 * n + l0, al);
    const u32 lw[4] = {lv.a, lv.b, lv.c, lv.d}, hw[4] = {hv.a, hv.b, hv.c, hv.d};
    const float d = ak * f16_to_f32(ld_u16(hd + 16));
    const float d0 = d * (float)(i8)hd[8 * n + 2 * a + l0 / 16];
    const float d1 = d * (float)(i8)hd[8 * n + 2 * (a + 2) + l0 / 16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const int lo = (int)((lw[j / 4] >> (8 * (j % 4))) & 255u);
        const int hi = (int)((hw[j / 4] >> (8 * (j % 4))) & 255u);
        acc[j] += d0 * (float)(((lo & 15) | (((hi >> (2 * a)) & 3) << 4)) - 32);
        acc[16 + j] += d1 * (float)(((lo >> 4) | (((hi >> (2 * a + 4)) & 3) << 4)) - 32);
    }
}

// The block's row lanes' tiles summed in lane order through shared memory `red` (256 * TILE
// floats, laid out [tile column][lane][unit] so that a warp's accesses hit consecutive words):
// afterwards the threads of lane 0 hold the totals in acc and true is returned; the other lanes'
// threads get false (and must do nothing more). Every thread of the block must call it.
template <int TILE>
__device__ __forceinline__ bool sum_row_lanes(float* red, float* acc, int lanes, int lane,
                                              int units_pb, int ul) {
    if (lanes == 1) return true;
#pragma unroll
    for (int i = 0; i < TILE; ++i) red[(i * lanes + lane) * units_pb + ul] = acc[i];
    __syncthreads();
    if (lane != 0) return false;
#pragma unroll
    for (int i = 0; i < TILE; ++i) {
        float s = 0.0f;
        for (int r = 0; r < lanes; ++r) s += red[(i * lanes + r) * units_pb + ul];
        acc[i] = s;
    }
    return true;
}
