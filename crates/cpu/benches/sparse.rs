//! Sparse FFN kernels over every weight format at dim 2048 / ffn 5504 (`SPARSE_SHAPE=DIM,FFN`
//! overrides) with 10% of the neurons
//! active (a random sorted subset), on a 2-thread pool. Throughput is the bytes of the active
//! rows each call reads (up, down_t and gate rows as the kernel touches them), in decimal GB/s,
//! so it compares directly with `measure_read_bandwidth`, measured in the same run.
//!
//! Dense baselines run on the same memory: `dense_up` and `dense_down` (the dense products a
//! row-sparse matvec and an axpy replace, every row read), and `dense_ffn` (dense decode's FFN:
//! gate and up in one parallel matvec, act·up, the dense down product) against
//! `threshold_steps` (threshold mode's decode FFN: the same gate and up products, then an axpy
//! over the down_t rows of the neurons whose |act(gate)·up| passes a threshold set to keep the
//! active share). Their throughput counts every byte they read, so times compare directly.
//!
//! The data is kept out of the last-level cache, as in a real decode step: each call takes the
//! next of several layers (together >= 256 MB) and the next of several random active sets. The
//! weights live in owned buffers, on transparent huge pages where the OS grants them, as the
//! engine's repacked tensors do. A summary table (median GB/s and share of the read bandwidth per
//! kernel and format, each kernel timed in rounds alternating with the bandwidth probe) is
//! printed before the criterion runs. `SPARSE_THREADS` overrides the thread count,
//! `SPARSE_ACTIVE` the share of neurons active; `SPARSE_FILTER` keeps only the
//! \"kernel/FORMAT\" names containing it (summary and criterion alike).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use powerinfer_core::{Activation, DType, PageBuf, Weight};
use std::hint::black_box;
use std::time::Instant;

/// Default shape (`SPARSE_SHAPE=DIM,FFN` overrides it).
const SHAPE: (usize, usize) = (2048, 5504);

/// The benchmarked (dim, ffn).
fn shape() -> (usize, usize) {
    let parsed = std::env::var("SPARSE_SHAPE").ok().and_then(|v| {
        let (d, f) = v.split_once(',')?;
        Some((d.trim().parse().ok()?, f.trim().parse().ok()?))
    });
    parsed.unwrap_or(SHAPE)
}
/// Share of the neurons active per call.
const ACTIVE: f64 = 0.10;
/// Layers are allocated until the weights of one format reach this many bytes (>> L3).
const WORKING_SET: usize = 1 << 30;
/// Distinct random active sets cycled through.
const SETS: usize = 13;
/// Rounds of the summary (each: the read bandwidth, then [`CALLS_PER_ROUND`] calls).
const ROUNDS: usize = 9;
/// Kernel calls timed per summary round.
const CALLS_PER_ROUND: usize = 40;
/// Formats benchmarked (the K-quants only where dim and ffn are whole super-blocks, e.g.
/// `SPARSE_SHAPE=2048,5632`).
const FORMATS: [DType; 10] = [
    DType::F16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q4_K,
    DType::Q6_K,
    DType::BF16,
    DType::F32,
    DType::Q5_K,
];

/// The kernels, by name: the sparse ones, exact-relu's FFN (separate passes, and fused in one
/// region: [`powerinfer_cpu::sparse_ffn`]) and threshold mode's FFN, then the dense products they
/// replace (over the same
/// layers' bytes, so each sparse kernel's time compares with the dense product's).
/// `listed_fused` is predictor mode's FFN: the fused pass over the gate, up and down_t rows of
/// the listed (predicted) neurons alone, every one of them firing (a predictor of precision 1).
const KERNELS: [&str; 9] = [
    "matvec_rows",
    "axpy_rows",
    "relu_steps",
    "relu_fused",
    "listed_fused",
    "threshold_steps",
    "dense_up",
    "dense_down",
    "dense_ffn",
];

/// A weight of pseudo-random bytes that decode to finite values in every format.
fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    powerinfer_cpu::pseudo_random_weight(dtype, rows, cols, seed).unwrap()
}

/// One FFN layer in the sparse layout: gate and up as rows, down transposed; `down` is down_t's
/// bytes read as a [dim, ffn] matrix (same bytes, the dense down product's shape).
struct Layer {
    gate: Weight,
    up: Weight,
    down_t: Weight,
    down: Weight,
}

