//! One decode head's attention at long context: the f32 cache (`attend_head`, what an f16 KV
//! cache computes over) against the quantized caches (`attend_head_kv`, q8_0 and q4_0 on both
//! sides, and q8_0 on one side), head_dim 64 as SmolLM2's and Llama's small models, 4,096 cached positions. The
//! throughput is the cache bytes each reads per second, so the rows compare as bytes and as time.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use powerinfer_core::quantize::quantize_row;
use powerinfer_core::DType;
use powerinfer_cpu::{
    attend_head, attend_head_kv, HeadCache, KvHeadCache, KvRows, KvScratch, SoftmaxExtras,
};
use std::hint::black_box;

const HD: usize = 64;
const N_POS: usize = 4096;

/// Pseudo-random values in (−1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `rows` quantized to `dtype`, one row of `HD` values per position (none for f32).
fn blocks(dtype: DType, rows: &[f32]) -> Vec<u8> {
    if dtype == DType::F32 {
        return Vec::new();
    }
    let per = dtype.row_bytes(HD).unwrap();
    let mut out = vec![0u8; rows.len() / HD * per];
    for (r, o) in rows.chunks_exact(HD).zip(out.chunks_exact_mut(per)) {
        quantize_row(dtype, r, o).unwrap();
    }
    out
}

fn bench(c: &mut Criterion) {
    let (k, v, q) = (
        values(N_POS * HD, 7),
        values(N_POS * HD, 11),
        values(HD, 13),
    );
    let mut g = c.benchmark_group("attend_4096x64");
    g.throughput(Throughput::Bytes((2 * N_POS * HD * 4) as u64));
    let (mut scores, mut out) = (Vec::new(), vec![0f32; HD]);
    let f32_cache = HeadCache {
        keys: &k,
        values: &v,
        stride: HD,
    };
    g.bench_function(BenchmarkId::new("f32", N_POS), |b| {
        b.iter(|| {
            attend_head(
                &q,
                f32_cache,
                N_POS,
                0.125,
                None,
                &mut scores,
                black_box(&mut out),
            )
        })
    });
    let pairs = [
        (DType::Q8_0, DType::Q8_0),
        (DType::Q4_0, DType::Q4_0),
        (DType::Q8_0, DType::F32),
        (DType::F32, DType::Q8_0),
    ];
    for (kt, vt) in pairs {
        let (kb, vb) = (blocks(kt, &k), blocks(vt, &v));
        let side = |dtype: DType, b: &'static [u8], f: &'static [f32]| match dtype {
            DType::F32 => KvRows::F32(f),
            _ => KvRows::Blocks(dtype, b),
        };
        let (kb, vb): (&'static [u8], &'static [u8]) = (kb.leak(), vb.leak());
        let (kf, vf): (&'static [f32], &'static [f32]) = (k.clone().leak(), v.clone().leak());
        let cache = KvHeadCache {
            keys: side(kt, kb, kf),
            values: side(vt, vb, vf),
            stride: HD,
        };
        let bytes = |dtype: DType, b: &[u8]| {
            if dtype == DType::F32 {
                N_POS * HD * 4
            } else {
                b.len()
            }
        };
        let mut scratch = KvScratch::default();
        g.throughput(Throughput::Bytes((bytes(kt, kb) + bytes(vt, vb)) as u64));
        g.bench_function(BenchmarkId::new(format!("{kt}/{vt}"), N_POS), |b| {
            b.iter(|| {
                attend_head_kv(
                    &q,
                    cache,
                    N_POS,
                    0.125,
                    SoftmaxExtras::default(),
                    &mut scratch,
                    black_box(&mut out),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
