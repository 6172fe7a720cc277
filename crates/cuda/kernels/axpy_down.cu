// Column-sparse accumulation over rows of a transposed matrix (the hot down_t rows):
// y[c] += sum_k a[k] * W[row k][c], where row k is idx[k] or k. A row whose coefficient is
// exactly 0 is not read (the CPU kernels' rule).
//
// gridDim.y splits the rows into `splits` runs of ceil(n / splits). With one split the sums go
// to y; with more, split s writes its partial sums to part[s][c] and add_splits then adds them
// to y in split order. No atomics anywhere: the same inputs give the same bits on every run.
//
// With `count` (a device int written by compact_nonzero: the rows are a compacted list) the
// rows are the first min(*count, n), in live_splits(...) runs: one per SPLIT_ROWS of them, at
// most gridDim.y; the blocks of the other splits return at once, and add_splits (given the same
// count) adds the live splits' sums.
//
// Tiled (common.cuh `tile_*`): a thread owns a unit of TILE columns (one 32-weight block of
// the repacked quantized formats, 16 bytes of an f16/bf16/f32 row, 16 bytes of a K-quant
// super-block's quants) and keeps their sums in registers; a warp's units are consecutive, so the
// warp reads 512 bytes of each row's quants with 16-byte loads (the headers follow, also
// consecutive) when the row starts 16-byte aligned. A block of 256 threads holds `units_pb`
// units (32, or the row's units rounded up to a power of two when fewer) times 256 / units_pb
// row lanes: lane r takes rows k0 + r, k0 + r + lanes, ... of the split, and the lanes' sums
// are then added in lane order through shared memory (`sum_row_lanes`). gridDim.x =
// ceil(units / units_pb).
//
// Launch: blockDim.x = 256, gridDim = (as above, splits); dynamic shared memory 256 * TILE * 4
// bytes when there is more than one row lane, else 0 (launch_spec.rs `tile_geometry`), plus 2 KiB
// of static shared memory (the staged coefficients and row ids). Then, for splits > 1, add_splits
// with gridDim.x = ceil(cols / 256).

// The block stages the coefficients (and row ids) of its split in chunks of blockDim.x: each
// thread loads one of each, all in flight together, into shared memory; then row lane r visits
// rows c + r, c + r + lanes, ... of the chunk (the same rows in the same order as one at a time
// over the whole split, so the same bits) reading coefficients from shared memory, and loads a
// row only when its coefficient is nonzero. The row loop is not unrolled: one tile's code.
// Measured on an H200 (benchmarks/gpu/NOTES.md, ncu with flushed caches, 7B down pass): a
// lane loading its coefficients one at a time ran 22.8 µs (one DRAM round trip per row), in
// unrolled batches of 4 26.6 µs and of 16 47.2 µs (a tile's code inlined per batch slot);
// staging takes one round trip for the whole chunk and keeps one tile's code.
#define AXPY_CHUNK BLOCK_THREADS

// Rows per split of a compacted list (`down_splits` in ops/axpy.rs cuts the hot list the same).
#define SPLIT_ROWS 128

// The splits that run over n rows: all gridDim.y without a count, else one per SPLIT_ROWS
// rows, 1..=splits.
__device__ __forceinline__ int live_splits(const int* count, int n, int splits) {
    return count ? max(1, min(splits, (n + SPLIT_ROWS - 1) / SPLIT_ROWS)) : splits;
}

#define AXPY_ROWS_TILED(NAME)                                                                   \
    KERNEL axpy_rows_##NAME(                                                                    \
        const u8* w, RowLayout l, int cols, const int* idx, const float* a, int n,              \
        const int* count, float* part, float* y, int units_pb) {                                \
        constexpr int TILE = ROW_TILE_##NAME;                                                  \
        if (count) n = min(n, *count);                                                          \
        const int splits = live_splits(count, n, gridDim.y);                                    \
        if ((int)blockIdx.y >= splits) return; /* the whole block */                            \
        DYNAMIC_SHARED(float, red);                                                             \
        SHARED_ARRAY(float, sa, [AXPY_CHUNK]);                                                  \
        SHARED_ARRAY(int, sr, [AXPY_CHUNK]);                                                    \
        const int lanes = blockDim.x / units_pb;                                                \
        const int ul = threadIdx.x % units_pb, lane = threadIdx.x / units_pb;                   \
        const int u = blockIdx.x * units_pb + ul;                                               \
        const int units = (cols + TILE - 1) / TILE;                                             \
        const int per = (n + splits - 1) / splits;                                              \
        const int k0 = blockIdx.y * per, k1 = min(n, k0 + per);                                 \
        float acc[TILE];                                                                        \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) acc[i] = 0.0f;                         \
        for (int c = k0; c < k1; c += AXPY_CHUNK) {                                             \
            const int m = min(AXPY_CHUNK, k1 - c);                                              \
            const int t = threadIdx.x;                                                          \
            if (t < m) {                                                                        \
                sa[t] = a[c + t];                                                               \
                sr[t] = idx ? idx[c + t] : c + t;                                               \
            }                                                                                   \
            __syncthreads();                                                                    \
            if (u < units) {                                                                    \
                _Pragma("unroll 1") for (int j = lane; j < m; j += lanes) {                     \
                    const float ak = sa[j];                                                     \
                    if (ak == 0.0f) continue;                                                   \
                    const u8* row = row_ptr(w, l, sr[j]);                                       \
                    const bool al = ((unsigned long long)row & 15) == 0;                        \
                    tile_##NAME(row, u, cols, al, ak, acc);                                     \
                }                                                                               \
            }                                                                                   \
            __syncthreads();                                                                    \
        }                                                                                       \
        if (!sum_row_lanes<TILE>(red, acc, lanes, lane, units_pb, ul) || u >= units) return;   \
        float* out = gridDim.y == 1 ? y : part + (i64)blockIdx.y * cols;                        \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) {                                      \
            const int c = TILE_COL_##NAME(u, i);                                                \
            if (c < cols) out[c] = gridDim.y == 1 ? out[c] + acc[i] : acc[i];                   \
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
AXPY_ROWS_TILED(q4_k)
AXPY_ROWS_TILED(q5_k)
AXPY_ROWS_TILED(q6_k)

// y[c] += part[0][c] + part[1][c] + ... + part[splits - 1][c], in that order (the second pass
// of a split axpy_rows); with `count`, over the live splits of min(*count, n) rows.
KERNEL add_splits(const float* part, int splits, int cols, const int* count, int n, float* y) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    if (count) splits = live_splits(count, min(n, *count), splits);
    float s = 0.0f;
    for (int k = 0; k < splits; ++k) s += part[(i64)k * cols + c];
    y[c] += s;
}
EMU_ENTRY(add_splits)
