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

/// The last-level cache's size in bytes as Linux reports it (the largest cache of cpu0), or
/// 64 MiB where it says nothing. Server parts hold hundreds of MiB (480 MiB seen on a 2-core
/// VM): a probe whose pass fits in it measures the cache, not memory.
fn last_level_cache_bytes() -> usize {
    let parse = |t: &str| {
        let t = t.trim();
        let (num, mul) = match t.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match t.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (t, 1),
            },
        };
        num.parse::<usize>().ok().map(|n| n * mul)
    };
    (0..8)
        .filter_map(|i| {
            let f = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
            std::fs::read_to_string(f).ok().and_then(|t| parse(&t))
        })
        .max()
        .unwrap_or(64 << 20)
}

/// A buffer twice the last-level cache, read between a probe's passes ([`Evict::run`]) so each
/// pass starts from memory, as a decode step over a model far larger than the cache does.
struct Evict(powerinfer_core::PageBuf);

impl Evict {
    fn new() -> Evict {
        let n = 2 * last_level_cache_bytes() / 8;
        let mut buf = powerinfer_core::PageBuf::zeroed(n * 8);
        // Written, so its pages are real (not the shared zero page).
        buf.as_mut_words().par_chunks_mut(1 << 16).for_each(|c| {
            for (i, v) in c.iter_mut().enumerate() {
                *v = i as u64 | 1;
            }
        });
        Evict(buf)
    }

    fn run(&mut self) {
        let words: &[u64] = self.0.as_mut_words();
        let sum = words
            .par_chunks(1 << 16)
            .map(|c| dispatch::read_sum(simd::level(), c))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
    }
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
/// of cache; each pass after reading a buffer twice the last-level cache), the best of `iters`
/// passes. Where decoding a format costs more than reading it
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
    let n_bytes = w.data.len();
    // The layout the engine's dense products read (rows interleaved at load where the format
    // has that layout), so the rate is the one attention and dense FFNs reach.
    let m = crate::Matrix::for_products(w)?;
    let x = probe_x(COLS);
    let mut y = vec![0.0f32; rows];
    let mut evict = Evict::new();
    let mut best = f64::INFINITY;
    for _ in 0..iters.max(1) {
        evict.run();
        let start = Instant::now();
        crate::matvec(m.view(), &x, &mut y)?;
        std::hint::black_box(&y);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(n_bytes as f64 / best / 1e9)
}

/// A probe's input vector: small values, no zeros that a kernel could skip.
fn probe_x(cols: usize) -> Vec<f32> {
    (0..cols).map(|i| ((i % 7) as f32 - 3.5) * 0.25).collect()
}

/// Whether neuron `i` is in a probe's pseudo-random subset of about `share` of the neurons.
fn in_share(i: u32, salt: u64, share: f64) -> bool {
    let mut s = (u64::from(i) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
    s ^= s >> 31;
    s = s.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    s ^= s >> 29;
    (s >> 11) as f64 / (1u64 << 53) as f64 <= share
}

/// The rate, in GB/s of weight bytes read, of the engine's sparse FFN ([`crate::sparse_ffn`],
/// rows by index) on a gated FFN of `dtype` (gate, up and down_t of `dim` 4096 columns, with
/// as many neurons as fit in `bytes`): `listed` of the neurons' gate rows are read (a
/// pseudo-random subset, in order), and `fire` of those fire, so their up and down_t rows are
/// read too. The best of `iters` passes, each after reading a buffer twice the last-level
/// cache (a pass over a 10% subset would otherwise run from cache). `listed` 1 and `fire` near 0 is exact-relu's gate pass
/// (every gate row streamed); `fire` 1 is predictor mode's scattered rows. This, not the dense
/// rate, is what a plan's cold neurons cost on the CPU.
pub fn measure_rows_bandwidth(
    dtype: powerinfer_core::DType,
    bytes: usize,
    listed: f64,
    fire: f64,
    iters: usize,
) -> powerinfer_core::Result<f64> {
    const DIM: usize = 4096;
    let neurons = bytes.div_ceil(3 * dtype.row_bytes(DIM)?).max(64);
    let gate = pseudo_random_weight(dtype, neurons, DIM, 1)?;
    let up = pseudo_random_weight(dtype, neurons, DIM, 2)?;
    let down_t = pseudo_random_weight(dtype, neurons, DIM, 3)?;
    let ids: Vec<u32> = (0..neurons as u32)
        .filter(|&i| in_share(i, 1, listed))
        .collect();
    let fires: Vec<bool> = (0..neurons as u32).map(|i| in_share(i, 2, fire)).collect();
    let x = probe_x(DIM);
    let mut y = vec![0.0f32; DIM];
    let ffn = crate::SparseFfn {
        gate: &gate,
        up: Some(&up),
        down_t: &down_t,
    };
    let row = dtype.row_bytes(DIM)?;
    let mut evict = Evict::new();
    let mut best = f64::INFINITY;
    let mut fired = 0;
    for _ in 0..iters.max(1) {
        evict.run();
        let start = Instant::now();
        fired = crate::sparse_ffn(
            &ffn,
            &x,
            crate::GateRows::Listed(&ids),
            |i, g| {
                if fires[i as usize] {
                    g.abs() + 1.0
                } else {
                    0.0
                }
            },
            |a, u| a * u,
            &mut y,
        )?;
        std::hint::black_box(&y);
        best = best.min(start.elapsed().as_secs_f64());
    }
    let read = ids.len() * row + fired * 2 * row;
    Ok(read as f64 / best / 1e9)
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
    fn rows_rates_are_positive_and_finite() {
        for (listed, fire) in [(1.0, 0.01), (0.1, 1.0)] {
            let gbs =
                measure_rows_bandwidth(powerinfer_core::DType::Q4_0, 1 << 20, listed, fire, 1)
                    .unwrap();
            assert!(gbs.is_finite() && gbs > 0.0, "{listed} {fire} {gbs}");
        }
        assert!(
            (0..1000)
                .filter(|&i| in_share(i, 5, 0.1))
                .count()
                .abs_diff(100)
                < 40
        );
        assert!(last_level_cache_bytes() >= 1 << 10);
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
