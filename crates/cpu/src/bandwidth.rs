//! A quick read-bandwidth probe, so benchmarks can report kernels as a fraction of what the
//! memory system delivers.

use rayon::prelude::*;
use std::time::Instant;

/// Read bandwidth in GB/s (10^9 bytes/s) on the current rayon pool: sums `bytes` bytes
/// (allocated and touched first) `iters` times and returns the best pass.
pub fn measure_read_bandwidth(bytes: usize, iters: usize) -> f64 {
    let n = (bytes / 8).max(1024);
    let data: Vec<u64> = (0..n as u64).collect();
    let per_task = n.div_ceil(rayon::current_num_threads() * 4).max(4096);
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        let sum: u64 = data
            .par_chunks(per_task)
            .map(|c| {
                // Four independent chains keep the adds from limiting the loads.
                let mut acc = [0u64; 4];
                for q in c.chunks_exact(4) {
                    for k in 0..4 {
                        acc[k] = acc[k].wrapping_add(q[k]);
                    }
                }
                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
            })
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
    fn bandwidth_is_positive() {
        let gbs = measure_read_bandwidth(1 << 20, 2);
        assert!(gbs.is_finite() && gbs > 0.0);
    }
}
