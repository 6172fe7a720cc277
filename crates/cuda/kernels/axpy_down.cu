// Column-sparse accumulation over rows of a transposed matrix (the hot down_t rows):
// y[c] += sum_k a[k] * W[row k][c], where row k is idx[k] or k. A row whose coefficient is
// exactly 0 is not read (the CPU kernels' rule).
//
// gridDim.y splits the rows into `splits` runs of ceil(n / splits). With one split the sums go
// to y; with more, split s writes its partial sums to part[s][c] and add_splits then adds them
// to y in split order. No atomics anywhere: the same inputs give the same bits on every run.
//
// Tiled (every format but the K-quants): a thread owns a unit of TILE consecutive columns (one
// 32-weight block of the repacked quantized formats, 16 bytes of an f16/bf16/f32 row) and keeps
// their sums in registers; a warp's units are consecutive, so the warp reads each row's bytes
// in one sweep of 16-byte loads (the quants; the headers follow, also consecutive) when the row
// starts 16-byte aligned. A block of 256 threads holds `units_pb` units (the row's units,
// rounded up to a power of two, at most 256) times 256 / units_pb row lanes: lane r takes rows
// k0 + r, k0 + r + lanes, ... of the split, and the lanes' sums are then added in lane order
// through shared memory (laid out [tile column][lane][unit], so a warp's accesses hit
// consecutive words). gridDim.x = ceil(units / units_pb).
//
// K-quants: a thread per column decodes one weight at a time (blockDim 256 columns per block,
// units_pb unused).
//
// Launch: blockDim.x = 256, gridDim = (as above, splits); dynamic shared memory 256 * TILE * 4
// bytes for the tiled kernels when there is more than one row lane, else 0 (launch_spec.rs
// `axpy_geometry`). Then, for splits > 1, add_splits with gridDim.x = ceil(cols / 256).

// Columns per thread of the tiled kernels (launch_spec.rs `axpy_tile`; 0: the K-quants'
// column-per-thread kernel).
#define AXPY_TILE_f32 4
#define AXPY_TILE_f16 8
#define AXPY_TILE_bf16 8
#define AXPY_TILE_q8_0 32
#define AXPY_TILE_q4_0 32
#define AXPY_TILE_q4_1 32
#define AXPY_TILE_q5_0 32
#define AXPY_TILE_q5_1 32

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

#define AXPY_ROWS_TILED(NAME)                                                                   \
    KERNEL axpy_rows_##NAME(                                                                    \
        const u8* w, RowLayout l, int cols, const int* idx, const float* a, int n,              \
        float* part, float* y, int units_pb) {                                                  \
        constexpr int TILE = AXPY_TILE_##NAME;                                                  \
        DYNAMIC_SHARED(float, red);                                                             \
        const int lanes = blockDim.x / units_pb;                                                \
        const int ul = threadIdx.x % units_pb, lane = threadIdx.x / units_pb;                   \
        const int u = blockIdx.x * units_pb + ul;                                               \
        const int units = (cols + TILE - 1) / TILE;                                             \
        const int per = (n + gridDim.y - 1) / gridDim.y;                                        \
        const int k0 = blockIdx.y * per, k1 = min(n, k0 + per);                                 \
        float acc[TILE];                                                                        \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) acc[i] = 0.0f;                         \
        if (u < units) {                                                                        \
            for (int k = k0 + lane; k < k1; k += lanes) {                                       \
                const float ak = a[k];                                                          \
                if (ak == 0.0f) continue;                                                       \
                const u8* row = row_ptr(w, l, idx ? idx[k] : k);                                \
                const bool al = ((unsigned long long)row & 15) == 0;                            \
                tile_##NAME(row, u, cols, al, ak, acc);                                         \
            }                                                                                   \
        }                                                                                       \
        if (lanes > 1) {                                                                        \
            _Pragma("unroll") for (int i = 0; i < TILE; ++i)                                    \
                red[(i * lanes + lane) * units_pb + ul] = acc[i];                               \
            __syncthreads();                                                                    \
            if (lane != 0) return;                                                              \
            _Pragma("unroll") for (int i = 0; i < TILE; ++i) {                                  \
                float s = 0.0f;                                                                 \
                for (int r = 0; r < lanes; ++r) s += red[(i * lanes + r) * units_pb + ul];      \
                acc[i] = s;                                                                     \
            }                                                                                   \
        }                                                                                       \
        if (u >= units) return;                                                                 \
        float* out = gridDim.y == 1 ? y : part + (i64)blockIdx.y * cols;                        \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) {                                      \
            const int c = TILE * u + i;                                                         \
            if (c < cols) out[c] = gridDim.y == 1 ? out[c] + acc[i] : acc[i];                   \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(axpy_rows_##NAME)

#define AXPY_ROWS(NAME)                                                                         \
    KERNEL axpy_rows_##NAME(                                                                    \
        const u8* w, RowLayout l, int cols, const int* idx, const float* a, int n,              \
        float* part, float* y, int) {                                                           \
        const int c = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (c >= cols) return;                                                                  \
        const int per = (n + gridDim.y - 1) / gridDim.y;                                        \
        const int k0 = blockIdx.y * per, k1 = min(n, k0 + per);                                 \
        float s = 0.0f;                                                                         \
        for (int k = k0; k < k1; ++k) {                                                         \
            const float ak = a[k];                                                              \
            if (ak != 0.0f) s += ak * w_##NAME(row_ptr(w, l, idx ? idx[k] : k), c, cols);       \
        }                                                                                       \
        if (gridDim.y == 1) {                                                                   \
            y[c] += s;                                                                          \
        } else {                                                                                \
            part[(i64)blockIdx.y * cols + c] = s;                                               \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(axpy_rows_##NAME)

AXPY_ROWS_TILED(f32)
AXPY_ROWS_TILED(f16)
AXPY_ROWS_TILED(bf16)
AXPY_ROWS_TILED(q8_0)
AXPY_ROWS_TILED(q4_0)
AXPY_ROWS_TILED(q4_1)
AXPY_ROWS_TILED(q5_0)
AXPY_ROWS_TILED(q5_1)
AXPY_ROWS(q4_k)
AXPY_ROWS(q5_k)
AXPY_ROWS(q6_k)

// y[c] += part[0][c] + part[1][c] + ... + part[splits - 1][c], in that order (the second pass
// of a split axpy_rows).
KERNEL add_splits(const float* part, int splits, int cols, float* y) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (int k = 0; k < splits; ++k) s += part[(i64)k * cols + c];
    y[c] += s;
}
EMU_ENTRY(add_splits)
