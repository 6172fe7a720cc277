// Kernels that break the rules on purpose, compiled into the emulator only (never into the
// GPU's modules): tests/emu_selftest.rs checks that the emulator reports each as an error
// instead of returning wrong numbers or hanging.

// The upper half of each warp returns before the warp sums: a shuffle reading returned lanes.
extern "C" __global__ void emu_selftest_shuffle_after_return(float* out) {
    if (threadIdx.x % WARP >= 16) return;
    const float s = warp_sum(1.0f);
    if (threadIdx.x % WARP == 0) out[threadIdx.x / WARP] = s;
}
EMU_ENTRY(emu_selftest_shuffle_after_return)

// Thread 1 waits for a flag thread 0 sets only after the block's barrier, which thread 1 never
// reaches: a deadlock on a GPU, a barrier timeout here. Thread 1 stops waiting once the launch
// has failed (or after `spins` milliseconds), so the launch ends.
extern "C" __global__ void emu_selftest_barrier_deadlock(int* flag, int spins) {
    if (threadIdx.x == 1) {
        for (int i = 0; i < spins && __atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0 &&
                        !emu::launch_failed();
             ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return;
    }
    __syncthreads();
    if (threadIdx.x == 0) __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
}
EMU_ENTRY(emu_selftest_barrier_deadlock)
