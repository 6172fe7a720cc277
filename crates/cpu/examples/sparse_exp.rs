//! TEMP: A/B of sparse kernel variants, interleaved call by call.
use powerinfer_core::{Activation, Buffer, DType, Weight};
use std::time::Instant;
const DIM: usize = 2048;
const FFN: usize = 5504;
fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    let row_bytes = dtype.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; rows * row_bytes];
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for chunk in bytes.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = (s & 0x3FFF_3FFF_3FFF_3FFF).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dtype = DType::from_name(&args[1]).unwrap();
    let kernel = args[2].clone();
    // variants: "pd,pb,v" triples
    let variants: Vec<(usize, usize, usize)> = args[3..]
        .iter()
        .map(|a| {
            let p: Vec<usize> = a.split(',').map(|t| t.parse().unwrap()).collect();
            (p[0], p[1], p[2])
        })
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let layer_bytes = 3 * FFN * dtype.row_bytes(DIM).unwrap();
    let ws: usize = std::env::var("WS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 30);
    let nl = ws.div_ceil(layer_bytes);
    let layers: Vec<[Weight; 3]> = (0..nl as u64)
        .map(|l| [0, 1, 2].map(|k| weight(dtype, FFN, DIM, 3 * l + k)))
        .collect();
    let n = 550;
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    let sets: Vec<Vec<u32>> = (0..std::env::var("SETS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(13))
        .map(|_| {
            let mut all: Vec<u32> = (0..FFN as u32).collect();
            for i in 0..n {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let j = i + (s % (FFN - i) as u64) as usize;
                all.swap(i, j);
            }
            let mut v = all[..n].to_vec();
            v.sort_unstable();
            v
        })
        .collect();
    let x: Vec<f32> = (0..DIM).map(|i| ((i % 13) as f32 - 6.0) * 0.1).collect();
    let g: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
    let mut y = vec![0f32; DIM];
    let mut yk = vec![0f32; n];
    let rows = match kernel.as_str() {
        "matvec_rows" | "axpy_rows" => 1,
        "ffn_up_down" => 2,
        _ => 3,
    };
    let mut bytes = (rows * n * dtype.row_bytes(DIM).unwrap()) as f64;
    if kernel == "dense" {
        bytes = layers[0][1].n_bytes() as f64;
    }
    let mut times = vec![Vec::new(); variants.len()];
    let mut it = 0;
    pool.install(|| {
        let bw = powerinfer_cpu::measure_read_bandwidth(256 << 20, 5);
        for _round in 0..400 {
            for (vi, &(pd, pb, v)) in variants.iter().enumerate() {
                powerinfer_cpu::set_knobs(pd, pb, v);
                let [gate, up, down] = &layers[it % nl];
                let idx = &sets[it % sets.len()];
                it += 1;
                let t = Instant::now();
                match kernel.as_str() {
                    "matvec_rows" => powerinfer_cpu::matvec_rows(up, &x, idx, &mut yk).unwrap(),
                    "raw" => {
                        use rayon::prelude::*;
                        let rb = up.row_bytes();
                        let pfd = pd;
                        let s: u64 = idx
                            .par_chunks(idx.len().div_ceil(8))
                            .map(|c| {
                                let mut acc = [0u64; 4];
                                for (k, &i) in c.iter().enumerate() {
                                    if pfd > 0 {
                                        if let Some(&nx) = c.get(k + pfd) {
                                            let p = up.bytes()[nx as usize * rb..].as_ptr();
                                            for off in (0..rb.min(pb)).step_by(64) {
                                                unsafe {
                                                    std::arch::x86_64::_mm_prefetch::<
                                                        { std::arch::x86_64::_MM_HINT_T0 },
                                                    >(
                                                        p.add(off) as *const i8
                                                    )
                                                }
                                            }
                                        }
                                    }
                                    let row = &up.bytes()[i as usize * rb..][..rb];
                                    for q in row.chunks_exact(32) {
                                        for k2 in 0..4 {
                                            acc[k2] = acc[k2].wrapping_add(u64::from_le_bytes(
                                                q[8 * k2..8 * k2 + 8].try_into().unwrap(),
                                            ));
                                        }
                                    }
                                }
                                acc.iter().fold(0u64, |a, &b| a.wrapping_add(b))
                            })
                            .sum();
                        std::hint::black_box(s);
                    }
                    "dense" => powerinfer_cpu::matvec(up, &x, &mut vec![0f32; FFN]).unwrap(),
                    "axpy_rows" => powerinfer_cpu::axpy_rows(down, idx, &g, &mut y).unwrap(),
                    "ffn_up_down" => {
                        powerinfer_cpu::ffn_up_down_sparse(up, down, &x, idx, &g, &mut y).unwrap()
                    }
                    _ => powerinfer_cpu::ffn_gate_up_down_sparse(
                        gate,
                        up,
                        down,
                        Activation::Silu,
                        &x,
                        idx,
                        &mut y,
                    )
                    .unwrap(),
                }
                times[vi].push(t.elapsed().as_secs_f64());
            }
        }
        let bw2 = powerinfer_cpu::measure_read_bandwidth(256 << 20, 5);
        println!("{dtype} {kernel} bw {bw:.1} / {bw2:.1} GB/s");
        for (vi, t) in times.iter_mut().enumerate() {
            t.sort_by(f64::total_cmp);
            let med = t[t.len() / 2];
            let p10 = t[t.len() / 10];
            println!(
                "  {:?}: median {:.1} GB/s ({:.0}%), p10 {:.1} GB/s",
                variants[vi],
                bytes / med / 1e9,
                100.0 * bytes / med / 1e9 / bw.max(bw2),
                bytes / p10 / 1e9
            );
        }
    });
}
