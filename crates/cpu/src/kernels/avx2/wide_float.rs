//! 512-bit forms of the float-format row kernels (F32, F16 and BF16 rows against f32 values),
//! taken on the AVX-512 level: the dense matvec's multi-row dot ([`rows_dot`]), the sparse
//! kernels' dot of scattered rows and their row accumulation y += Σ a_i·row_i ([`dot`],
//! [`axpy`]). One generic kernel per product serves the three formats through [`WideFloat`],
//! which loads 16 values as one vector of f32 (F16: one `vcvtph2ps` of 32 bytes).
//!
//! A float-format dot on one or two threads is bound by the core's vector issue slots, not by
//! memory (dense F16 decode of the synthetic dim-2048 model reaches half the read bandwidth
//! with the AVX2 kernels): a 512-bit step converts and multiplies twice the values per
//! instruction. Each row keeps two accumulators, so a group of four rows has eight FMA chains
//! in flight, enough to cover the FMA latency on two FMA pipes. Row tails shorter than a
//! vector are read with masked loads, which never touch the values past the row's end.
//! Every kernel fetches the rows its caller reads next, line by line in step with its reads,
//! as the AVX2 forms in [`super::rows`] do.

use super::formats::{Bf16, FloatFormat, F16, F32};
use super::rows::{fetch_lines, RowGroup};
use std::arch::x86_64::*;

/// Rows computed together by the dense 512-bit dot ([`rows_dot`]).
pub(super) const WROWS: usize = 4;

/// A float format's values loaded 16 at a time into a 512-bit vector of f32.
pub(super) trait WideFloat: FloatFormat {
    /// The 16 values at `p` as f32.
    ///
    /// # Safety
    /// `16·BYTES` bytes readable at `p` (any alignment); the CPU has the AVX-512 level.
    unsafe fn load16(p: *const u8) -> __m512;

    /// The values at `p` of the lanes set in `m` as f32, zero in the other lanes; only the
    /// selected values are read.
    ///
    /// # Safety
    /// The selected values readable at `p` (any alignment); the CPU has the AVX-512 level.
    unsafe fn load_masked(p: *const u8, m: __mmask16) -> __m512;
}

impl WideFloat for F32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 64 readable bytes per the caller; loadu takes any alignment.
        unsafe { _mm512_loadu_ps(p.cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, m: __mmask16) -> __m512 {
        // SAFETY: the selected values are readable per the caller; masked-off lanes are not
        // accessed (and never fault).
        unsafe { _mm512_maskz_loadu_ps(m, p.cast()) }
    }
}

impl WideFloat for F16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes per the caller; loadu takes any alignment.
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(p.cast()) })
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, m: __mmask16) -> __m512 {
        // SAFETY: the selected halves are readable per the caller; masked-off lanes are not
        // accessed. Zero halves convert to 0.0.
        _mm512_cvtph_ps(unsafe { _mm256_maskz_loadu_epi16(m, p.cast()) })
    }
}

