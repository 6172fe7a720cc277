//! `rms_norm` and `rope` (norm_rope.cu) on f32 rows.

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

/// Rotate every head of `x` (heads of `head_dim`, contiguous) in place for position `pos`:
/// pair i turns by `pos · theta^(−2i/head_dim)` (in f64); `neox` pairs (i, i + d/2), else
/// (2i, 2i + 1).
pub(super) fn rope(x: &mut [f32], head_dim: usize, pos: usize, theta: f32, neox: bool) {
    let half = head_dim / 2;
    if half == 0 {
        return;
    }
    let angles: Vec<(f32, f32)> = (0..half)
        .map(|i| {
            let inv_freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = (pos as f64 * inv_freq).sin_cos();
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
    fn rope_rotates_pairs_of_both_styles_with_f64_angles() {
        let be = HostBackend::new();
        for (hd, heads, pos, theta) in [(64, 5, 12_345, 10000.0f32), (128, 3, 7, 500000.0)] {
            for neox in [false, true] {
                let q = pseudo_random(hd * heads + 3, hd as u64);
                let mut want = q.clone();
                for head in want[..hd * heads].chunks_exact_mut(hd) {
                    for i in 0..hd / 2 {
                        let a = pos as f64 * (theta as f64).powf(-2.0 * i as f64 / hd as f64);
                        let (s, c) = (a.sin() as f32, a.cos() as f32);
                        let (ia, ib) = if neox {
                            (i, i + hd / 2)
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
                        head_dim: hd,
                        pos,
                        theta,
                        neox,
                    },
                )
                .unwrap();
                let got = download(&be, &dq);
                assert_close(&got, &want, 1e-6, &format!("hd {hd} neox {neox}"));
                assert_eq!(got[hd * heads..], q[hd * heads..], "past the heads");
            }
        }
        // Position 0 is the identity; x too short is an error.
        let q = pseudo_random(64, 3);
        let mut dq = upload(&be, &q);
        let mut rope = |n_heads, pos| {
            launch(
                &be,
                Launch::Rope {
                    x: &mut dq,
                    n_heads,
                    head_dim: 32,
                    pos,
                    theta: 10000.0,
                    neox: true,
                },
            )
        };
        rope(2, 0).unwrap();
        assert!(is_shape(rope(3, 1)));
        assert_eq!(download(&be, &dq), q);
    }
}
