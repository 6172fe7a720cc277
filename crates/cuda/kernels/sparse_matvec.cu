// Row-sparse matrix-vector products over compact rows of gate/up (and, with no index list, the
// dense projections): a warp per row, x staged once per block in shared memory.
//
// Rows are addressed through a RowLayout (common.cuh), so the same kernels read a plain
// row-major matrix and the hot-neuron slabs of the VRAM plan (B gate rows, B up rows, B down_t
// rows, B i32 neuron ids per slab; no up rows for a gate-less FFN). Row k of the output is row
// idx[k] of the matrix, or row k when idx is null. With `flags` (one i32 per FFN neuron,
// nonzero = active) a row whose neuron id (read through `ids_l`) is inactive is not read and
// yields 0.
//
// x: the float formats (f32, f16, bf16) take it as `cols` floats; the quantized formats as the
// int16 blocks `quantize_x` writes (common.cuh: XQ_BLOCK bytes per 32 values), and
// multiply with exact integer dots.
//
// BF16 is decoded by a shift (common.cuh), not through cuda_bf16.h intrinsics, so it needs no
// __CUDA_ARCH__ >= 800 guard and runs on every architecture.
//
// Launch: blockDim.x = 256 (8 warps), gridDim.x = ceil(n / ROWS_PER_BLOCK), dynamic shared
// memory = x's bytes (cols * 4, or cols / 32 * XQ_BLOCK) when at most 48 KiB, else 0 (x is then
// read from global memory); launch_spec.rs `x_smem` computes the same.

// 16 rows per block of 8 warps: two per warp. Measured on an H200 (benchmarks/gpu/NOTES.md) with
// 32, a 4096 x 4096 Q4_0 product ran 128 blocks (one per SM, 8 warps: too few loads in flight)
// at 477 GB/s; 16 doubles the blocks, and each lane's loop is unrolled by 4 (lane_dot_*) so a
// warp has a whole 4096-wide row's loads in flight at once.
#define ROWS_PER_BLOCK 16

// 16-byte loads of x a thread has in flight at once when staging it.
#define X_BATCH 2

// Most bytes of x staged in shared memory (48 KiB; `MAX_X_BYTES` in layout.rs).
#define MAX_X_BYTES 49152

// The x input of each format's kernels: floats, or quantized blocks (bytes).
#define XIN_f32 float
#define XIN_f16 float
#define XIN_bf16 float
#define XIN_q8_0 u8
#define XIN_q4_0 u8
#define XIN_q4_1 u8
#define XIN_q5_0 u8
#define XIN_q5_1 u8
#define XIN_q4_k u8
#define XIN_q5_k u8
#define XIN_q6_k u8

// Bytes of x for a row of `cols` weights.
__device__ __forceinline__ int x_bytes(const float*, int cols) { return 4 * cols; }
__device__ __forceinline__ int x_bytes(const u8*, int cols) { return (cols / QK) * XQ_BLOCK; }

// x for the block's rows: its `bytes` copied into shared memory when they fit, else read in
// place from global memory. The branch is uniform over the block; every thread of the block
// must call it. 16-byte loads, X_BATCH of a thread in flight together, then their stores: one
// 4-byte load at a time (load, store, next), a 4096-wide x took 16 round trips before the first
// weight was read (H200, benchmarks/gpu/NOTES.md).
template <typename T>
__device__ __forceinline__ const T* stage_x(float* xs, const T* x, int cols) {
    const int bytes = x_bytes(x, cols);
    if (bytes > MAX_X_BYTES) return x;
    if (bytes % 16 == 0 && ((unsigned long long)x & 15) == 0) {
        const Vec16* x16 = (const Vec16*)x;
        Vec16* d16 = (Vec16*)xs;
        const int n16 = bytes / 16;
#pragma unroll 1
        for (int q0 = threadIdx.x; q0 < n16; q0 += X_BATCH * blockDim.x) {
            Vec16 v[X_BATCH];
#pragma unroll
            for (int b = 0; b < X_BATCH; ++b) {
                const int q = q0 + b * (int)blockDim.x;
                if (q < n16) v[b] = x16[q];
            }
#pragma unroll
            for (int b = 0; b < X_BATCH; ++b) {
                const int q = q0 + b * (int)blockDim.x;
                if (q < n16) d16[q] = v[b];
            }
        }
    } else {
        // Floats (any count), or x blocks at a 4-aligned address (80 bytes each).
        const u32* x4 = (const u32*)x;
        u32* d4 = (u32*)xs;
        for (int j = threadIdx.x; j < bytes / 4; j += blockDim.x) d4[j] = x4[j];
    }
    __syncthreads();
    return (const T*)xs;
}

