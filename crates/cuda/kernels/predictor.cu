// The activation predictor after fc1 (fc1 · x with ReLU is a sparse_matvec launch): fc2 over
// the hidden units ReLU left nonzero, and the threshold.
//
// predictor_fc2_<dtype>: thread j computes logit_j = sum_{h : hidden[h] > 0} hidden[h] *
// fc2_t[h][j] (fc2_t is [rank, ffn]: a thread block reads consecutive columns of one row, so the
// reads coalesce) and writes flags[j] = logit_j >= threshold, and logits[j] when asked.
// Launch: blockDim.x = 256, gridDim.x = ceil(ffn / 256), dynamic shared memory = rank * 4.

#define PREDICTOR_FC2(NAME)                                                                     \
    KERNEL predictor_fc2_##NAME(                                                                \
        const u8* fc2_t, RowLayout l, const float* hidden, int rank, int ffn, float threshold,  \
        int* flags, float* logits) {                                                            \
        DYNAMIC_SHARED(float, hs);                                                              \
        for (int i = threadIdx.x; i < rank; i += blockDim.x) hs[i] = hidden[i];                 \
        __syncthreads();                                                                        \
        const int j = blockIdx.x * blockDim.x + threadIdx.x;                                    \
        if (j >= ffn) return;                                                                   \
        float s = 0.0f;                                                                         \
        for (int h = 0; h < rank; ++h) {                                                        \
            const float v = hs[h];                                                              \
            if (v > 0.0f) s += v * w_##NAME(row_ptr(fc2_t, l, h), j, ffn);                      \
        }                                                                                       \
        flags[j] = s >= threshold ? 1 : 0;                                                      \
        if (logits) logits[j] = s;                                                              \
    }                                                                                           \
    EMU_ENTRY(predictor_fc2_##NAME)

PREDICTOR_FC2(f32)
PREDICTOR_FC2(f16)
PREDICTOR_FC2(bf16)
PREDICTOR_FC2(q8_0)
PREDICTOR_FC2(q4_0)
PREDICTOR_FC2(q4_1)
PREDICTOR_FC2(q5_0)
PREDICTOR_FC2(q5_1)
PREDICTOR_FC2(q4_k)
PREDICTOR_FC2(q5_k)
PREDICTOR_FC2(q6_k)
