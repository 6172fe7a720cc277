// Compaction on the GPU: the hot slots a token computes, and the rows the down pass reads,
// gathered into lists in slot order, so that gate_up and axpy_rows run over those rows only
// instead of testing every hot row's flag or coefficient (and so that axpy_rows loads a batch
// of rows with no branch between them). The count goes to a device int that the consumers read
// (their `count` argument): the host never waits for it.
//
// One block of BLOCK_THREADS; each thread takes COMPACT_ITEMS consecutive entries per round
// (the warp reads 1 KiB of consecutive floats or ids at once), a block-wide scan of the
// threads' counts places each kept entry, in entry order: the lists, and the sums the down pass
// takes over them, are the same on every run.
//
// Launch: blockDim.x = 256, gridDim.x = 1.

#define COMPACT_ITEMS 8

// Inclusive prefix sum of v over the warp, and the warp's total: xor butterflies, lane l adding
// at level o the total of the group of o lanes before its own when bit o of l is set (counts
// below 2^24 are exact in floats).
__device__ __forceinline__ int warp_scan(int v, int lane, int* total) {
    float p = (float)v, s = (float)v;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, s, o);
        if (lane & o) p += t;
        s += t;
    }
    *total = (int)s;
    return (int)p;
}

// Exclusive prefix sum of c over the block (thread order), and the block's total in *total.
// Every thread of the block must call it.
__device__ __forceinline__ int block_scan(int c, int* total) {
    SHARED_ARRAY(int, warp_total, [BLOCK_THREADS / WARP]);
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int wt;
    const int incl = warp_scan(c, lane, &wt);
    if (lane == 0) warp_total[w] = wt;
    __syncthreads();
    int before = 0, all = 0;
    for (int i = 0; i < (int)blockDim.x / WARP; ++i) {
        const int v = warp_total[i];
        before += i < w ? v : 0;
        all += v;
    }
    __syncthreads();  // warp_total is written again by the next round
    *total = all;
    return before + incl - c;
}

// The entries k < m (m = min(*count_in, n), or n without count_in) whose coefficient a[k] is not
// 0 (a NaN is kept): out_idx[j] = idx[k] (k without idx) and out_a[j] = a[k] for the j-th of
// them, *count = how many. The down pass's rows: a[k] is the activation of slot idx[k].
KERNEL compact_nonzero(const float* a, const int* idx, const int* count_in, int n, int* out_idx,
                       float* out_a, int* count) {
    const int m = count_in ? min(*count_in, n) : n;
    int base = 0;
    for (int t0 = 0; t0 < m; t0 += COMPACT_ITEMS * (int)blockDim.x) {
        const int k0 = t0 + COMPACT_ITEMS * threadIdx.x;
        float v[COMPACT_ITEMS];
        int c = 0;
#pragma unroll
        for (int i = 0; i < COMPACT_ITEMS; ++i) {
            v[i] = k0 + i < m ? a[k0 + i] : 0.0f;
            c += v[i] != 0.0f;
        }
        int total;
        int j = base + block_scan(c, &total);
#pragma unroll
        for (int i = 0; i < COMPACT_ITEMS; ++i) {
            if (v[i] == 0.0f) continue;
            out_idx[j] = idx ? idx[k0 + i] : k0 + i;
            out_a[j] = v[i];
            ++j;
        }
        base += total;
    }
    if (threadIdx.x == 0) *count = base;
}
EMU_ENTRY(compact_nonzero)

// The hot slots s < n whose neuron is active: id(s) >= 0 (not padding, ids read from the slabs
// through ids_l) and flags[id] != 0; out_idx[j] = the j-th of them, *count = how many. The
// slots gate_up computes in predictor mode.
KERNEL compact_flags(const u8* slabs, RowLayout ids_l, const int* flags, int n, int* out_idx,
                     int* count) {
    int base = 0;
    for (int t0 = 0; t0 < n; t0 += COMPACT_ITEMS * (int)blockDim.x) {
        const int k0 = t0 + COMPACT_ITEMS * threadIdx.x;
        int id[COMPACT_ITEMS];
        bool on[COMPACT_ITEMS];
        int c = 0;
#pragma unroll
        for (int i = 0; i < COMPACT_ITEMS; ++i) {
            id[i] = k0 + i < n ? slot_id(slabs, ids_l, k0 + i) : -1;
        }
#pragma unroll
        for (int i = 0; i < COMPACT_ITEMS; ++i) {
            on[i] = id[i] >= 0 && flags[id[i]] != 0;
            c += on[i];
        }
        int total;
        int j = base + block_scan(c, &total);
#pragma unroll
        for (int i = 0; i < COMPACT_ITEMS; ++i) {
            if (on[i]) out_idx[j++] = k0 + i;
        }
        base += total;
    }
    if (threadIdx.x == 0) *count = base;
}
EMU_ENTRY(compact_flags)