// x quantized for the integer dots (common.cuh's XQ_BLOCK rule, `quantize_block_warp`): a warp
// per block of 32 values, lane j taking value j. The CPU engine's rule: q = 0 and NaN header
// floats for a block holding a NaN or an infinity, q = 0 for one too small to scale.
//
// Launch: blockDim.x = 256, gridDim.x = ceil(cols / 32 / 8); cols a multiple of 32; xq holds
// cols / 32 * XQ_BLOCK bytes.
KERNEL quantize_x(const float* x, int cols, u8* xq) {
    const int lane = threadIdx.x % WARP;
    const int b = blockIdx.x * (BLOCK_THREADS / WARP) + threadIdx.x / WARP;
    if (b >= cols / QK) return;  // whole warps
    quantize_block_warp(x[QK * b + lane], xq + XQ_BLOCK * b);
}
EMU_ENTRY(quantize_x)

// Whether output row k (matrix row r) is to be computed.
__device__ __forceinline__ bool row_active(const u8* ids_base, RowLayout ids_l, const int* flags, int r) {
    if (flags == nullptr) return true;
    const int id = slot_id(ids_base, ids_l, r);
    return id >= 0 && flags[id] != 0;
}

// The FFN's activation with FATReLU's threshold t (ProSparse): with ReLU and t > 0, x where
// x > t, else 0; otherwise act(x) (powerinfer_cuda::FfnAct, the CPU engine's FfnKind::apply).
__device__ __forceinline__ float ffn_act(int act, float t, float x) {
    if (act == ACT_RELU && t > 0.0f) return x > t ? x : 0.0f;
    return apply_act(act, x);
}

// gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai, the CPU engine's powerinfer_core::swiglu_oai,
// in its f32 order): the gate clamped above at `limit`, the up value to [-limit, limit],
// g * sigmoid(1.702 g) * (u + 1).
__device__ __forceinline__ float swiglu_oai(float gate, float up, float limit) {
    const float g = fminf(gate, limit);
    const float u = fminf(fmaxf(up, -limit), limit);
    return g / (1.0f + expf(1.702f * -g)) * (u + 1.0f);
}

// gate_up's use of the up rows: none (a gate-less FFN: OPT, Falcon), times u, times act(u)
// (Bamboo). The launch's `up_mode`.
#define UP_NONE 0
#define UP_LINEAR 1
#define UP_ACT 2

