//! Speculative verification's products: `matvec_tokens` over T tokens against T one-token
//! matvecs, on SmolLM2-135M's decode shapes in the formats of its Q4_1 file (Q4_1 layers, a
//! Q8_0 output head) and Q4_0. Throughput is weight bytes × tokens per second, so the two
//! rows of one shape compare directly: their ratio is the verification's saving per token.
//!
//! `RAYON_NUM_THREADS` sets the thread count; every call runs inside `pool.install`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use powerinfer_core::{Buffer, DType, Weight};
use std::hint::black_box;

/// (name, rows, cols): SmolLM2-135M's gate/up, down and output head.
const SHAPES: [(&str, usize, usize); 3] = [
    ("smol_up_1536x576", 1536, 576),
    ("smol_down_576x1536", 576, 1536),
    ("smol_head_49152x576", 49152, 576),
];

/// A weight of pseudo-random bytes that decode to finite values (block scales kept small).
fn weight(dtype: DType, rows: usize, cols: usize) -> Weight {
    let mut bytes = vec![0u8; rows * dtype.row_bytes(cols).unwrap()];
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for b in bytes.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
    for v in bytes.chunks_exact_mut(2) {
        v[1] &= 0x3F;
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}

fn bench_tokens(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().unwrap();
    let mut group = c.benchmark_group("tokens");
    group.sample_size(20);
    for (name, rows, cols) in SHAPES {
        for dtype in [DType::Q4_1, DType::Q4_0, DType::Q8_0] {
            let w = weight(dtype, rows, cols);
            for t in [1usize, 2, 4, 8] {
                let x: Vec<f32> = (0..t * cols).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
                let mut y = vec![0f32; t * rows];
                group.throughput(Throughput::Bytes((w.n_bytes() * t) as u64));
                let id = |how: &str| {
                    BenchmarkId::new(format!("{}/{how}", dtype.name()), format!("{name}/t{t}"))
                };
                group.bench_function(id("steps"), |b| {
                    pool.install(|| {
                        b.iter(|| {
                            for (xt, yt) in x.chunks_exact(cols).zip(y.chunks_exact_mut(rows)) {
                                powerinfer_cpu::matvec(black_box(&w), black_box(xt), yt).unwrap();
                            }
                        })
                    })
                });
                group.bench_function(id("tokens"), |b| {
                    pool.install(|| {
                        b.iter(|| {
                            let ys: &mut [&mut [f32]] = &mut [&mut y[..]];
                            powerinfer_cpu::matvec_tokens(&[black_box(&w)], black_box(&x), t, ys)
                                .unwrap()
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_tokens);
criterion_main!(benches);
