//! Matvec throughput of an interleaved format (Q4_0 unless named: Q4_1, Q8_0), rows row-major against rows interleaved by eight
//! ([`powerinfer_cpu::Interleaved`]), in one run: eight matrices (5504 x 2048 unless given:
//! about 50 MB in Q4_0, past any L3 of ours) per pass, alternating, best of ten, in GB/s of
//! weights read; the interleaved ones both one call per matrix and all eight in one region
//! (`matvec_interleaved_many`); then
//! the read probe on the same pool, for the share of the floor.
//!
//! ```text
//! cargo run --release -p powerinfer-cpu --example interleaved_matvec -- 2     # 2 threads
//! cargo run --release -p powerinfer-cpu --example interleaved_matvec -- 2 Q8_0
//! cargo run --release -p powerinfer-cpu --example interleaved_matvec -- 2 Q4_0 2048 5504  # down
//! POWERINFER_RS_NUMERICS=int8 cargo run --release -p powerinfer-cpu --example interleaved_matvec
//! ```

#[path = "common/random_weight.rs"]
mod random_weight;

use powerinfer_core::{DType, Weight};
use random_weight::weight;
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map_or(1, |s| s.parse().expect("threads"));
    let dtype = std::env::args().nth(2).map_or(DType::Q4_0, |s| {
        DType::from_name(&s).expect("a format name")
    });
    let dim = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |s| s.parse().expect("a size"))
    };
    let (rows, cols) = (dim(3, 5504), dim(4, 2048));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let ws: Vec<Weight> = (0..8).map(|i| weight(dtype, rows, cols, i)).collect();
    let il: Vec<_> = ws
        .iter()
        .map(|w| powerinfer_cpu::Interleaved::new(w).unwrap())
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.03)
        .collect();
    let mut y = vec![0f32; rows];
    let mut ys = vec![vec![0f32; rows]; 8];
    let bytes: f64 = ws.iter().map(|w| w.bytes().len() as f64).sum();
    pool.install(|| {
        let (mut rows, mut inter, mut many) = (f64::MAX, f64::MAX, f64::MAX);
        let refs: Vec<_> = il.iter().collect();
        for _ in 0..10 {
            let t = Instant::now();
            for w in &ws {
                powerinfer_cpu::matvec(w, &x, &mut y).unwrap();
            }
            rows = rows.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for w in &il {
                powerinfer_cpu::matvec_interleaved(w, &x, &mut y).unwrap();
            }
            inter = inter.min(t.elapsed().as_secs_f64());
            let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|v| &mut v[..]).collect();
            let t = Instant::now();
            powerinfer_cpu::matvec_interleaved_many(&refs, &x, &mut outs).unwrap();
            many = many.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{dtype}, {} x, {threads} thread(s): row-major {:.2} GB/s, interleaved {:.2} GB/s \
             ({:.2}x), interleaved in one region {:.2} GB/s ({:.2}x)",
            powerinfer_cpu::numerics().name(),
            bytes / rows / 1e9,
            bytes / inter / 1e9,
            rows / inter,
            bytes / many / 1e9,
            rows / many
        );
        println!(
            "read probe (the same pool, 512 MiB): {:.2} GB/s",
            powerinfer_cpu::measure_read_bandwidth(512 << 20, 5)
        );
    });
}
