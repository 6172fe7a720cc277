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

/// A `rows` x `cols` weight of `dtype` whose bytes are pseudo-random (xorshift from `seed`) and
/// decode to small finite values in every format: the top exponent bits of every 2-byte value's
/// high byte are cleared (f16/bf16 weights and block scales; f32 values too). For probes and
/// benchmarks.
pub fn pseudo_random_weight(
    dtype: powerinfer_core::DType,
    rows: usize,
    cols: usize,
    seed: u64,
) -> powerinfer_core::Result<powerinfer_core::Weight> {
    let mut bytes = vec![0u8; rows * dtype.row_bytes(cols)?];
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for chunk in bytes.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = (s & 0x3FFF_3FFF_3FFF_3FFF).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let data = powerinfer_core::Buffer::from_bytes(&bytes);
    powerinfer_core::Weight::new(dtype, rows, cols, data)
}

/// The rate, in GB/s of weight bytes, at which the current pool runs a matvec over weights of
/// `dtype` (4096 columns of pseudo-random finite values, `bytes` of them at least, so well out
/// of cache), the best of `iters` passes. Where decoding a format costs more than reading it
/// (Q4_0 on two cores: about half the read bandwidth) this, not [`measure_read_bandwidth`], is
/// what the CPU side of a plan reaches.
pub fn measure_format_bandwidth(
    dtype: powerinfer_core::DType,
    bytes: usize,
    iters: usize,
) -> powerinfer_core::Result<f64> {
    const COLS: usize = 4096;
    let rows = bytes.div_ceil(dtype.row_bytes(COLS)?).max(64);
    let w = pseudo_random_weight(dtype, rows, COLS, 0)?;
    let x: Vec<f32> = (0..COLS).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let mut y = vec![0.0f32; rows];
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        let start = Instant::now();
        crate::matvec(&w, &x, &mut y)?;
        std::hint::black_box(&y);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(w.data.len() as f64 / best / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_rates_are_positive_and_finite() {
        for dtype in [powerinfer_core::DType::F16, powerinfer_core::DType::Q4_0] {
            let gbs = measure_format_bandwidth(dtype, 1 << 20, 1).unwrap();
            assert!(gbs.is_finite() && gbs > 0.0, "{dtype:?} {gbs}");
        }
    }

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
