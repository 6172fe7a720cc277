//! Matvec and matmul throughput over every weight format, on the shapes of the models we run.
//! Matvec reports bytes of weights read per second (compare with `measure_read_bandwidth`,
//! printed first); matmul reports multiply-adds ×2 (flops) per second.
//!
//! `RAYON_NUM_THREADS` sets the thread count. Every call runs inside `pool.install`, as in the
//! engine: called from outside a pool, rayon adds a cross-thread wake-up (~10 µs) to each call.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use powerinfer_core::{Buffer, DType, Weight};
use std::hint::black_box;

/// (name, rows, cols): Llama-7B-ish and SmolLM2-135M decode shapes.
const MATVEC_SHAPES: [(&str, usize, usize); 7] = [
    ("4096x4096", 4096, 4096),
    ("ffn_up_5504x2048", 5504, 2048),
    ("ffn_down_2048x5504", 2048, 5504),
    ("ffn_down_2048x5632", 2048, 5632),
    ("smol_up_1536x576", 1536, 576),
    ("smol_down_576x1536", 576, 1536),
    ("smol_head_49152x576", 49152, 576),
];

/// (name, rows, cols, tokens) for matmul: short prompts, and a 512-token prefill of the
/// synthetic dim-2048 llama's attention and FFN shapes (ffn_down's 5504 columns are whole
/// 32-weight blocks only).
const MATMUL_SHAPES: [(&str, usize, usize, usize); 5] = [
    ("2048x2048_n64", 2048, 2048, 64),
    ("smol_up_1536x576_n64", 1536, 576, 64),
    ("prefill_2048x2048_n512", 2048, 2048, 512),
    ("prefill_up_5504x2048_n512", 5504, 2048, 512),
    ("prefill_down_2048x5504_n512", 2048, 5504, 512),
];

/// A weight of pseudo-random bytes that decode to finite values in every format.
fn weight(dtype: DType, rows: usize, cols: usize) -> Weight {
    let row_bytes = dtype.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rows * row_bytes];
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for b in bytes.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
    // Keep every 2-byte value (f16/bf16 values and block scales) small and finite by clearing
    // the top exponent bits of each high byte; f32 values likewise.
    let step = if dtype == DType::F32 { 4 } else { 2 };
    for v in bytes.chunks_exact_mut(step) {
        v[step - 1] &= 0x3F;
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}

/// The pool the benches run in (size from `RAYON_NUM_THREADS`, else one per core).
fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().build().unwrap()
}

fn bench_matvec(c: &mut Criterion) {
    let pool = pool();
    let gbs = pool.install(|| powerinfer_cpu::measure_read_bandwidth(1 << 30, 5));
    eprintln!(
        "simd {} threads {} read bandwidth {gbs:.1} GB/s",
        powerinfer_cpu::simd_level(),
        pool.current_num_threads()
    );
    let mut group = c.benchmark_group("matvec");
    for (name, rows, cols) in MATVEC_SHAPES {
        // K-quants only on shapes of whole super-blocks.
        for dtype in DType::ALL.into_iter().filter(|d| d.row_bytes(cols).is_ok()) {
            let w = weight(dtype, rows, cols);
            let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
            let mut y = vec![0f32; rows];
            group.throughput(Throughput::Bytes(w.n_bytes() as u64));
            group.bench_function(BenchmarkId::new(dtype.name(), name), |b| {
                pool.install(|| {
                    b.iter(|| powerinfer_cpu::matvec(black_box(&w), black_box(&x), &mut y).unwrap())
                })
            });
        }
    }
    group.finish();
}

fn bench_matmul(c: &mut Criterion) {
    let pool = pool();
    let mut group = c.benchmark_group("matmul");
    // The prefill shapes take ~10-100 ms a call.
    group.sample_size(10);
    for (name, rows, cols, n) in MATMUL_SHAPES {
        for dtype in DType::ALL.into_iter().filter(|d| d.row_bytes(cols).is_ok()) {
            let w = weight(dtype, rows, cols);
            let x: Vec<f32> = (0..n * cols).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
            let mut y = vec![0f32; n * rows];
            group.throughput(Throughput::Elements(2 * (rows * cols * n) as u64));
            group.bench_function(BenchmarkId::new(dtype.name(), name), |b| {
                pool.install(|| {
                    b.iter(|| {
                        powerinfer_cpu::matmul(black_box(&w), black_box(&x), n, &mut y).unwrap()
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matvec, bench_matmul);
criterion_main!(benches);
