//! The generic AVX2 + FMA + F16C row kernels over a [`RowGroup`] (rows read together, each
//! anywhere in memory): row accumulation y += Σ_i a_i · row_i (y is loaded and stored once per
//! group of rows, not once per row) and dot products of float-format rows with one x (every x
//! vector feeds all rows, and the rows stream from memory side by side), decoding each format
//! on the fly: F16 with `vcvtph2ps`, BF16 by a 16-bit shift, Q8_0 one 32-weight block at a time
//! (Q4_0/Q4_1 rows go to the integer kernel in `q4_axpy`, which falls back to this block
//! decoder where coefficients are not finite; quantized rows' dots use the int16-x kernel in
//! [`super::int16`]). Each call also fetches the rows its caller reads next, line by line in
//! step with its own reads. The formats' [`super::formats::Format`] impls (in `super::select`)
//! are built from these; the entry points that pick them by dtype are in `super` (the avx2
//! module).

use super::formats::FloatFormat;
use super::quant::{Offset, QuantFormat};
use super::reduce::hsum;
use super::row_group::{fetch_lines, RowGroup};
use std::arch::x86_64::*;

/// y += Σ a[i]·row i for `R` float-format rows.
///
/// # Safety
/// `y.len()` values readable at each `p[i]`, `a.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float_axpy<F: FloatFormat, const R: usize>(
    g: &RowGroup,
    a: &[f32],
    y: &mut [f32],
) {
    let (p, q) = (&g.p, &g.q);
    let n = y.len();
    let av: [__m256; R] = std::array::from_fn(|i| _mm256_set1_ps(a[i]));
    let yp = y.as_mut_ptr();
    let mut c = 0;
    while c + 16 <= n {
        if (c * F::BYTES) % 64 == 0 {
            fetch_lines::<R>(q, c * F::BYTES);
        }
        // SAFETY: c + 16 <= n: y[c..c+16] in bounds and values c..c+16 readable in every row.
        unsafe {
            let mut y0 = _mm256_loadu_ps(yp.add(c));
            let mut y1 = _mm256_loadu_ps(yp.add(c + 8));
            for i in 0..R {
                let w = p[i].add(c * F::BYTES);
                y0 = _mm256_fmadd_ps(av[i], F::load8(w), y0);
                y1 = _mm256_fmadd_ps(av[i], F::load8(w.add(8 * F::BYTES)), y1);
            }
            _mm256_storeu_ps(yp.add(c), y0);
            _mm256_storeu_ps(yp.add(c + 8), y1);
        }
        c += 16;
    }
    while c + 8 <= n {
        // SAFETY: as above for 8 values.
        unsafe {
            let mut y0 = _mm256_loadu_ps(yp.add(c));
            for i in 0..R {
                y0 = _mm256_fmadd_ps(av[i], F::load8(p[i].add(c * F::BYTES)), y0);
            }
            _mm256_storeu_ps(yp.add(c), y0);
        }
        c += 8;
    }
    for (k, yk) in y.iter_mut().enumerate().skip(c) {
        for i in 0..R {
            // SAFETY: value k < n is readable in every row.
            *yk = a[i].mul_add(unsafe { F::load1(p[i].add(k * F::BYTES)) }, *yk);
        }
    }
}

/// out[i] = dot(row i, x) for `R` float-format rows, two accumulators per row.
///
/// # Safety
/// `x.len()` values readable at each `p[i]`, `out.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn float_dot<F: FloatFormat, const R: usize>(
    g: &RowGroup,
    x: &[f32],
    out: &mut [f32],
) {
    let (p, q) = (&g.p, &g.q);
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 16 <= n {
        if (c * F::BYTES) % 64 == 0 {
            fetch_lines::<R>(q, c * F::BYTES);
        }
        // SAFETY: c + 16 <= n: x[c..c+16] and values c..c+16 of every row are in bounds.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            let x1 = _mm256_loadu_ps(xp.add(c + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                let w = p[i].add(c * F::BYTES);
                a[0] = _mm256_fmadd_ps(F::load8(w), x0, a[0]);
                a[1] = _mm256_fmadd_ps(F::load8(w.add(8 * F::BYTES)), x1, a[1]);
            }
        }
        c += 16;
    }
    if c + 8 <= n {
        // SAFETY: as above for 8 values.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            for (i, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(F::load8(p[i].add(c * F::BYTES)), x0, a[0]);
            }
        }
        c += 8;
    }
    for (i, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let mut sum = hsum(_mm256_add_ps(a[0], a[1]));
        for (k, &xk) in x.iter().enumerate().skip(c) {
            // SAFETY: value k < n of row i is readable.
            sum += unsafe { F::load1(p[i].add(k * F::BYTES)) } * xk;
        }
        *o = sum;
    }
}

/// y += Σ a[i]·row i for `R` quantized rows (`y.len()` a multiple of 32).
///
/// # Safety
/// `y.len() / 32` blocks readable at each `p[i]`, `a.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_axpy<Q: QuantFormat, const R: usize>(
    g: &RowGroup,
    a: &[f32],
    y: &mut [f32],
) {
    let (p, q) = (&g.p, &g.q);
    let yp = y.as_mut_ptr();
    for b in 0..y.len() / 32 {
        fetch_lines::<R>(q, b * Q::BLOCK_BYTES);
        // SAFETY: block b of every row is readable and y[32b..32b+32] is in bounds.
        unsafe {
            let yb = yp.add(32 * b);
            let mut acc = [0, 8, 16, 24].map(|k| _mm256_loadu_ps(yb.add(k)));
            let mut off = 0f32;
            for i in 0..R {
                let (d, m, q) = Q::block(p[i].add(b * Q::BLOCK_BYTES));
                let ad = _mm256_set1_ps(a[i] * d);
                off = a[i].mul_add(m, off);
                for (ak, qk) in acc.iter_mut().zip(q) {
                    *ak = _mm256_fmadd_ps(ad, qk, *ak);
                }
            }
            for (k, ak) in acc.into_iter().enumerate() {
                let v = match Q::OFFSET == Offset::Min {
                    true => _mm256_add_ps(ak, _mm256_set1_ps(off)),
                    false => ak,
                };
                _mm256_storeu_ps(yb.add(8 * k), v);
            }
        }
    }
}
