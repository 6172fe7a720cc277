//! RMSNorm and rotary position embeddings (both pairings), on f32 rows.

use powerinfer_core::{RopeFreqs, RopeStyle};

/// `out = x / sqrt(mean(x²) + eps) * w`, one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// `out = (x - mean(x)) / sqrt(var(x) + eps) * w + b`, one row (LayerNorm).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let scale = 1.0 / (var + eps as f64).sqrt();
    for (((o, &v), &g), &c) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = ((v as f64 - mean) * scale) as f32 * g + c;
    }
}

/// Rotary embedding tables for one position: cos and sin of `pos · inv[i]` for each rotated
/// pair, times the magnitude ([`RopeFreqs::cos_sin`], from
/// [`ModelConfig::rope_freqs`](powerinfer_core::ModelConfig::rope_freqs)).
pub struct RopeAngles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeAngles {
    /// Angles for position `pos` (computed in f64: positions reach tens of thousands of rad).
    pub fn new(pos: usize, freqs: &RopeFreqs) -> RopeAngles {
        let (cos, sin) = (0..freqs.pairs()).map(|i| freqs.cos_sin(pos, i)).unzip();
        RopeAngles { cos, sin }
    }
}

/// Rotate every head of `x` (heads × head_dim, contiguous) in place: the first
/// `2 · angles.cos.len()` values of each head (all of them unless RoPE is partial), the rest
/// unchanged.
pub fn apply_rope(x: &mut [f32], head_dim: usize, angles: &RopeAngles, style: RopeStyle) {
    let half = angles.cos.len();
    debug_assert!(2 * half <= head_dim);
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Norm => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            let (c, s) = (angles.cos[i], angles.sin[i]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0];
        let w = [1.0f32, 0.5, 2.0];
        let mut out = [0.0f32; 3];
        rms_norm(&x, &w, 1e-6, &mut out);
        let r = ((1.0 + 4.0 + 9.0) / 3.0f64 + 1e-6).sqrt();
        for i in 0..3 {
            assert!((out[i] as f64 - x[i] as f64 / r * w[i] as f64).abs() < 1e-6);
        }
    }

    #[test]
    fn layer_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let (w, b) = ([1.0f32, 0.5, 2.0, 1.0], [0.1f32, 0.0, -0.2, 0.3]);
        let mut out = [0.0f32; 4];
        layer_norm(&x, &w, &b, 1e-5, &mut out);
        let m = 2.5 / 4.0;
        let var = x.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / 4.0;
        for i in 0..4 {
            let want = (x[i] as f64 - m) / (var + 1e-5).sqrt() * w[i] as f64 + b[i] as f64;
            assert!((out[i] as f64 - want).abs() < 1e-5);
        }
    }

    #[test]
    fn rope_styles_agree_under_permutation() {
        // Neox on [a0..a3, b0..b3] equals Norm on the interleaved [a0,b0,a1,b1,...].
        let hd = 8;
        let inv: Vec<f64> = (0..hd / 2)
            .map(|i| 10000f64.powf(-2.0 * i as f64 / hd as f64))
            .collect();
        let ang = RopeAngles::new(37, &RopeFreqs::plain(inv));
        let neox_in: Vec<f32> = (0..hd).map(|i| i as f32 * 0.3 - 1.0).collect();
        let mut norm_in = vec![0.0; hd];
        for i in 0..hd / 2 {
            norm_in[2 * i] = neox_in[i];
            norm_in[2 * i + 1] = neox_in[i + hd / 2];
        }
        let (mut a, mut b) = (neox_in.clone(), norm_in);
        apply_rope(&mut a, hd, &ang, RopeStyle::Neox);
        apply_rope(&mut b, hd, &ang, RopeStyle::Norm);
        for i in 0..hd / 2 {
            assert!((a[i] - b[2 * i]).abs() < 1e-6);
            assert!((a[i + hd / 2] - b[2 * i + 1]).abs() < 1e-6);
        }
        // Rotation keeps the norm.
        let n0: f32 = neox_in.iter().map(|v| v * v).sum();
        let n1: f32 = a.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
    }

    #[test]
    fn partial_rope_rotates_the_leading_values_only() {
        // rope_dims 4 of head_dim 8: neox pairs (0,2), (1,3); norm pairs (0,1), (2,3).
        let inv = [1.0f64, 0.1];
        let ang = RopeAngles::new(3, &RopeFreqs::plain(inv.to_vec()));
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 2.0).collect();
        for style in [RopeStyle::Neox, RopeStyle::Norm] {
            let mut y = x.clone();
            apply_rope(&mut y, 8, &ang, style);
            for h in 0..2 {
                let (xh, yh) = (&x[h * 8..h * 8 + 8], &y[h * 8..h * 8 + 8]);
                assert_eq!(xh[4..], yh[4..], "{style:?}: the pass-through half");
                for (i, f) in inv.iter().enumerate() {
                    let (a, b) = match style {
                        RopeStyle::Neox => (i, i + 2),
                        RopeStyle::Norm => (2 * i, 2 * i + 1),
                    };
                    let t = 3.0 * f;
                    let (c, s) = (t.cos() as f32, t.sin() as f32);
                    assert!((yh[a] - (xh[a] * c - xh[b] * s)).abs() < 1e-6);
                    assert!((yh[b] - (xh[a] * s + xh[b] * c)).abs() < 1e-6);
                }
            }
        }
    }
}
