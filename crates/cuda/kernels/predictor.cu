// The activation predictor after fc1 (fc1 · x with ReLU is a sparse_matvec launch): fc2 over
// the hidden units ReLU left nonzero, the threshold, and the compaction of active flags into an
// ordered index list (the CPU's cold work list, or the GPU's own).
//
// predictor_fc2_<dtype>: thread j computes logit_j = sum_{h : hidden[h] > 0} hidden[h] *
// fc2_t[h][j] (fc2_t is [rank, ffn]: a thread block reads consecutive columns of one row, so the
// reads coalesce) and writes flags[j] = logit_j >= threshold, and logits[j] when asked.
// Launch: blockDim.x = 256, gridDim.x = ceil(ffn / 256), dynamic shared memory = rank * 4.

#define PREDICTOR_FC2(NAME)                                                                     \
    extern "C" __global__ void predictor_fc2_##NAME(                                            \
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
            if (v > 0.0f) s += v * w_##NAME(row_ptr(fc2_t, l, h), j);                           \
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

// Ordered compaction: out[0..count) = the i with flags[i] != 0, ascending; *count = how many.
// One block of 1024 threads; thread t scans a contiguous chunk, a block-wide exclusive scan of
// the chunk counts gives each thread its output offset. Deterministic (no atomics).
// Launch: gridDim.x = 1, blockDim.x = 1024.
#define COMPACT_THREADS 1024
extern "C" __global__ void compact_flags(const int* flags, int n, int* out, int* count) {
    SHARED_ARRAY(int, sums, [COMPACT_THREADS]);
    const int t = threadIdx.x;
    const int per = (n + COMPACT_THREADS - 1) / COMPACT_THREADS;
    const int b = min(n, t * per), e = min(n, b + per);
    int c = 0;
    for (int i = b; i < e; ++i) c += flags[i] != 0;
    sums[t] = c;
    __syncthreads();
    // Hillis-Steele inclusive scan over the 1024 counts.
    for (int o = 1; o < COMPACT_THREADS; o <<= 1) {
        const int v = t >= o ? sums[t - o] : 0;
        __syncthreads();
        sums[t] += v;
        __syncthreads();
    }
    int at = sums[t] - c;
    for (int i = b; i < e; ++i) {
        if (flags[i] != 0) out[at++] = i;
    }
    if (t == COMPACT_THREADS - 1) *count = sums[t];
}
EMU_ENTRY(compact_flags)

// Per-neuron flags of a hot-neuron layout: slot_flags[r] = flags[id(r)] for r in 0..n (which
// hot slots the predictor marked active), and flags[id] cleared for every hot neuron, in place,
// so the remaining flags are the CPU's cold active set. Hot ids are distinct, so each thread
// reads and clears its own entry. Launch: blockDim.x = 256, grid ceil(n/256).
extern "C" __global__ void split_hot_flags(const u8* ids_base, RowLayout ids_l, int n, int* flags,
                                           int* slot_flags) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const int id = *(const int*)row_ptr(ids_base, ids_l, r);
    if (id < 0) {  // padding slot of a partial slab
        slot_flags[r] = 0;
        return;
    }
    slot_flags[r] = flags[id];
    flags[id] = 0;
}
EMU_ENTRY(split_hot_flags)
