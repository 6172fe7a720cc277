// Column-sparse accumulation over rows of a transposed matrix (the hot down_t rows, and the
// predictor's fc2_t): y[c] += sum_k a[k] * W[row k][c], where row k is idx[k] or k. A row whose
// coefficient is exactly 0 is not read (the CPU kernels' rule).
//
// Threads own columns (a warp reads 32 consecutive weights of a row: one quantized block), so
// no two threads write the same y. gridDim.y splits the rows: with one split each y[c] is summed
// in row order by one thread (deterministic); with more, the splits' partial sums are added with
// atomicAdd (faster for long lists, order not fixed).
//
// Launch: blockDim.x = 256, gridDim.x = ceil(cols / 256), gridDim.y = splits.

#define AXPY_ROWS(NAME)                                                                         \
    KERNEL axpy_rows_##NAME(                                                                    \
        const u8* w, RowLayout l, int cols, const int* idx, const float* a, int n, float* y) {  \
        const int c = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (c >= cols) return;                                                                  \
        const int per = (n + gridDim.y - 1) / gridDim.y;                                        \
        const int k0 = blockIdx.y * per, k1 = min(n, k0 + per);                                 \
        float s = 0.0f;                                                                         \
        for (int k = k0; k < k1; ++k) {                                                         \
            const float ak = a[k];                                                              \
            if (ak != 0.0f) s += ak * w_##NAME(row_ptr(w, l, idx ? idx[k] : k), c);             \
        }                                                                                       \
        if (gridDim.y == 1) {                                                                   \
            y[c] += s;                                                                          \
        } else if (s != 0.0f) {                                                                 \
            atomicAdd(&y[c], s);                                                                \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(axpy_rows_##NAME)

AXPY_ROWS(f32)
AXPY_ROWS(f16)
AXPY_ROWS(bf16)
AXPY_ROWS(q8_0)
AXPY_ROWS(q4_0)
AXPY_ROWS(q4_1)
AXPY_ROWS(q5_0)
AXPY_ROWS(q5_1)
AXPY_ROWS(q4_k)
AXPY_ROWS(q5_k)
AXPY_ROWS(q6_k)
