//! One attention head over cached positions: scores s_p = (q·k_p)·scale, a softmax over them,
//! and the weighted sum Σ_p softmax(s)_p · v_p.
//!
//! Two paths, picked at run time like every kernel in this crate (see [`crate::dispatch`]):
//! AVX2/FMA intrinsics (two FMA chains per dot, the output held in registers while the value
//! rows stream by) and portable Rust (the scalar path's eight-sum dot, four positions per pass
//! over the output). Both take e^x from [`crate::kernels::exp_nonpositive`] (a floor, a
//! polynomial and an exponent shift rather than a libm call per score).

use crate::dispatch;
use crate::operands::attention::{Head, HeadCache};
use crate::simd;

/// `out = Σ_p softmax_p((q·k_p)·scale) · v_p` over positions `0..n_pos` of `cache`, with
/// `scores` as scratch (resized to `n_pos`). `hd = q.len() = out.len()`. A `sink` logit joins
/// the softmax's max and denominator with no value (see
/// [`SoftmaxExtras::sink`](crate::SoftmaxExtras::sink)).
///
/// # Panics
/// When `n_pos == 0` or the cache holds fewer than `n_pos` positions of `hd` values.
pub fn attend_head(
    q: &[f32],
    cache: HeadCache<'_>,
    n_pos: usize,
    scale: f32,
    sink: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let head = Head {
        q,
        cache,
        n_pos,
        scale,
        sink,
    };
    head.check(out);
    dispatch::attend_head(simd::level(), &head, scores, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Level;

    /// Straight f64 loops over the definition (a sink joins the max and the denominator).
    fn reference(
        q: &[f32],
        c: HeadCache<'_>,
        n_pos: usize,
        scale: f32,
        sink: Option<f32>,
    ) -> Vec<f64> {
        let hd = q.len();
        let s: Vec<f64> = (0..n_pos)
            .map(|p| {
                let k = &c.keys[p * c.stride..];
                (0..hd).map(|i| q[i] as f64 * k[i] as f64).sum::<f64>() * scale as f64
            })
            .collect();
        let sink = sink.map(f64::from);
        let m = s
            .iter()
            .cloned()
            .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
        (0..hd)
            .map(|i| {
                (0..n_pos)
                    .map(|p| e[p] / z * c.values[p * c.stride + i] as f64)
                    .sum()
            })
            .collect()
    }

    #[test]
    fn every_level_matches_the_f64_reference_on_odd_sizes() {
        let mut rng = crate::testutil::Rng::new(31);
        for &(hd, n_pos, stride_extra) in &[
            (1, 1, 0),
            (7, 3, 5),
            (64, 129, 128),
            (128, 33, 0),
            (37, 250, 3),
            (72, 5, 1),
        ] {
            let stride = hd + stride_extra;
            let keys: Vec<f32> = rng.vec(n_pos * stride).iter().map(|v| v * 3.0).collect();
            let values = rng.vec(n_pos * stride);
            let q = rng.vec(hd);
            let c = HeadCache {
                keys: &keys,
                values: &values,
                stride,
            };
            // No sink, one below the scores, one that takes most of the weight.
            for sink in [None, Some(-2.0), Some(6.0)] {
                let want = reference(&q, c, n_pos, 0.3, sink);
                for level in simd::available() {
                    let mut out = vec![f32::NAN; hd];
                    let mut scores = Vec::new();
                    let head = Head {
                        q: &q,
                        cache: c,
                        n_pos,
                        scale: 0.3,
                        sink,
                    };
                    dispatch::attend_head(level, &head, &mut scores, &mut out);
                    for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                            "{level:?} hd {hd} n_pos {n_pos} sink {sink:?} [{i}]: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_nan_query_gives_nan_on_every_level() {
        let k = vec![0.5f32; 3 * 16];
        let c = HeadCache {
            keys: &k,
            values: &k,
            stride: 16,
        };
        let mut q = vec![0.1f32; 16];
        q[3] = f32::NAN;
        let mut out = vec![0.0f32; 16];
        attend_head(&q, c, 3, 1.0, None, &mut Vec::new(), &mut out);
        assert!(out.iter().all(|v| v.is_nan()), "{out:?}");
        let head = Head {
            q: &q,
            cache: c,
            n_pos: 3,
            scale: 1.0,
            sink: Some(0.5),
        };
        dispatch::attend_head(Level::Scalar, &head, &mut Vec::new(), &mut out);
        assert!(out.iter().all(|v| v.is_nan()), "{out:?}");
    }

    #[test]
    #[should_panic(expected = "fewer than")]
    fn a_short_cache_is_refused() {
        let k = vec![0.0f32; 10];
        let c = HeadCache {
            keys: &k,
            values: &k,
            stride: 4,
        };
        attend_head(&[0.0; 4], c, 3, 1.0, None, &mut Vec::new(), &mut [0.0; 4]);
    }
}
