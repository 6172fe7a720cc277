//! `rms_norm`, `layer_norm` and `rope` (norm_rope.cu) on f32 rows.

use powerinfer_core::Result;

use crate::layout::xq_bytes;

/// `out = x / sqrt(mean(x²) + eps) · w` for every row of `n` values of `x` (the sum of
/// squares in f64, as the CPU engine's RMSNorm).
pub(super) fn rms_norm(x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in o.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Every row of `w.len()` values of `x` RMS-normed in place with weight `w` (the per-head q/k
/// norm the `rope` kernel applies before rotating).
pub(super) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for row in x.chunks_exact_mut(n) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `out = (x − mean) / sqrt(var + eps) · w + b` for every row of `w.len()` values of `x`, with
/// the biased variance, mean and variance in f64 (the CPU engine's `layer_norm`).
pub(super) fn layer_norm(x: &[f32], [w, b]: [&[f32]; 2], eps: f32, out: &mut [f32]) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let scale = 1.0 / (var + eps as f64).sqrt();
        for (((o, &v), &g), &c) in o.iter_mut().zip(xr).zip(w).zip(b) {
            *o = ((v as f64 - mean) * scale) as f32 * g + c;
        }
    }
}

/// With `xq`, every row of `n` values of a norm's `out` quantized for the integer dots as
/// `quantize_x` quantizes it, row r's blocks after row r − 1's (the norm kernels' `xq`).
pub(super) fn quantize_rows(out: &[f32], n: usize, xq: Option<&mut [u8]>) -> Result<()> {
    let Some(xq) = xq else {
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    let per_row = xq_bytes(n);
    let need = out.len() / n * per_row;
    let xq = super::view::prefix_mut(xq, need, "xq")?;
    for (row, q) in out.chunks_exact(n).zip(xq.chunks_exact_mut(per_row)) {
        super::rows::quantize_x(row, n, q)?;
    }
    Ok(())
}

/// Rotate the first `2 · inv_freqs.len()` values of every head of `x` (heads of `head_dim`,
/// contiguous) in place for position `pos`: pair i turns by `pos · inv_freqs[i]` (in f64);
/// `neox` pairs (i, i + n), else (2i, 2i + 1); the rest of each head is unchanged.
pub(super) fn rope(x: &mut [f32], head_dim: usize, pos: usize, inv_freqs: &[f64], neox: bool) {
    let half = inv_freqs.len();
    if half == 0 || head_dim == 0 {
        return;
    }
    let angles: Vec<(f32, f32)> = inv_freqs
        .iter()
        .map(|f| {
            let (s, c) = (pos as f64 * f).sin_cos();
            (c as f32, s as f32)
        })
        .collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in angles.iter().enumerate() {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use powerinfer_core::testing::pseudo_random;

    use super::super::testutil::*;
    use crate::backend::{Backend, Launch};
    use crate::{HostBackend, HostBuf};

    #[test]
    fn rms_norm_normalises_each_row() {
        let be = HostBackend::new();
        let (rows, n, eps) = (3, 333, 1e-5f32);
        let (x, w) = (pseudo_random(rows * n, 1), pseudo_random(n, 2));
        let mut want = vec![0f32; rows * n];
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let ss: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
            let s = 1.0 / (ss / n as f64 + eps as f64).sqrt();
            for i in 0..n {
                want[r * n + i] = (row[i] as f64 * s * w[i] as f64) as f32;
            }
        }
        let (dx, dw) = (upload(&be, &x), upload(&be, &w));
        let mut out = be.zeros::<f32>(rows * n).unwrap();
        let rms = |x: &HostBuf<f32>, out: &mut HostBuf<f32>| {
            launch(
                &be,
                Launch::RmsNorm {
                    x,
                    w: &dw,
                    rows,
                    n,
                    eps,
                    out,
                    xq: None,
                },
            )
        };
        rms(&dx, &mut out).unwrap();
        assert_close(&download(&be, &out), &want, 1e-6, "rms_norm");
        let short = upload(&be, &x[..rows * n - 1]);
        assert!(is_shape(rms(&short, &mut out)));
        let mut short = be.zeros::<f32>(n).unwrap();
        assert!(is_shape(rms(&dx, &mut short)));
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let be = HostBackend::new();
        let (rows, n, eps) = (3, 301, 1e-5f32);
        // An offset row mean: a missing centring would show.
        let x: Vec<f32> = pseudo_random(rows * n, 3).iter().map(|v| v + 0.7).collect();
        let (w, b) = (pseudo_random(n, 4), pseudo_random(n, 5));
        let mut want = vec![0f32; rows * n];
        for r in 0..rows {
            let row = &x[r * n..(r + 1) * n];
            let m = row.iter().map(|v| *v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / n as f64;
            for i in 0..n {
                let v = (row[i] as f64 - m) / (var + eps as f64).sqrt();
                want[r * n + i] = (v * w[i] as f64 + b[i] as f64) as f32;
            }
        }
        let (dx, dw, db) = (upload(&be, &x), upload(&be, &w), upload(&be, &b));
        let mut out = be.zeros::<f32>(rows * n).unwrap();
        let ln = |x: &HostBuf<f32>, b: &HostBuf<f32>, out: &mut HostBuf<f32>| {
            launch(
                &be,
                Launch::LayerNorm {
                    x,
                    w: &dw,
                    b,
                    rows,
                    n,
                    eps,
                    out,
                    xq: None,
                },
            )
        };
        ln(&dx, &db, &mut out).unwrap();
        assert_close(&download(&be, &out), &want, 1e-6, "layer_norm");
        let short = upload(&be, &b[..n - 1]);
        assert!(is_shape(ln(&dx, &short, &mut out)));
        let short = upload(&be, &x[..rows * n - 1]);
        assert!(is_shape(ln(&short, &db, &mut out)));
    }

    #[test]
    fn rope_rotates_pairs_of_both_styles_with_f64_angles() {
        let be = HostBackend::new();
        // (head_dim, heads, pos, theta, rotated dims, step): pair i's frequency divided by
        // 1 + step · i (Llama 3.1's factors grow along the pairs).
        let cases = [
            (64, 5, 12_345, 10000.0f64, 64, 0.0),
            (128, 3, 7, 500000.0, 128, 0.0),
            (64, 2, 3_000, 10000.0, 64, 1.0),
            (32, 3, 901, 10000.0, 16, 0.5),
        ];
        for (hd, heads, pos, theta, rot, step) in cases {
            let inv: Vec<f64> = (0..rot / 2)
                .map(|i| theta.powf(-2.0 * i as f64 / rot as f64) / (1.0 + step * i as f64))
                .collect();
            for neox in [false, true] {
                let q = pseudo_random(hd * heads + 3, hd as u64);
                let mut want = q.clone();
                for head in want[..hd * heads].chunks_exact_mut(hd) {
                    for (i, f) in inv.iter().enumerate() {
                        let a = pos as f64 * f;
                        let (s, c) = (a.sin() as f32, a.cos() as f32);
                        let (ia, ib) = if neox {
                            (i, i + rot / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (x0, x1) = (head[ia], head[ib]);
                        head[ia] = x0 * c - x1 * s;
                        head[ib] = x0 * s + x1 * c;
                    }
                }
                let mut dq = upload(&be, &q);
                launch(
                    &be,
                    Launch::Rope {
                        x: &mut dq,
                        n_heads: heads,
                        k: None,
                        k_heads: 0,
                        head_dim: hd,
                        pos,
                        inv_freqs: &inv,
                        neox,
                        x_norm: None,
                        k_norm: None,
                        eps: 0.0,
                    },
                )
                .unwrap();
                let got = download(&be, &dq);
                assert_close(&got, &want, 1e-6, &format!("hd {hd} rot {rot} neox {neox}"));
                assert_eq!(got[hd * heads..], q[hd * heads..], "past the heads");
                if rot < hd {
                    assert_eq!(got[rot..hd], q[rot..hd], "the unrotated part of a head");
                }
            }
        }
        // Position 0 is the identity; x too short, or more pairs than a head holds, is an error.
        let q = pseudo_random(64, 3);
        let mut dq = upload(&be, &q);
        let inv: Vec<f64> = (0..16).map(|i| 10000f64.powf(-(i as f64) / 16.0)).collect();
        let long = vec![1.0; 17];
        let mut rope = |n_heads, pos, inv_freqs: &[f64]| {
            launch(
                &be,
                Launch::Rope {
                    x: &mut dq,
                    n_heads,
                    k: None,
                    k_heads: 0,
                    head_dim: 32,
                    pos,
                    inv_freqs,
                    neox: true,
                    x_norm: None,
                    k_norm: None,
                    eps: 0.0,
                },
            )
        };
        rope(2, 0, &inv).unwrap();
        assert!(is_shape(rope(3, 1, &inv)));
        assert!(is_shape(rope(2, 1, &long)));
        assert_eq!(download(&be, &dq), q);
    }
}
