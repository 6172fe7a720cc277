//! Row dequantisation to f32 (for matmul tiles and [`crate::dequantize_row`]).

use super::formats::FloatFormat;
use super::quant::{Offset, QuantFormat};
use std::arch::x86_64::*;

/// Decode a float-format row of `out.len()` values at `row`.
///
/// # Safety
/// `out.len()·F::BYTES` bytes must be readable at `row`; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float_row<F: FloatFormat>(row: *const u8, out: &mut [f32]) {
    let n = out.len();
    let op = out.as_mut_ptr();
    let mut c = 0;
    while c + 8 <= n {
        // SAFETY: c + 8 <= n: values c..c+8 are readable and out[c..c+8] is in bounds.
        unsafe { _mm256_storeu_ps(op.add(c), F::load8(row.add(c * F::BYTES))) };
        c += 8;
    }
    for (k, o) in out.iter_mut().enumerate().skip(c) {
        // SAFETY: value k < n is readable per the caller.
        *o = unsafe { F::load1(row.add(k * F::BYTES)) };
    }
}

/// Decode a quantized row of `out.len()` weights (a multiple of 32) at `row`.
///
/// # Safety
/// `out.len() / 32` blocks must be readable at `row`; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_row<Q: QuantFormat>(row: *const u8, out: &mut [f32]) {
    let op = out.as_mut_ptr();
    for b in 0..out.len() / 32 {
        // SAFETY: block b is readable and out[32b..32b+32] is in bounds per the caller.
        unsafe {
            let p = row.add(b * Q::BLOCK_BYTES);
            let d = Q::scale(p);
            let offset = match Q::OFFSET {
                Offset::None => _mm256_setzero_ps(),
                Offset::MinusEight => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
                Offset::Min => Q::min(p),
            };
            for (k, q) in Q::quants(p).into_iter().enumerate() {
                _mm256_storeu_ps(op.add(32 * b + 8 * k), _mm256_fmadd_ps(d, q, offset));
            }
        }
    }
}
