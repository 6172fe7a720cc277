//! One attention head over cached positions: scores s_p = (q·k_p)·scale, a softmax over them,
//! and the weighted sum Σ_p softmax(s)_p · v_p.
//!
//! Two paths, picked at run time like every kernel in this crate: AVX2/FMA intrinsics
//! (`crate::avx2::attend`: two FMA chains per dot, the output held in registers while the value
//! rows stream by) and portable Rust (the scalar path's eight-sum dot, four positions per pass
//! over the output). Both take e^x from [`exp_nonpositive`] (a floor, a polynomial and an exponent
//! shift rather than a libm call per score).

use crate::scalar::dot_f32;
use crate::simd::{self, Level};

/// Where one head's keys and values sit: position p's vector is `hd` values starting at
/// `p · stride` of `keys` and `values`.
#[derive(Clone, Copy, Debug)]
pub struct HeadCache<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub stride: usize,
}

/// `out = Σ_p softmax_p((q·k_p)·scale) · v_p` over positions `0..n_pos` of `cache`, with
/// `scores` as scratch (resized to `n_pos`). `hd = q.len() = out.len()`.
///
/// # Panics
/// When `n_pos == 0` or the cache holds fewer than `n_pos` positions of `hd` values.
pub fn attend_head(
    q: &[f32],
    cache: HeadCache<'_>,
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    assert!(n_pos > 0 && out.len() == hd, "attend_head: bad sizes");
    let need = (n_pos - 1) * cache.stride + hd;
    assert!(
        cache.keys.len() >= need && cache.values.len() >= need,
        "attend_head: the cache holds fewer than {n_pos} positions"
    );
    match simd::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the level is only Avx2 once AVX2, FMA and F16C were detected on this CPU.
        Level::Avx2 => unsafe {
            crate::avx2::attend::attend_head(q, cache, n_pos, scale, scores, out)
        },
        Level::Scalar => attend(q, cache, n_pos, scale, scores, out),
    }
}

/// The head's attention in portable Rust (sizes checked by [`attend_head`]).
fn attend<'a>(
    q: &[f32],
    cache: HeadCache<'a>,
    n_pos: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let stride = cache.stride;
    let at = |data: &'a [f32], p: usize| -> &'a [f32] { &data[p * stride..p * stride + hd] };
    scores.clear();
    scores.resize(n_pos, 0.0);
    for (p, s) in scores.iter_mut().enumerate() {
        *s = dot_f32(q, at(cache.keys, p)) * scale;
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let inv = 1.0 / scores.iter().sum::<f32>();
    out.fill(0.0);
    // Four positions per pass: out is read and written once per four value vectors.
    let mut quads = scores.chunks_exact(4);
    let mut p = 0;
    for w in &mut quads {
        let (v0, v1) = (at(cache.values, p), at(cache.values, p + 1));
        let (v2, v3) = (at(cache.values, p + 2), at(cache.values, p + 3));
        let (w0, w1, w2, w3) = (w[0] * inv, w[1] * inv, w[2] * inv, w[3] * inv);
        let rows = v0.iter().zip(v1).zip(v2).zip(v3);
        for (o, (((a, b), c), d)) in out.iter_mut().zip(rows) {
            *o += w0 * a + w1 * b + w2 * c + w3 * d;
        }
        p += 4;
    }
    for &w in quads.remainder() {
        let w = w * inv;
        for (o, &vi) in out.iter_mut().zip(at(cache.values, p)) {
            *o += w * vi;
        }
        p += 1;
    }
}

/// e^x for x <= 0 (the softmax's shifted scores), to about 2 ulp; values below −87 give
/// e^−87 ≈ 1.6e−38 instead of a smaller number or 0, which no softmax sum (>= 1) can see. NaN
/// stays NaN. Cephes' expf: x = n·ln2 + r with |r| <= ln2/2, e^r from a degree-6 polynomial,
/// 2^n put in the exponent bits.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so that n·C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Not `max`, which would turn NaN into −87.
    let x = if x < -87.0 { -87.0 } else { x };
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // n in −126..=0 here: a normal power of two. A NaN x gives n = NaN, cast to 0: e stays NaN.
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_f64_over_its_range() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let got = exp_nonpositive(x) as f64;
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(-1e30) < 2e-38);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    /// Straight f64 loops over the definition.
    fn reference(q: &[f32], c: HeadCache<'_>, n_pos: usize, scale: f32) -> Vec<f64> {
        let hd = q.len();
        let s: Vec<f64> = (0..n_pos)
            .map(|p| {
                let k = &c.keys[p * c.stride..];
                (0..hd).map(|i| q[i] as f64 * k[i] as f64).sum::<f64>() * scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
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
            let want = reference(&q, c, n_pos, 0.3);
            for level in simd::available() {
                let mut out = vec![f32::NAN; hd];
                let mut scores = Vec::new();
                match level {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the level was detected on this CPU.
                    Level::Avx2 => unsafe {
                        crate::avx2::attend::attend_head(&q, c, n_pos, 0.3, &mut scores, &mut out)
                    },
                    Level::Scalar => attend(&q, c, n_pos, 0.3, &mut scores, &mut out),
                }
                for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{level:?} hd {hd} n_pos {n_pos} [{i}]: {g} vs {w}"
                    );
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
        attend_head(&q, c, 3, 1.0, &mut Vec::new(), &mut out);
        assert!(out.iter().all(|v| v.is_nan()), "{out:?}");
        attend(&q, c, 3, 1.0, &mut Vec::new(), &mut out);
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
        attend_head(&[0.0; 4], c, 3, 1.0, &mut Vec::new(), &mut [0.0; 4]);
    }
}
