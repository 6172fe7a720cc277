//! The kernels per instruction set, reached only through [`crate::dispatch`]: portable Rust
//! ([`scalar`], any CPU) and AVX2/FMA/F16C intrinsics (`avx2`, x86-64 CPUs that have them),
//! plus the math both share.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
pub(crate) mod cols;
pub(crate) mod kv_blocks;
pub(crate) mod scalar;

/// The softmax's shift: the max of `scores` and the sink logit, if any.
#[inline(always)]
pub(crate) fn softmax_max(scores: &[f32], sink: Option<f32>) -> f32 {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    sink.map_or(max, |s| max.max(s))
}

/// The sink's term of the softmax's denominator, e^(sink − max) (0 without a sink).
#[inline(always)]
pub(crate) fn sink_term(sink: Option<f32>, max: f32) -> f32 {
    sink.map_or(0.0, |s| exp_nonpositive(s - max))
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
}