// y[k] = act(dot(W[row k], x)) for k in 0..n; with `accumulate`, y[k] + act(...) (the attention's
// output projection added straight into the residual: one launch fewer than a separate add, the
// same float sum).
#define SPARSE_MATVEC(NAME)                                                                     \
    KERNEL sparse_matvec_##NAME(                                                                \
        const u8* w, RowLayout l, const XIN_##NAME* x, int cols, const int* idx, int n,         \
        const u8* ids_base, RowLayout ids_l, const int* flags, int act, int accumulate,         \
        float* y) {                                                                             \
        DYNAMIC_SHARED(float, xs);                                                              \
        const XIN_##NAME* xv = stage_x(xs, x, cols);                                            \
        const int lane = threadIdx.x % WARP, warps = blockDim.x / WARP;                         \
        const int end = min(n, (int)(blockIdx.x + 1) * ROWS_PER_BLOCK);                         \
        for (int k = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP; k < end; k += warps) {   \
            const int r = idx ? idx[k] : k;                                                     \
            float s = 0.0f;                                                                     \
            if (row_active(ids_base, ids_l, flags, r)) {                                        \
                const float d = lane_dot_##NAME(row_ptr(w, l, r), xv, cols, lane);              \
                s = apply_act(act, warp_sum(d));                                                \
            }                                                                                   \
            if (lane == 0) y[k] = accumulate ? y[k] + s : s;                                    \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(sparse_matvec_##NAME)

// h[k] = g * u' with g = act(dot(gate[row k], x) + bias[id]) and u' = dot(up[row k], x)
// (UP_LINEAR), act(dot(up[row k], x)) (UP_ACT) or 1 (UP_NONE): the fused gate/up pass of the
// FFN, act with FATReLU's threshold relu_t. The bias (null: none) has one value per FFN neuron,
// indexed by the slot's id; padding slots (id -1) give 0. The up row is not read when g is
// exactly 0 (ReLU), as on the CPU. With swiglu_limit > 0 (gpt-oss; up rows required) instead
// h[k] = swiglu_oai(dot(gate[row k], x) + bias[id], dot(up[row k], x) + up_bias[id],
// swiglu_limit), up_bias (null: none) one value per FFN neuron as bias. With `count` (a device
// int written by compact_flags), only the first min(*count, n) outputs are computed (the grid
// is sized for n; the blocks past the count return at once), the others left as they are.
#define GATE_UP(NAME)                                                                           \
    KERNEL gate_up_##NAME(                                                                      \
        const u8* w, RowLayout gate_l, RowLayout up_l, const XIN_##NAME* x, int cols,           \
        const int* idx, int n, RowLayout ids_l, const int* flags, const float* bias,            \
        const float* up_bias, int act, float relu_t, float swiglu_limit, int up_mode,           \
        const int* count, float* h) {                                                           \
        if (count) n = min(n, *count);                                                          \
        if ((int)blockIdx.x * ROWS_PER_BLOCK >= n) return; /* the whole block */                \
        DYNAMIC_SHARED(float, xs);                                                              \
        const XIN_##NAME* xv = stage_x(xs, x, cols);                                            \
        const int lane = threadIdx.x % WARP, warps = blockDim.x / WARP;                         \
        const int end = min(n, (int)(blockIdx.x + 1) * ROWS_PER_BLOCK);                         \
        for (int k = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP; k < end; k += warps) {   \
            const int r = idx ? idx[k] : k;                                                     \
            const int id = (flags || bias || up_bias) ? slot_id(w, ids_l, r) : 0;               \
            float out = 0.0f;                                                                   \
            if (id >= 0 && (flags == nullptr || flags[id] != 0)) {                              \
                const float dg =                                                                \
                    warp_sum(lane_dot_##NAME(row_ptr(w, gate_l, r), xv, cols, lane));           \
                if (swiglu_limit > 0.0f) {                                                      \
                    const float u =                                                             \
                        warp_sum(lane_dot_##NAME(row_ptr(w, up_l, r), xv, cols, lane));         \
                    out = swiglu_oai(dg + (bias ? bias[id] : 0.0f),                             \
                                     u + (up_bias ? up_bias[id] : 0.0f), swiglu_limit);         \
                } else {                                                                        \
                    out = ffn_act(act, relu_t, dg + (bias ? bias[id] : 0.0f));                  \
                }                                                                               \
                if (out != 0.0f && up_mode != UP_NONE && swiglu_limit <= 0.0f) {                \
                    const float u =                                                             \
                        warp_sum(lane_dot_##NAME(row_ptr(w, up_l, r), xv, cols, lane));         \
                    out *= up_mode == UP_ACT ? ffn_act(act, relu_t, u) : u;                     \
                }                                                                               \
            }                                                                                   \
            if (lane == 0) h[k] = out;                                                          \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(gate_up_##NAME)

SPARSE_MATVEC(f32)
SPARSE_MATVEC(f16)
SPARSE_MATVEC(bf16)
SPARSE_MATVEC(q8_0)
SPARSE_MATVEC(q4_0)
SPARSE_MATVEC(q4_1)
SPARSE_MATVEC(q5_0)
SPARSE_MATVEC(q5_1)
SPARSE_MATVEC(q4_k)
SPARSE_MATVEC(q5_k)
SPARSE_MATVEC(q6_k)

GATE_UP(f32)
GATE_UP(f16)
GATE_UP(bf16)
GATE_UP(q8_0)
GATE_UP(q4_0)
GATE_UP(q4_1)
GATE_UP(q5_0)
GATE_UP(q5_1)
GATE_UP(q4_k)
GATE_UP(q5_k)
GATE_UP(q6_k)
