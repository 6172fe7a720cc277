// The activation predictor after fc1 (fc1 · x with ReLU is a sparse_matvec launch): fc2 over
// the hidden units ReLU left nonzero, and the threshold.
//
// predictor_fc2_<dtype>: logit_j = sum_{h : hidden[h] > 0} hidden[h] * fc2_t[h][j] (fc2_t is
// [rank, ffn]), flags[j] = logit_j >= threshold, and logits[j] when asked.
//
// As axpy_down.cu's tiled kernel with the hidden units
// as the rows and the coefficients: a thread owns ROW_TILE consecutive columns (16-byte loads of
// each row), units_pb units per block times 256 / units_pb row lanes whose sums meet in shared
// memory in lane order. Launch: blockDim.x = 256, gridDim.x = ceil(units / units_pb), dynamic
// shared memory 256 * ROW_TILE * 4 bytes when there is more than one row lane
// (launch_spec.rs `tile_geometry`).

#define PREDICTOR_FC2_TILED(NAME)                                                               \
    KERNEL predictor_fc2_##NAME(                                                                \
        const u8* fc2_t, RowLayout l, const float* hidden, int rank, int ffn, float threshold,  \
        int* flags, float* logits, int units_pb) {                                              \
        constexpr int TILE = ROW_TILE_##NAME;                                                   \
        DYNAMIC_SHARED(float, red);                                                             \
        const int lanes = blockDim.x / units_pb;                                                \
        const int ul = threadIdx.x % units_pb, lane = threadIdx.x / units_pb;                   \
        const int u = blockIdx.x * units_pb + ul;                                               \
        const int units = (ffn + TILE - 1) / TILE;                                              \
        float acc[TILE];                                                                        \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) acc[i] = 0.0f;                         \
        if (u < units) {                                                                        \
            for (int h = lane; h < rank; h += lanes) {                                          \
                const float v = hidden[h];                                                      \
                if (!(v > 0.0f)) continue;                                                      \
                const u8* row = row_ptr(fc2_t, l, h);                                           \
                const bool al = ((unsigned long long)row & 15) == 0;                            \
                tile_##NAME(row, u, ffn, al, v, acc);                                           \
            }                                                                                   \
        }                                                                                       \
        if (!sum_row_lanes<TILE>(red, acc, lanes, lane, units_pb, ul) || u >= units) return;   \
        _Pragma("unroll") for (int i = 0; i < TILE; ++i) {                                      \
            const int j = TILE_COL_##NAME(u, i);                                                \
            if (j < ffn) {                                                                      \
                flags[j] = acc[i] >= threshold ? 1 : 0;                                         \
                if (logits) logits[j] = acc[i];                                                 \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    EMU_ENTRY(predictor_fc2_##NAME)

PREDICTOR_FC2_TILED(f32)
PREDICTOR_FC2_TILED(f16)
PREDICTOR_FC2_TILED(bf16)
PREDICTOR_FC2_TILED(q8_0)
PREDICTOR_FC2_TILED(q4_0)
PREDICTOR_FC2_TILED(q4_1)
PREDICTOR_FC2_TILED(q5_0)
PREDICTOR_FC2_TILED(q5_1)
PREDICTOR_FC2_TILED(q4_k)
PREDICTOR_FC2_TILED(q5_k)
PREDICTOR_FC2_TILED(q6_k)
