//! Matvec time of a few formats side by side, alternating in one run: for each format eight
//! matrices of pseudo-random blocks (rows x cols, 5504 x 2048 unless given) per pass, best of
//! `passes`, in nanoseconds per 32-weight block per thread and GB/s of weights read, then the
//! read probe on the same pool. On one thread it also gives the best pass in the thread's own
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`), which a shared machine's other work disturbs less. For comparing kernel variants of one format family on one
//! matrix shape (the low-bit formats NVFP4, Q1_0 and Q2_0 by default). A name ending in `/i`
//! takes the format's interleaved layout ([`powerinfer_cpu::Interleaved`]), as the engine's
//! whole-matrix products do where the format has one.
//!
//! ```text
//! cargo run --profile bench -p powerinfer-cpu --example format_matvec -- 1
//! cargo run --profile bench -p powerinfer-cpu --example format_matvec -- 2 Q1_0,Q4_0 2048 5504
//! cargo run --profile bench -p powerinfer-cpu --example format_matvec -- 1 Q6_K/i 32000 2048
//! ```

#[path = "common/random_weight.rs"]
mod random_weight;

use powerinfer_core::{DType, Weight};
use powerinfer_cpu::Interleaved;
use random_weight::weight;
use std::time::Instant;

/// `struct timespec` on x86-64 Linux.
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    /// libc's `clock_gettime` (std links libc).
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Nanoseconds this thread has run on a CPU (`CLOCK_THREAD_CPUTIME_ID`; 0 if refused).
fn cpu_ns() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock 3 is CLOCK_THREAD_CPUTIME_ID; `ts` is a valid timespec to write.
    match unsafe { clock_gettime(3, &mut ts) } {
        0 => ts.sec as f64 * 1e9 + ts.nsec as f64,
        _ => 0.0,
    }
}

/// The `i`-th command-line argument parsed, or `default`.
fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .map_or(default, |s| s.parse().ok().expect("an argument"))
}

fn main() {
    let threads: usize = arg(1, 1);
    let names: String = arg(2, "NVFP4,Q1_0,Q2_0".to_string());
    let (rows, cols, passes): (usize, usize, usize) = (arg(3, 5504), arg(4, 2048), arg(5, 20));
    let (dtypes, inter): (Vec<DType>, Vec<bool>) = names
        .split(',')
        .map(|n| {
            let name = n.trim_end_matches("/i");
            (DType::from_name(name).expect("a format name"), name != n)
        })
        .unzip();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let ws: Vec<Vec<Weight>> = dtypes
        .iter()
        .map(|&d| (0..8).map(|i| weight(d, rows, cols, i)).collect())
        .collect();
    let il: Vec<Vec<Interleaved>> = ws
        .iter()
        .zip(&inter)
        .map(|(w8, &on)| match on {
            true => w8.iter().map(|w| Interleaved::new(w).unwrap()).collect(),
            false => Vec::new(),
        })
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
        .collect();
    let mut y = vec![0f32; rows];
    pool.install(|| {
        let mut best = vec![f64::MAX; dtypes.len()];
        let mut best_cpu = vec![f64::MAX; dtypes.len()];
        for _ in 0..passes {
            for (((b, c), w8), i8) in best.iter_mut().zip(&mut best_cpu).zip(&ws).zip(&il) {
                let (t, c0) = (Instant::now(), cpu_ns());
                match i8.is_empty() {
                    true => w8
                        .iter()
                        .for_each(|w| powerinfer_cpu::matvec(w, &x, &mut y).unwrap()),
                    false => i8
                        .iter()
                        .for_each(|w| powerinfer_cpu::matvec_interleaved(w, &x, &mut y).unwrap()),
                }
                *b = b.min(t.elapsed().as_secs_f64());
                *c = c.min((cpu_ns() - c0) * 1e-9);
            }
        }
        let blocks = (8 * rows * cols / 32) as f64;
        for ((((d, b), c), w8), on) in dtypes.iter().zip(&best).zip(&best_cpu).zip(&ws).zip(&inter)
        {
            let bytes: f64 = w8.iter().map(|w| w.bytes().len() as f64).sum();
            println!(
                "{d:>7}{} {rows}x{cols}, {threads} thread(s), {} x: {:.3} ns/block/thread, \
                 {:.2} GB/s; CPU time {:.3} ns/block (one thread)",
                if *on { " interleaved" } else { "" },
                powerinfer_cpu::numerics().name(),
                b * 1e9 * threads as f64 / blocks,
                bytes / b / 1e9,
                c * 1e9 / blocks
            );
        }
        println!(
            "read probe (the same pool, 512 MiB): {:.2} GB/s",
            powerinfer_cpu::measure_read_bandwidth(512 << 20, 5)
        );
    });
}