/// Enough layers of `dtype` that their weights exceed [`WORKING_SET`], all in one allocation
/// (as the engine keeps its repacked tensors), so large enough for huge pages whatever the shape.
fn layers(dtype: DType) -> Vec<Layer> {
    let (dim, ffn) = shape();
    let matrix = ffn * dtype.row_bytes(dim).unwrap();
    let n = WORKING_SET.div_ceil(3 * matrix);
    let mut store = PageBuf::zeroed(3 * n * matrix);
    for (k, chunk) in store.as_mut_slice().chunks_mut(matrix).enumerate() {
        chunk.copy_from_slice(weight(dtype, ffn, dim, k as u64).bytes());
    }
    let store = store.freeze();
    let part = |k: usize, (rows, cols): (usize, usize)| {
        let bytes = store.slice(k * matrix..(k + 1) * matrix).unwrap();
        Weight::new(dtype, rows, cols, bytes).unwrap()
    };
    (0..n)
        .map(|l| Layer {
            gate: part(3 * l, (ffn, dim)),
            up: part(3 * l + 1, (ffn, dim)),
            down_t: part(3 * l + 2, (ffn, dim)),
            // Equal byte counts whenever dim and ffn are whole blocks (both multiples of 32).
            down: part(3 * l + 2, (dim, ffn)),
        })
        .collect()
}

