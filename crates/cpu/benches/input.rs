//! Input-sparse matvec (`matvec_input`, the `input` sparsity mode) against the dense matvec of
//! the same matrix, at 0/25/40/50% of the inputs skipped (a random subset), on a 2-thread pool
//! (`INPUT_THREADS` overrides). The shape is a bandwidth-bound projection of a 1B-class model,
//! `INPUT_SHAPE=ROWS,COLS` (default 5632,2048); several copies of it together exceed the
//! last-level cache, and each call takes the next, as a decode step does.
//!
//! Printed per format and share: the dense and sparse times (medians of alternating rounds), the
//! speed-up, and the ideal speed-up from bytes (the dense matrix's bytes over the bytes the
//! sparse call reads: every scale table plus the kept columns' lines), and the achieved share of
//! that ideal (`INPUT_WORKING_SET_MB` sets the copies' total size: small values keep them in
//! cache, to see the kernels' compute rate). No criterion runs: the alternating rounds are the measurement.

use powerinfer_core::{Buffer, DType, Weight};
use powerinfer_cpu::{matvec, matvec_input, ActiveInput, InputMajor};
use std::hint::black_box;
use std::time::Instant;

const WORKING_SET: usize = 512 << 20;
const ROUNDS: usize = 9;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A random weight of `dtype` (random bytes, finite small f16 scales).
fn weight(seed: u64, dtype: DType, rows: usize, cols: usize) -> Weight {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as u8
    };
    let row_bytes = dtype.row_bytes(cols).unwrap();
    let mut bytes: Vec<u8> = (0..rows * row_bytes).map(|_| next()).collect();
    let half = |v: f32| half::f16::from_f32(v).to_le_bytes();
    let fields: &[usize] = match dtype {
        DType::F16 => &[],
        _ => dtype.f16_fields(),
    };
    for block in bytes.chunks_exact_mut(dtype.block_bytes()) {
        for (k, &f) in fields.iter().enumerate() {
            block[f..f + 2].copy_from_slice(&half(if k == 0 { 0.01 } else { -0.05 }));
        }
        if dtype == DType::F16 {
            block.copy_from_slice(&half((block[0] as f32 - 128.0) / 256.0));
        }
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads: usize = env_or("INPUT_THREADS", 2);
    let calls: usize = env_or("INPUT_CALLS", 24);
    let rounds: usize = env_or("INPUT_ROUNDS", ROUNDS);
    let shape = std::env::var("INPUT_SHAPE").unwrap_or_else(|_| "5632,2048".into());
    let (rows, cols) = shape
        .split_once(',')
        .and_then(|(r, c)| Some((r.trim().parse().ok()?, c.trim().parse().ok()?)))
        .unwrap_or((5632, 2048));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    println!("input-sparse matvec, {rows} x {cols}, {threads} threads");
    println!("format  skip  dense_us  input_us  speed-up  ideal  share");
    for dtype in [DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::F16] {
        let one = dtype.row_bytes(cols).unwrap() * rows;
        let ws_bytes: usize = env_or("INPUT_WORKING_SET_MB", WORKING_SET >> 20) << 20;
        let layers = (ws_bytes / one).max(2);
        let ws: Vec<Weight> = (0..layers)
            .map(|l| weight(l as u64 + 1, dtype, rows, cols))
            .collect();
        let ms: Vec<InputMajor> = ws.iter().map(|w| InputMajor::new(w).unwrap()).collect();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        for skip in [0.0f64, 0.25, 0.40, 0.50] {
            // A random subset of the inputs, a different one per call.
            let masks: Vec<Vec<bool>> = (0..13u64)
                .map(|k| {
                    (0..cols as u64)
                        .map(|i| {
                            let h = (i ^ (k << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                            (h as f64 / (1u64 << 24) as f64) >= skip
                        })
                        .collect()
                })
                .collect();
            let acts: Vec<ActiveInput> = masks
                .iter()
                .map(|m| ActiveInput::new(&x, ms[0].group_len(), |i, _| m[i]))
                .collect();
            let mut y = vec![0.0f32; rows];
            let (mut dense, mut sparse) = (Vec::new(), Vec::new());
            let mut call = 0usize;
            pool.install(|| {
                for _ in 0..rounds {
                    let t = Instant::now();
                    for _ in 0..calls {
                        call += 1;
                        let xm: Vec<f32> = x
                            .iter()
                            .zip(&masks[call % masks.len()])
                            .map(|(&v, &k)| if k { v } else { 0.0 })
                            .collect();
                        matvec(&ws[call % layers], black_box(&xm), &mut y).unwrap();
                    }
                    dense.push(t.elapsed().as_secs_f64() / calls as f64);
                    let t = Instant::now();
                    for _ in 0..calls {
                        call += 1;
                        let a = &acts[call % acts.len()];
                        matvec_input(&[&ms[call % layers]], &[a], &mut [&mut y]).unwrap();
                    }
                    sparse.push(t.elapsed().as_secs_f64() / calls as f64);
                }
            });
            black_box(&y);
            let (d, s) = (median(dense), median(sparse));
            let kept = acts.iter().map(|a| a.kept()).sum::<usize>() as f64 / acts.len() as f64;
            let read = ms[0].bytes_read(kept / cols as f64);
            let ideal = one as f64 / read;
            println!(
                "{:<6} {:>5.2} {:>9.1} {:>9.1} {:>9.2} {:>6.2} {:>5.0}%",
                dtype.name(),
                skip,
                d * 1e6,
                s * 1e6,
                d / s,
                ideal,
                100.0 * (d / s) / ideal
            );
        }
    }
}
