//! The integer matvec path for quantized weights: x is quantized once per call to int16 with one
//! scale per 32-block (never to int8), and each block's Σq·x is computed exactly in i32 with
//! `pmaddwd`, then scaled by d·s_x in f32. The only approximation is x's int16 rounding
//! (|δx| ≤ max|x_block| / 65534), which keeps every dot within the crate's tolerance while
//! doing half the work per block of the f32 path.

use super::formats::{Offset, QuantFormat};
use super::hsum;
use std::arch::x86_64::*;

/// Largest int16 magnitude used for x.
const X_MAX: f32 = 32767.0;

/// x quantized to int16, per 32-weight block.
pub(crate) struct XQuant {
    /// round(x / scale), 32 per block.
    q: Vec<i16>,
    /// Per block: x ≈ scale · q.
    scale: Vec<f32>,
    /// Per block: Σx / 8 (in f32, from the unquantized x), for the Q4_1 min term.
    sum8: Vec<f32>,
}

impl XQuant {
    /// Quantize `x` (length a multiple of 32); `None` when x holds a NaN or infinity (the f32
    /// path then propagates it faithfully).
    pub(crate) fn new(x: &[f32]) -> Option<XQuant> {
        super::debug_check_level();
        let blocks = x.len() / 32;
        let mut xq = XQuant {
            q: vec![0; blocks * 32],
            scale: vec![0.0; blocks],
            sum8: vec![0.0; blocks],
        };
        // SAFETY: only reached on the AVX2 path, after the features were detected.
        let finite = unsafe { quantize_blocks(x, &mut xq) };
        finite.then_some(xq)
    }

    /// Number of 32-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.scale.len()
    }
}

/// Fill `xq` from `x`; false when some block is not finite.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_blocks(x: &[f32], xq: &mut XQuant) -> bool {
    let sign = _mm256_set1_ps(-0.0);
    let blocks = x.chunks_exact(32).zip(xq.q.chunks_exact_mut(32));
    for ((xb, qb), (scale, sum8)) in blocks.zip(xq.scale.iter_mut().zip(&mut xq.sum8)) {
        // SAFETY: xb has 32 values, loaded as four unaligned vectors.
        let v = unsafe { [0, 8, 16, 24].map(|k| _mm256_loadu_ps(xb.as_ptr().add(k))) };
        let abs = v.map(|vk| _mm256_andnot_ps(sign, vk));
        let amax = hmax(_mm256_max_ps(
            _mm256_max_ps(abs[0], abs[1]),
            _mm256_max_ps(abs[2], abs[3]),
        ));
        let sum = hsum(_mm256_add_ps(
            _mm256_add_ps(v[0], v[1]),
            _mm256_add_ps(v[2], v[3]),
        ));
        // NaN fails `is_finite` on the sum even where max_ps dropped it.
        if !amax.is_finite() || !sum.is_finite() {
            return false;
        }
        let inv = _mm256_set1_ps(if amax > 0.0 { X_MAX / amax } else { 0.0 });
        // Round to nearest (the default MXCSR mode); |v·inv| <= 32767, so packs never clips.
        let i = v.map(|vk| _mm256_cvtps_epi32(_mm256_mul_ps(vk, inv)));
        // packs works per 128-bit lane: reorder the 64-bit quarters back into x order.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[0], i[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[2], i[3]));
        // SAFETY: qb has 32 i16 = two 32-byte unaligned stores.
        unsafe {
            _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, lo);
            _mm256_storeu_si256(qb.as_mut_ptr().add(16) as *mut __m256i, hi);
        }
        *scale = amax / X_MAX;
        *sum8 = sum * 0.125;
    }
    true
}

/// Largest of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// out[i] = dot(row i, x) for `R` quantized rows at `rows`, `row_bytes` apart, on the int16 x.
///
/// # Safety
/// `R` rows of `xq.blocks()` blocks must be readable at `rows + i·row_bytes`; `out.len() >= R`;
/// the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_rows_i16<Q: QuantFormat, const R: usize>(
    rows: *const u8,
    row_bytes: usize,
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let xp = xq.q.as_ptr();
    for b in 0..xq.blocks() {
        // SAFETY: b < blocks, so xq.q[32b..32b+32] and every row's block b are in bounds per
        // the caller.
        unsafe {
            let xa = _mm256_loadu_si256(xp.add(32 * b) as *const __m256i);
            let xb = _mm256_loadu_si256(xp.add(32 * b + 16) as *const __m256i);
            let sx = _mm256_set1_ps(*xq.scale.get_unchecked(b));
            // Q4_0: Σ(q − 8)·x = Σq·x − 8·Σx, the second term shared by all rows (exact in i32).
            let eight = _mm256_set1_epi16(8);
            let bias = if Q::OFFSET == Offset::MinusEight {
                _mm256_add_epi32(_mm256_madd_epi16(eight, xa), _mm256_madd_epi16(eight, xb))
            } else {
                _mm256_setzero_si256()
            };
            let sum8 = if Q::OFFSET == Offset::Min {
                _mm256_set1_ps(*xq.sum8.get_unchecked(b))
            } else {
                _mm256_setzero_ps()
            };
            for (i, a) in acc.iter_mut().enumerate() {
                let p = rows.add(i * row_bytes + b * Q::BLOCK_BYTES);
                let [ql, qh] = Q::quants16(p);
                let mut s = _mm256_add_epi32(_mm256_madd_epi16(ql, xa), _mm256_madd_epi16(qh, xb));
                if Q::OFFSET == Offset::MinusEight {
                    s = _mm256_sub_epi32(s, bias);
                }
                let ds = _mm256_mul_ps(Q::scale(p), sx);
                *a = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(s), *a);
                if Q::OFFSET == Offset::Min {
                    *a = _mm256_fmadd_ps(Q::min(p), sum8, *a);
                }
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(*a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_x_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let xq = XQuant::new(&x).unwrap();
        for (b, xb) in x.chunks_exact(32).enumerate() {
            for (k, &v) in xb.iter().enumerate() {
                let back = xq.q[32 * b + k] as f32 * xq.scale[b];
                assert!((back - v).abs() <= 0.5 * xq.scale[b] * 1.001 + 1e-12);
            }
            assert!((xq.sum8[b] * 8.0 - xb.iter().sum::<f32>()).abs() < 1e-5);
        }
        assert!(XQuant::new(&[0.0; 32]).unwrap().q.iter().all(|&q| q == 0));
        let mut bad = vec![1.0f32; 64];
        bad[40] = f32::NAN;
        assert!(XQuant::new(&bad).is_none());
    }
}