/// [`SETS`] random sorted active sets of exactly ACTIVE · FFN neurons (`SPARSE_ACTIVE` overrides
/// the share).
fn active_sets() -> Vec<Vec<u32>> {
    let active = std::env::var("SPARSE_ACTIVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ACTIVE);
    let ffn = shape().1;
    let n = (ffn as f64 * active).round() as usize;
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    (0..SETS)
        .map(|_| {
            let mut all: Vec<u32> = (0..ffn as u32).collect();
            for i in 0..n {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let j = i + (s % (ffn - i) as u64) as usize;
                all.swap(i, j);
            }
            let mut set = all[..n].to_vec();
            set.sort_unstable();
            set
        })
        .collect()
}

/// Inputs and outputs of one kernel call.
struct Bufs {
    x: Vec<f32>,
    g: Vec<f32>,
    y: Vec<f32>,
    yk: Vec<f32>,
    /// Second ffn-long output (the up product of the dense FFN).
    yu: Vec<f32>,
    /// Threshold on |act(gate)·up| that keeps about the active share of neurons.
    t: f32,
    /// Kept neurons and their values (threshold_steps).
    idx: Vec<u32>,
    vals: Vec<f32>,
    /// Per active set, which neurons it holds (the exact-relu kernels fire exactly those).
    masks: Vec<Vec<bool>>,
    /// The active set of this call.
    set: usize,
}

/// Run `kernel` once on `layer` and `idx`.
fn call(kernel: &str, layer: &Layer, idx: &[u32], b: &mut Bufs) {
    let n = idx.len();
    match kernel {
        "matvec_rows" => powerinfer_cpu::matvec_rows(&layer.up, &b.x, idx, &mut b.yk[..n]),
        "axpy_rows" => powerinfer_cpu::axpy_rows(&layer.down_t, idx, &b.g[..n], &mut b.y),
        "relu_steps" => relu_steps(layer, b),
        "relu_fused" => relu_fused(layer, b),
        "listed_fused" => listed_fused(layer, idx, b),
        "threshold_steps" => threshold_steps(layer, b),
        "dense_ffn" => dense_ffn(layer, b),
        "dense_up" => powerinfer_cpu::matvec(&layer.up, &b.x, &mut b.yk),
        "dense_down" => powerinfer_cpu::matvec(&layer.down, &b.g, &mut b.y),
        _ => unreachable!("{kernel}"),
    }
    .unwrap();
    black_box(&b.y);
}

/// The dense gate and up products in one parallel matvec, then h = act(gate)·up into `b.yk`
/// in one whole-vector pass, as the engine's decode does.
fn gate_up(layer: &Layer, b: &mut Bufs) -> powerinfer_core::Result<()> {
    powerinfer_cpu::matvec_many(&[&layer.gate, &layer.up], &b.x, &mut [&mut b.yk, &mut b.yu])?;
    for (h, u) in b.yk.iter_mut().zip(&b.yu) {
        *h = Activation::Silu.apply(*h) * u;
    }
    Ok(())
}

/// The dense FFN of one token as the engine's dense decode computes it: [`gate_up`], then the
/// dense down product.
fn dense_ffn(layer: &Layer, b: &mut Bufs) -> powerinfer_core::Result<()> {
    gate_up(layer, b)?;
    powerinfer_cpu::matvec(&layer.down, &b.yk, &mut b.y)
}

/// Threshold mode's FFN in separate steps: [`gate_up`], the kept neurons compacted
/// (branch-free, as the engine does it), then an axpy over their down_t rows.
fn threshold_steps(layer: &Layer, b: &mut Bufs) -> powerinfer_core::Result<()> {
    gate_up(layer, b)?;
    powerinfer_cpu::compact_kept(&b.yk, b.t, &mut b.idx, &mut b.vals);
    b.y.fill(0.0);
    powerinfer_cpu::axpy_rows(&layer.down_t, &b.idx, &b.vals, &mut b.y)
}

/// Exact-relu's FFN as separate passes (the engine's decode before the fused op): the dense
/// gate product, the neurons of the call's active set compacted, their up rows, then an axpy
/// over their down_t rows.
fn relu_steps(layer: &Layer, b: &mut Bufs) -> powerinfer_core::Result<()> {
    powerinfer_cpu::matvec(&layer.gate, &b.x, &mut b.yk)?;
    let mask = &b.masks[b.set];
    b.idx.clear();
    b.vals.clear();
    for (i, (&g, &on)) in b.yk.iter().zip(mask).enumerate() {
        if on {
            b.idx.push(i as u32);
            b.vals.push(g);
        }
    }
    let n = b.idx.len();
    powerinfer_cpu::matvec_rows(&layer.up, &b.x, &b.idx, &mut b.yu[..n])?;
    b.vals.iter_mut().zip(&b.yu).for_each(|(v, u)| *v *= u);
    b.y.fill(0.0);
    powerinfer_cpu::axpy_rows(&layer.down_t, &b.idx, &b.vals, &mut b.y)
}

/// [`relu_steps`] in one parallel region ([`powerinfer_cpu::sparse_ffn`]).
fn relu_fused(layer: &Layer, b: &mut Bufs) -> powerinfer_core::Result<()> {
    fused(layer, powerinfer_cpu::GateRows::All, b)
}

/// Predictor mode's fused FFN over the listed neurons `idx` (all of which fire).
fn listed_fused(layer: &Layer, idx: &[u32], b: &mut Bufs) -> powerinfer_core::Result<()> {
    fused(layer, powerinfer_cpu::GateRows::Listed(idx), b)
}

/// The fused FFN over `rows`' gate rows, the set's neurons firing.
fn fused(
    layer: &Layer,
    rows: powerinfer_cpu::GateRows<'_>,
    b: &mut Bufs,
) -> powerinfer_core::Result<()> {
    let ffn = powerinfer_cpu::SparseFfn {
        gate: &layer.gate,
        up: Some(&layer.up),
        down_t: &layer.down_t,
    };
    let mask = &b.masks[b.set];
    let fire = |i: u32, g: f32| if mask[i as usize] { g } else { 0.0 };
    powerinfer_cpu::sparse_ffn(&ffn, &b.x, rows, fire, |a, u| a * u, &mut b.y).map(|_| ())
}

/// The threshold on |act(gate)·up| that keeps the `n` largest of one layer's values.
fn threshold_for(layer: &Layer, b: &mut Bufs, n: usize) -> f32 {
    gate_up(layer, b).unwrap();
    let mut h: Vec<f32> = b.yk.iter().map(|h| h.abs()).collect();
    h.sort_by(|a, b| b.total_cmp(a));
    h[n.clamp(1, h.len()) - 1]
}

/// Bytes of active rows one call of `kernel` reads (every row for the dense products).
fn active_bytes(kernel: &str, dtype: DType, n: usize) -> u64 {
    let ffn = shape().1;
    let rows = match kernel {
        "matvec_rows" | "axpy_rows" => n,
        "dense_up" | "dense_down" => ffn,
        "threshold_steps" => 2 * ffn + n,
        "relu_steps" | "relu_fused" => ffn + 2 * n,
        "listed_fused" => 3 * n,
        "dense_ffn" => 3 * ffn,
        _ => unreachable!("{kernel}"),
    };
    (rows * dtype.row_bytes(shape().0).unwrap()) as u64
}

/// The median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bufs(sets: &[Vec<u32>]) -> Bufs {
    let (dim, ffn) = shape();
    let mask = |set: &Vec<u32>| {
        let mut m = vec![false; ffn];
        set.iter().for_each(|&i| m[i as usize] = true);
        m
    };
    Bufs {
        x: (0..dim).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect(),
        g: (0..ffn).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect(),
        y: vec![0.0; dim],
        yk: vec![0.0; ffn],
        yu: vec![0.0; ffn],
        t: 0.0,
        idx: Vec::with_capacity(ffn),
        vals: Vec::with_capacity(ffn),
        masks: sets.iter().map(mask).collect(),
        set: 0,
    }
}

