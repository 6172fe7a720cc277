// Shared helpers prepended to every kernel source (NVRTC compiles one string per module, with
// no include paths and no CUDA headers): fixed-width types, f16/bf16 decoding without
// cuda_fp16.h, the GGUF block layouts, warp reductions and the FFN activations.
//
// Block layouts (bit for bit the ggml ones, see powerinfer_core::dtype):
//   Q8_0: 34 bytes = f16 d, 32 x i8 q;                 w = d * q
//   Q4_0: 18 bytes = f16 d, 16 bytes (q[j] low nibble of byte j, q[j+16] high); w = d * (q - 8)
//   Q4_1: 20 bytes = f16 d, f16 m, 16 bytes as Q4_0;   w = d * q + m

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;
typedef long long i64;

#define WARP 32
#define QK 32
#define NEG_INF __int_as_float(0xff800000)

// f16 bits -> f32 (the cvt instruction exists on every architecture NVRTC targets).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

// f32 -> f16 bits, round to nearest even.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
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

// Activation codes shared with the Rust side (powerinfer_cuda::Act).
#define ACT_NONE 0
#define ACT_RELU 1
#define ACT_SILU 2
#define ACT_GELU 3

__device__ __forceinline__ float apply_act(int act, float x) {
    switch (act) {
    case ACT_RELU: return fmaxf(x, 0.0f);
    case ACT_SILU: return x / (1.0f + expf(-x));
    case ACT_GELU: {
        const float c = 0.7978845608f;  // sqrt(2/pi), tanh approximation as the CPU side
        return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    default: return x;
    }
}

// Where row r of a matrix lives: rows come in groups of `group_rows` (a slab of hot neurons),
// group g starting at g * group_stride bytes; inside a group, this matrix's rows start at
// `offset` and are `row_bytes` apart. A plain row-major matrix is one group (group_rows >= rows,
// group_stride 0, offset 0).
struct RowLayout {
    i64 group_stride;
    i64 offset;
    int group_rows;
    int row_bytes;
};

__device__ __forceinline__ const u8* row_ptr(const u8* base, RowLayout l, int r) {
    const int g = r / l.group_rows;
    const int i = r - g * l.group_rows;
    return base + (i64)g * l.group_stride + l.offset + (i64)i * l.row_bytes;
}

// Weight j (0..cols) of one row, decoded on its own (used where threads own columns).
__device__ __forceinline__ float w_f32(const u8* row, int j) { return ((const float*)row)[j]; }
__device__ __forceinline__ float w_f16(const u8* row, int j) { return f16_to_f32(ld_u16(row + 2 * j)); }
__device__ __forceinline__ float w_bf16(const u8* row, int j) { return bf16_to_f32(ld_u16(row + 2 * j)); }
__device__ __forceinline__ float w_q8_0(const u8* row, int j) {
    const u8* b = row + (j / QK) * 34;
    return f16_to_f32(ld_u16(b)) * (float)(i8)b[2 + j % QK];
}
__device__ __forceinline__ float w_q4_0(const u8* row, int j) {
    const u8* b = row + (j / QK) * 18;
    const int k = j % QK;
    const int q = k < 16 ? (b[2 + k] & 15) : (b[2 + k - 16] >> 4);
    return f16_to_f32(ld_u16(b)) * (float)(q - 8);
}
__device__ __forceinline__ float w_q4_1(const u8* row, int j) {
    const u8* b = row + (j / QK) * 20;
    const int k = j % QK;
    const int q = k < 16 ? (b[4 + k] & 15) : (b[4 + k - 16] >> 4);
    return f16_to_f32(ld_u16(b)) * (float)q + f16_to_f32(ld_u16(b + 2));
}

// One lane's share of dot(row, x) for a row of `cols` weights: lanes stride over elements
// (float formats) or 32-weight blocks (quantized formats); the caller sums over the warp.
__device__ __forceinline__ float lane_dot_f32(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int j = lane; j < cols; j += WARP) s += w_f32(row, j) * x[j];
    return s;
}
__device__ __forceinline__ float lane_dot_f16(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int j = lane; j < cols; j += WARP) s += w_f16(row, j) * x[j];
    return s;
}
__device__ __forceinline__ float lane_dot_bf16(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int j = lane; j < cols; j += WARP) s += w_bf16(row, j) * x[j];
    return s;
}
__device__ __forceinline__ float lane_dot_q8_0(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int b = lane; b < cols / QK; b += WARP) {
        const u8* blk = row + b * 34;
        const float* xb = x + b * QK;
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < QK; ++k) t += (float)(i8)blk[2 + k] * xb[k];
        s += f16_to_f32(ld_u16(blk)) * t;
    }
    return s;
}
__device__ __forceinline__ float lane_dot_q4_0(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int b = lane; b < cols / QK; b += WARP) {
        const u8* blk = row + b * 18;
        const float* xb = x + b * QK;
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const u8 q = blk[2 + k];
            t += (float)((q & 15) - 8) * xb[k] + (float)((q >> 4) - 8) * xb[k + 16];
        }
        s += f16_to_f32(ld_u16(blk)) * t;
    }
    return s;
}
__device__ __forceinline__ float lane_dot_q4_1(const u8* row, const float* x, int cols, int lane) {
    float s = 0.0f;
    for (int b = lane; b < cols / QK; b += WARP) {
        const u8* blk = row + b * 20;
        const float* xb = x + b * QK;
        float t = 0.0f, xs = 0.0f;
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const u8 q = blk[4 + k];
            t += (float)(q & 15) * xb[k] + (float)(q >> 4) * xb[k + 16];
            xs += xb[k] + xb[k + 16];
        }
        s += f16_to_f32(ld_u16(blk)) * t + f16_to_f32(ld_u16(blk + 2)) * xs;
    }
    return s;
}
