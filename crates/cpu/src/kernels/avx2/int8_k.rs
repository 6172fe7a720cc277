//! x quantized once per vector to int8 in blocks of 256 with one scale per block ([`X8K`],
//! ggml's `block_q8_K` without its sums): the activations of the formats whose 256-weight
//! blocks hold small integer sub-block scales (the 2-bit lattice i-quants, [`super::iq2_dot`]),
//! so a whole block is one integer dot (the sub-block scales applied as integers) and one float
//! step. The quantization is `crate::reference::x8k` computed with AVX2, bit for bit.
//!
//! Shared by every format that takes it: a format joins by an [`X8KRows`] impl and a line of
//! [`with_x8k!`]; [`takes_x8k`] says which do.

use super::reduce::hmax;
use crate::reference::x8::X8_MAX;
use crate::reference::x8k::X8K_BLOCK;
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Tokens one kernel call dots with its rows (callers with more split them).
pub(crate) const X8K_TOKENS: usize = 8;

/// x as int8 in blocks of 256 (see the module docs).
pub(crate) struct X8K {
    /// The quants, in x's order.
    pub(super) q: Vec<i8>,
    /// Per 256-block: its scale d (x̂ = d·q).
    pub(super) d: Vec<f32>,
}

impl X8K {
    /// Quantize `x` (its length a multiple of 256); `None` when x holds a NaN or an infinity
    /// (the f32 path then carries it into the result faithfully).
    pub(crate) fn new(x: &[f32]) -> Option<X8K> {
        crate::simd::debug_check_level();
        debug_assert!(x.len().is_multiple_of(X8K_BLOCK));
        let blocks = x.len() / X8K_BLOCK;
        let mut xq = X8K {
            q: vec![0; blocks * X8K_BLOCK],
            d: vec![0.0; blocks],
        };
        // SAFETY: only reached on the x86 levels, after AVX2/FMA/F16C were detected.
        let finite = unsafe { quantize(x, &mut xq) };
        finite.then_some(xq)
    }

    /// Number of 256-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.d.len()
    }
}

/// Whether products of `dtype` rows take the int8 x per 256 (an [`X8KRows`] kernel).
pub(crate) fn takes_x8k(dtype: DType) -> bool {
    with_x8k!(dtype, F => { let _ = std::marker::PhantomData::<F>; true }, else => false)
}

/// Fill `xq` from `x`; false when a block is not finite.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x.len() == 256 * xq.blocks()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize(x: &[f32], xq: &mut X8K) -> bool {
    let sign = _mm256_set1_ps(-0.0);
    // packs interleaves 128-bit lanes: this puts the 32 bytes back in x order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (b, xb) in x.chunks_exact(X8K_BLOCK).enumerate() {
        // SAFETY: 256 values in xb (unaligned loads); block b's 256 quants in q (unaligned
        // stores).
        unsafe {
            let v: [__m256; 32] = std::array::from_fn(|k| _mm256_loadu_ps(xb.as_ptr().add(8 * k)));
            let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for vk in v {
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, vk));
                // max_ps drops a NaN in its second operand: test the values themselves.
                bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(vk, vk));
            }
            let amax = hmax(m);
            if !amax.is_finite() || _mm256_movemask_ps(bad) != 0 {
                return false;
            }
            let inv = match X8_MAX / amax {
                inv if amax > 0.0 && inv.is_finite() => _mm256_set1_ps(inv),
                _ => _mm256_setzero_ps(),
            };
            for k in 0..8 {
                // Round to nearest even (the default MXCSR mode), as `round_ties_even`.
                let i: [__m256i; 4] =
                    std::array::from_fn(|j| _mm256_cvtps_epi32(_mm256_mul_ps(v[4 * k + j], inv)));
                let w = _mm256_packs_epi16(
                    _mm256_packs_epi32(i[0], i[1]),
                    _mm256_packs_epi32(i[2], i[3]),
                );
                let q = _mm256_permutevar8x32_epi32(w, order);
                let at = xq.q.as_mut_ptr().add(X8K_BLOCK * b + 32 * k);
                _mm256_storeu_si256(at.cast(), q);
            }
            xq.d[b] = amax / X8_MAX;
        }
    }
    true
}

/// A format's dot kernel on the int8 x per 256.
pub(super) trait X8KRows {
    /// out[i][t] = dot(row i, token t) for the `R` rows at `p[i]` (`blocks` 256-blocks each)
    /// and the tokens `xs` (`T` of them, at most [`X8K_TOKENS`], each of `blocks` blocks); with
    /// `FETCH` the rows at `next[i]` are fetched alongside. Each (row, token) value is the same
    /// bits whatever `R`, `T` and the other rows and tokens of the call.
    ///
    /// # Safety
    /// The rows readable; the CPU has AVX2, FMA and F16C. `next` may hold any addresses.
    unsafe fn rows<const R: usize, const T: usize, const FETCH: bool>(
        p: &[*const u8; R],
        next: &[*const u8; R],
        xs: &[&X8K; T],
        blocks: usize,
    ) -> [[f32; X8K_TOKENS]; R];
}

/// `$body` with the type `$F` standing for the [`X8KRows`] format of the runtime dtype
/// `$dtype`; `$other` for the formats that do not take the int8 x per 256.
macro_rules! with_x8k {
    ($dtype:expr, $F:ident => $body:expr, else => $other:expr) => {
        with_x8k!(@ $dtype, $F => $body, $other;
            IQ2_XXS = l2::IQ2XXS, IQ2_XS = l2::IQ2XS, IQ2_S = l2::IQ2S)
    };
    (@ $dtype:expr, $F:ident => $body:expr, $other:expr; $($d:ident = $t:ty),*) => {{
        #[allow(unused_imports)]
        use $crate::kernels::avx2::iq2 as l2;
        match $dtype {
            $(powerinfer_core::DType::$d => {
                type $F = $t;
                $body
            })*
            _ => $other,
        }
    }};
}
pub(super) use with_x8k;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::x8k::quantize_x8k;
    use crate::testutil::Rng;

    /// The SIMD quantizer is the reference's, bit for bit: random blocks, outliers, zeros,
    /// tiny and huge values, exact ties; non-finite x refused.
    #[test]
    fn matches_the_reference_quantizer() {
        if !crate::simd::detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(85);
        let mut cases: Vec<Vec<f32>> = (1..=3).map(|b| rng.vec(256 * b)).collect();
        let mut outliers = rng.vec(768);
        outliers[5] = 300.0;
        outliers[700] = -1e4;
        cases.push(outliers);
        cases.push(vec![0.0; 256]);
        cases.push(vec![1e-39; 256]);
        cases.push((0..256).map(|i| (i as f32 - 127.5) * 2e35).collect());
        // x·127/max|x| lands on k + 0.5 for these: ties go to even.
        cases.push(
            (0..256)
                .map(|i| {
                    if i == 0 {
                        127.0
                    } else {
                        (i % 126) as f32 + 0.5
                    }
                })
                .collect(),
        );
        for x in cases {
            let xq = X8K::new(&x).unwrap();
            let (q, d) = quantize_x8k(&x).unwrap();
            assert_eq!(xq.q, q);
            assert_eq!(xq.d, d);
        }
        let mut bad = vec![1.0f32; 512];
        bad[333] = f32::NAN;
        assert!(X8K::new(&bad).is_none());
        bad[333] = f32::NEG_INFINITY;
        assert!(X8K::new(&bad).is_none());
    }
}