impl WideFloat for Bf16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load16(p: *const u8) -> __m512 {
        // SAFETY: 32 readable bytes per the caller; loadu takes any alignment.
        let raw = unsafe { _mm256_loadu_si256(p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, m: __mmask16) -> __m512 {
        // SAFETY: the selected values are readable per the caller; masked-off lanes are not
        // accessed.
        let raw = unsafe { _mm256_maskz_loadu_epi16(m, p.cast()) };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
    }
}

/// The mask of the first `n < 16` lanes.
#[inline(always)]
fn first_lanes(n: usize) -> __mmask16 {
    debug_assert!(n < 16);
    ((1u32 << n) - 1) as __mmask16
}

/// Fetch the lines of values `c..c + VALUES` of the first `R` rows in `q` (`VALUES·BYTES` a
/// multiple of 64).
#[inline(always)]
fn fetch_values<F: FloatFormat, const R: usize, const VALUES: usize>(
    q: &[*const u8; super::rows::GROUP],
    c: usize,
) {
    for line in 0..VALUES * F::BYTES / 64 {
        fetch_lines::<R>(q, c * F::BYTES + 64 * line);
    }
}

/// out[i] = dot(row i, x) over consecutive rows `row_bytes` apart from `base`: groups of
/// [`WROWS`] rows, each fetching the next group's rows in step, then single rows.
///
/// # Safety
/// `out.len()` rows of `x.len()` values readable at `base`, `row_bytes` apart; the CPU has the
/// AVX-512 level.
#[inline]
pub(super) unsafe fn rows_dot<F: WideFloat>(
    base: *const u8,
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let full = out.len() / WROWS * WROWS;
    for (g, o) in out[..full].chunks_exact_mut(WROWS).enumerate() {
        // The next group's rows: past the end for the last group, harmless for a hint.
        let group = RowGroup::strided(base, row_bytes, g * WROWS, (g + 1) * WROWS);
        // SAFETY: rows g·WROWS.. are within the rows per the caller.
        unsafe { dot::<F, WROWS>(&group, x, o) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        let group = RowGroup::strided(base, row_bytes, i, i + 1);
        // SAFETY: row i is within the rows per the caller.
        unsafe { dot::<F, 1>(&group, x, std::slice::from_mut(o)) };
    }
}

/// out[i] = dot(row i, x) for the group's first `R` rows, two 16-lane accumulators per row
/// (the same arithmetic for a row whatever `R`), the tail through masked loads.
///
/// # Safety
/// `x.len()` values readable at each of the first `R` rows, `out.len() >= R`; the CPU has the
/// AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot<F: WideFloat, const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
    let (p, q) = (&g.p, &g.q);
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 32 <= n {
        fetch_values::<F, R, 32>(q, c);
        // SAFETY: c + 32 <= n: x[c..c + 32] and values c..c + 32 of every row are in bounds.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(c));
            let x1 = _mm512_loadu_ps(xp.add(c + 16));
            for (i, a) in acc.iter_mut().enumerate() {
                let w = p[i].add(c * F::BYTES);
                a[0] = _mm512_fmadd_ps(F::load16(w), x0, a[0]);
                a[1] = _mm512_fmadd_ps(F::load16(w.add(16 * F::BYTES)), x1, a[1]);
            }
        }
        c += 32;
    }
    if c + 16 <= n {
        // SAFETY: as above for 16 values.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(c));
            for (i, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_fmadd_ps(F::load16(p[i].add(c * F::BYTES)), x0, a[0]);
            }
        }
        c += 16;
    }
    if c < n {
        let m = first_lanes(n - c);
        // SAFETY: only the n − c values from c, in bounds in x and every row, are read.
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m, xp.add(c));
            for (i, a) in acc.iter_mut().enumerate() {
                a[1] = _mm512_fmadd_ps(F::load_masked(p[i].add(c * F::BYTES), m), x0, a[1]);
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
    }
}

/// y += Σ a[i]·row i for the group's first `R` rows: y read and written once per 64 values,
/// each y value's sum taken over the rows in order with one FMA per row (the same arithmetic
/// as the AVX2 form, so both give the same bits). Four y vectors per step are four FMA chains,
/// and the steps are independent, so the core overlaps them.
///
/// # Safety
/// `y.len()` values readable at each of the first `R` rows, `a.len() >= R`; the CPU has the
/// AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn axpy<F: WideFloat, const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
    let (p, q) = (&g.p, &g.q);
    let n = y.len();
    let av: [__m512; R] = std::array::from_fn(|i| _mm512_set1_ps(a[i]));
    let yp = y.as_mut_ptr();
    let mut c = 0;
    while c + 64 <= n {
        fetch_values::<F, R, 64>(q, c);
        // SAFETY: c + 64 <= n: y[c..c + 64] and values c..c + 64 of every row are in bounds.
        unsafe {
            let mut yv = [0, 16, 32, 48].map(|k| _mm512_loadu_ps(yp.add(c + k)));
            for (i, &ai) in av.iter().enumerate() {
                let w = p[i].add(c * F::BYTES);
                for (k, v) in yv.iter_mut().enumerate() {
                    *v = _mm512_fmadd_ps(ai, F::load16(w.add(16 * k * F::BYTES)), *v);
                }
            }
            for (k, v) in yv.into_iter().enumerate() {
                _mm512_storeu_ps(yp.add(c + 16 * k), v);
            }
        }
        c += 64;
    }
    while c + 16 <= n {
        // SAFETY: as above for 16 values.
        unsafe {
            let mut v = _mm512_loadu_ps(yp.add(c));
            for (i, &ai) in av.iter().enumerate() {
                v = _mm512_fmadd_ps(ai, F::load16(p[i].add(c * F::BYTES)), v);
            }
            _mm512_storeu_ps(yp.add(c), v);
        }
        c += 16;
    }
    if c < n {
        let m = first_lanes(n - c);
        // SAFETY: only the n − c values from c, in bounds in y and every row, are read and
        // written.
        unsafe {
            let mut v = _mm512_maskz_loadu_ps(m, yp.add(c));
            for (i, &ai) in av.iter().enumerate() {
                v = _mm512_fmadd_ps(ai, F::load_masked(p[i].add(c * F::BYTES), m), v);
            }
            _mm512_mask_storeu_ps(yp.add(c), m, v);
        }
    }
}