fn pool() -> rayon::ThreadPool {
    let threads = std::env::var("SPARSE_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

fn bench_sparse(c: &mut Criterion) {
    let pool = pool();
    let bw = pool.install(|| powerinfer_cpu::measure_read_bandwidth(256 << 20, 5));
    let sets = active_sets();
    let n = sets[0].len();
    eprintln!(
        "sparse: simd {} threads {} read bandwidth {bw:.1} GB/s; dim {} ffn {}, {n} active",
        powerinfer_cpu::simd_level(),
        pool.current_num_threads(),
        shape().0,
        shape().1
    );
    let mut group = c.benchmark_group("sparse");
    group
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    let filter = std::env::var("SPARSE_FILTER").unwrap_or_default();
    let wanted = |kernel: &str, dtype: DType| format!("{kernel}/{dtype}").contains(&filter);
    let (dim, ffn) = shape();
    for dtype in FORMATS {
        let fits = dtype.row_bytes(dim).is_ok() && dtype.row_bytes(ffn).is_ok();
        if !fits || !KERNELS.iter().any(|k| wanted(k, dtype)) {
            continue;
        }
        let layers = layers(dtype);
        let mut b = bufs(&sets);
        // Random weights: every layer's |h| has about the same distribution as the first's.
        b.t = threshold_for(&layers[0], &mut b, n);
        for kernel in KERNELS.into_iter().filter(|k| wanted(k, dtype)) {
            let bytes = active_bytes(kernel, dtype, n);
            let mut it = 0usize;
            let mut step = |b: &mut Bufs| {
                b.set = it % SETS;
                call(kernel, &layers[it % layers.len()], &sets[it % SETS], b);
                it += 1;
            };
            // Summary: rounds of (read bandwidth, then calls of the kernel), so each kernel time
            // is compared with the bandwidth of the same moment (the machine may be shared and
            // its bandwidth drifts); the median over rounds of each.
            let mut shares = Vec::with_capacity(ROUNDS);
            let mut gbs_all = Vec::with_capacity(ROUNDS);
            let mut bws = Vec::with_capacity(ROUNDS);
            for _ in 0..ROUNDS {
                let bw = pool.install(|| powerinfer_cpu::measure_read_bandwidth(128 << 20, 2));
                let mut times: Vec<f64> = pool.install(|| {
                    (0..CALLS_PER_ROUND)
                        .map(|_| {
                            let t = Instant::now();
                            step(&mut b);
                            t.elapsed().as_secs_f64()
                        })
                        .collect()
                });
                let gbs = bytes as f64 / median(&mut times) / 1e9;
                shares.push(gbs / bw);
                gbs_all.push(gbs);
                bws.push(bw);
            }
            let gbs = median(&mut gbs_all);
            eprintln!(
                "sparse summary: {kernel:>16} {:>5} {:>6.2} MB/call {:>6.1} µs {gbs:>6.1} GB/s \
                 = {:>5.1}% of read bandwidth {:.1} GB/s (medians of {ROUNDS} rounds)",
                dtype.name(),
                bytes as f64 / 1e6,
                bytes as f64 / gbs / 1e3,
                100.0 * median(&mut shares),
                median(&mut bws)
            );
            group.throughput(Throughput::BytesDecimal(bytes));
            group.bench_function(BenchmarkId::new(kernel, dtype.name()), |bch| {
                pool.install(|| bch.iter(|| step(&mut b)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_sparse);
criterion_main!(benches);
