//! A read-bandwidth probe, so benchmarks can report kernels as a fraction of what the memory
//! system delivers. Each thread streams one contiguous part of a buffer much larger than the
//! caches through several independent accumulators (AVX2 loads where available), the way the
//! matvec kernels read weights. The buffer is a [`powerinfer_core::PageBuf`], on huge pages
//! where the OS grants them, like the large tensors the engine owns.

use crate::dispatch;
use crate::simd;
use rayon::prelude::*;
use std::time::Instant;

/// Read bandwidth in GB/s (10^9 bytes/s) on the current rayon pool: reads a buffer of `bytes`
/// bytes (at least 1 MiB; allocated and written first so every page is real) `iters` times, each
/// thread its own contiguous part, and returns the best pass. Pass a buffer well above the
/// last-level cache (1 GiB is a good default) to measure DRAM rather than cache.
pub fn measure_read_bandwidth(bytes: usize, iters: usize) -> f64 {
    let n = (bytes / 8).max(1 << 17);
    let threads = rayon::current_num_threads().max(1);
    let part = n.div_ceil(threads).next_multiple_of(64);
    // The same kind of memory as the engine's large owned tensors (huge pages where granted).
    let mut store = powerinfer_core::PageBuf::zeroed(n * 8);
    let data = store.as_mut_words();
    // Write in parallel: the pages are mapped (not the shared zero page) and placed near the
    // threads that read them.
    data.par_chunks_mut(part).for_each(|c| {
        for (i, v) in c.iter_mut().enumerate() {
            *v = i as u64 | 1;
        }
    });
    let level = simd::level();
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        let sum = data
            .par_chunks(part)
            .map(|c| dispatch::read_sum(level, c))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (n * 8) as f64 / best / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_is_positive_and_finite() {
        let gbs = measure_read_bandwidth(1 << 20, 2);
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let gbs = pool.install(|| measure_read_bandwidth(3 << 20, 1));
        assert!(gbs.is_finite() && gbs > 0.0, "{gbs}");
    }

    #[test]
    fn read_sums_agree_on_every_level() {
        let data: Vec<u64> = (0..1003u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let want = data.iter().fold(0u64, |a, &v| a.wrapping_add(v));
        for level in crate::simd::available() {
            for len in [0, 1, 31, 32, 33, 1003] {
                let want = data[..len].iter().fold(0u64, |a, &v| a.wrapping_add(v));
                assert_eq!(
                    dispatch::read_sum(level, &data[..len]),
                    want,
                    "{level:?} {len}"
                );
            }
        }
        assert_eq!(crate::kernels::scalar::read_sum(&data), want);
    }
}
