//! AVX2 + FMA + F16C kernels over a group of rows read together, each row anywhere in memory
//! (the sparse kernels' scattered rows, or consecutive rows of a dense matrix). Row accumulation
//! y += Σ_i a_i · row_i (y is loaded and stored once per group of rows, not once per row),
//! decoding each format on the fly: F16 with `vcvtph2ps`, BF16 by a 16-bit shift, Q8_0 one
//! 32-weight block at a time (Q4_0/Q4_1 rows go to the integer kernel in `q4_axpy`, which
//! falls back to this block decoder where coefficients are not finite). Dot products of a
//! group of float-format rows with one x (every x vector feeds all rows, and the rows stream
//! from memory side by side; quantized rows use the int16-x kernel in [`super::int16`]). Each
//! call also fetches the rows its caller reads next, line by line in step with its own reads.
//! Reached only through [`crate::dispatch`] once AVX2/FMA/F16C have been detected.

use super::formats::{with_format, with_rows, with_wide_float, FloatFormat, Format};
use super::quant::{Offset, QuantFormat};
use super::reduce::hsum;
use super::wide_float;
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Rows accumulated together.
pub(crate) const GROUP: usize = 8;

/// Start addresses of up to [`GROUP`] rows read together (`p`), and of the rows to fetch while
/// reading them (`q`): the rows the caller reads next, each fetched line by line in step with
/// this group's reads, so the memory system always has the following rows in flight.
pub(super) struct RowGroup {
    pub(super) p: [*const u8; GROUP],
    pub(super) q: [*const u8; GROUP],
}

impl RowGroup {
    /// The group `rows`, fetching `next`. Slots without a next row repeat this group's own
    /// rows, whose lines are cached by then.
    fn scattered(rows: &[&[u8]], next: &[&[u8]]) -> RowGroup {
        let mut p = [std::ptr::null::<u8>(); GROUP];
        for (pi, r) in p.iter_mut().zip(rows) {
            *pi = r.as_ptr();
        }
        let mut q = p;
        for (qi, r) in q.iter_mut().zip(next) {
            *qi = r.as_ptr();
        }
        RowGroup { p, q }
    }

    /// Rows `first..` of the matrix at `base` (rows `row_bytes` apart), fetching rows `next..`.
    /// The addresses are only computed (past the matrix for its last group, harmless for a
    /// fetch); the kernels read as many rows as they are told.
    pub(super) fn strided(base: *const u8, row_bytes: usize, first: usize, next: usize) -> Self {
        RowGroup {
            p: std::array::from_fn(|i| base.wrapping_add((first + i) * row_bytes)),
            q: std::array::from_fn(|i| base.wrapping_add((next + i) * row_bytes)),
        }
    }

    /// The group `rows` (fetching `next`), after checking each row holds `weights` weights of
    /// `dtype` and there are `coefs` coefficients or outputs for them.
    fn checked(dtype: DType, rows: &[&[u8]], next: &[&[u8]], weights: usize, coefs: usize) -> Self {
        debug_assert!(crate::simd::detect().is_x86_simd());
        let want = dtype.row_bytes(weights).unwrap_or(usize::MAX);
        assert!(rows.len() == coefs && rows.len() <= GROUP && rows.iter().all(|r| r.len() >= want));
        RowGroup::scattered(rows, next)
    }
}

/// y += Σ_i a[i] · row i, for the `n <= GROUP` rows `rows[..n]`, each holding `y.len()` weights
/// of `dtype` (sizes checked by the caller).
/// `wide`: float-format rows take the 512-bit kernel (only on the AVX-512 level).
pub(crate) fn axpy_group(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    a: &[f32],
    y: &mut [f32],
    wide: bool,
) {
    crate::simd::debug_check_wide(wide);
    let g = RowGroup::checked(dtype, rows, next, y.len(), a.len());
    // SAFETY: features detected (the dispatcher's contract, checked in debug builds), the
    // AVX-512 level where `wide`; the check above keeps every row's y.len() weights readable.
    unsafe {
        with_rows!(rows.len(), R => with_wide_float!(wide, dtype,
            F => wide_float::axpy::<F, R>(&g, a, y),
            else => with_format!(dtype, F => F::axpy::<R>(&g, a, y))))
    }
}

/// out[i] = dot(rows[i], x) for the `n <= GROUP` rows `rows[..n]`, each holding `x.len()`
/// values of `dtype` (sizes checked by the caller), fetching the `next` rows alongside.
/// Quantized rows take the f32 path here; the int16-x kernel (`super::scattered_dot_i16`) is
/// the fast one for them.
/// `wide`: float-format rows take the 512-bit kernel (only on the AVX-512 level).
pub(crate) fn dot_group(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    x: &[f32],
    out: &mut [f32],
    wide: bool,
) {
    crate::simd::debug_check_wide(wide);
    let g = RowGroup::checked(dtype, rows, next, x.len(), out.len());
    // SAFETY: features detected (the dispatcher's contract, checked in debug builds), the
    // AVX-512 level where `wide`; the check above keeps every row's x.len() weights readable.
    unsafe {
        with_rows!(rows.len(), R => with_wide_float!(wide, dtype,
            F => wide_float::dot::<F, R>(&g, x, out),
            else => with_format!(dtype, F => F::dot::<R>(&g, x, out))))
    }
}

/// Hint the cache to fetch the line at byte `off` of each of the first `R` rows in `q`.
#[inline(always)]
pub(super) fn fetch_lines<const R: usize>(q: &[*const u8; GROUP], off: usize) {
    for qi in q.iter().take(R) {
        // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is baseline
        // on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(qi.wrapping_add(off) as *const i8) };
    }
}

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
