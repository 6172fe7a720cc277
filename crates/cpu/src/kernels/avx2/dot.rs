//! The quantized formats' f32 multi-row dot product: `R` weight rows against one x at a time,
//! so every x vector loaded from memory feeds `R` rows (the path for an x that the int16 kernel
//! of [`super::int16`] cannot take; the float formats' kernel is [`super::rows::float_dot`]).

use super::quant::{Offset, QuantFormat};
use super::reduce::hsum;
use super::row_group::RowGroup;
use std::arch::x86_64::*;

/// out[i] = dot(row i, x) for the group's first `R` quantized rows (its fetch addresses are not
/// used). Offsets are folded per block through Σx: d·Σq·x + offset·Σx.
///
/// # Safety
/// `x.len() / 32` blocks must be readable at each of the `R` rows; `x.len() % 32 == 0`;
/// `out.len() >= R`; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_rows<Q: QuantFormat, const R: usize>(
    g: &RowGroup,
    x: &[f32],
    out: &mut [f32],
) {
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..x.len() / 32 {
        // SAFETY: block b < x.len() / 32, so x[32b..32b+32] and every row's block b are in
        // bounds per the caller.
        unsafe {
            let xb = xp.add(32 * b);
            let xv = [
                _mm256_loadu_ps(xb),
                _mm256_loadu_ps(xb.add(8)),
                _mm256_loadu_ps(xb.add(16)),
                _mm256_loadu_ps(xb.add(24)),
            ];
            // Lane-wise Σx of the block (its lanes add up to the block's Σx).
            let sx = if Q::OFFSET == Offset::None {
                _mm256_setzero_ps()
            } else {
                _mm256_add_ps(_mm256_add_ps(xv[0], xv[1]), _mm256_add_ps(xv[2], xv[3]))
            };
            // Q4_0: d·(Σq·x − 8·Σx), so start each row's block sum at −8·Σx.
            let start = if Q::OFFSET == Offset::MinusEight {
                _mm256_mul_ps(sx, _mm256_set1_ps(-8.0))
            } else {
                _mm256_setzero_ps()
            };
            for (i, a) in acc.iter_mut().enumerate() {
                let p = g.p[i].add(b * Q::BLOCK_BYTES);
                let q = Q::quants(p);
                let mut t = _mm256_fmadd_ps(q[0], xv[0], start);
                t = _mm256_fmadd_ps(q[1], xv[1], t);
                t = _mm256_fmadd_ps(q[2], xv[2], t);
                t = _mm256_fmadd_ps(q[3], xv[3], t);
                *a = _mm256_fmadd_ps(Q::scale(p), t, *a);
                if Q::OFFSET == Offset::Min {
                    *a = _mm256_fmadd_ps(Q::min(p), sx, *a);
                }
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(*a);
    }
}
