//! Multi-row dot products: `R` weight rows against one x at a time, so every x vector loaded
//! from memory feeds `R` rows. One generic kernel for the float formats, one for the quantized.

use super::formats::{FloatFormat, Offset, QuantFormat};
use super::hsum;
use std::arch::x86_64::*;

/// out[i] = dot(row i, x) for `R` float rows starting at `rows`, `row_bytes` apart.
///
/// # Safety
/// `R` rows of `x.len()` values each must be readable at `rows + i·row_bytes`; `out.len() >= R`;
/// the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float_rows<F: FloatFormat, const R: usize>(
    rows: *const u8,
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let n = x.len();
    let xp = x.as_ptr();
    let row = |i: usize, c: usize| rows.wrapping_add(i * row_bytes + c * F::BYTES);
    // Two accumulators per row hide the FMA latency.
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 16 <= n {
        if (c * F::BYTES) % 64 == 0 {
            // The next tile's rows (the R rows after these; past the end for the last tile,
            // harmless for a hint), fetched line by line in step with these rows' reads.
            for i in R..2 * R {
                _mm_prefetch::<_MM_HINT_T0>(row(i, c) as *const i8);
            }
        }
        // SAFETY: c + 16 <= n, so x[c..c+16] and each row's values c..c+16 are in bounds.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            let x1 = _mm256_loadu_ps(xp.add(c + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(F::load8(row(i, c)), x0, a[0]);
                a[1] = _mm256_fmadd_ps(F::load8(row(i, c + 8)), x1, a[1]);
            }
        }
        c += 16;
    }
    if c + 8 <= n {
        // SAFETY: c + 8 <= n, as above.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            for (i, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(F::load8(row(i, c)), x0, a[0]);
            }
        }
        c += 8;
    }
    for (i, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let mut sum = hsum(_mm256_add_ps(a[0], a[1]));
        for (k, &xk) in x.iter().enumerate().skip(c) {
            // SAFETY: value k < n of row i is in bounds per the caller.
            let bytes = unsafe { std::slice::from_raw_parts(row(i, k), F::BYTES) };
            sum += F::scalar(bytes) * xk;
        }
        *o = sum;
    }
}

/// out[i] = dot(row i, x) for `R` quantized rows starting at `rows`, `row_bytes` apart.
/// Offsets are folded per block through Σx: d·Σq·x + offset·Σx.
///
/// # Safety
/// `R` rows of `x.len() / 32` blocks must be readable at `rows + i·row_bytes`;
/// `x.len() % 32 == 0`; `out.len() >= R`; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_rows<Q: QuantFormat, const R: usize>(
    rows: *const u8,
    row_bytes: usize,
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
                let p = rows.add(i * row_bytes + b * Q::BLOCK_BYTES);
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
