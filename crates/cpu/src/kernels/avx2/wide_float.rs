//! 512-bit forms of the float-format row kernels (F32, F16 and BF16 rows against f32 values),
//! taken on the AVX-512 level: the dense matvec's dot over consecutive rows ([`rows_dot`]), the
//! sparse kernels' dot of a group of scattered rows and their row accumulation
//! y += Σ a_i·row_i ([`dot`], [`axpy`]). One generic kernel per product serves the three
//! formats through [`WideFloat`], which loads 16 values as one vector of f32 (F16: one
//! `vcvtph2ps` of 32 bytes, BF16: a widening and a 16-bit shift).
//!
//! The dense dot reads a matrix one row after the other, four accumulators per row, fetching a
//! fixed distance ahead: one sequential stream, which the memory system serves at close to its
//! full read bandwidth, where the AVX2 form's rows side by side (four streams, four DRAM pages
//! open at once) reach about three quarters of it. The group kernels keep their rows side by
//! side (two accumulators per row for the dot, four y vectors per step for the accumulation),
//! fetching the rows their caller reads next line by line in step, as the AVX2 forms in
//! [`super::rows`] do. Row tails shorter than a vector are read with masked loads, which never
//! touch the values past a row's end.

use super::formats::{Bf16, FloatFormat, F16, F32};
use super::rows::{fetch_lines, RowGroup};
use std::arch::x86_64::*;

/// How far ahead of its reads the dense dot ([`rows_dot`]) fetches, in bytes.
const AHEAD: usize = 8192;

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

/// out[i] = dot(row i, x) over consecutive rows `row_bytes` apart from `base`, one row after
/// the other, fetching [`AHEAD`] bytes ahead of the reads.
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
    for (i, o) in out.iter_mut().enumerate() {
        let row = base.wrapping_add(i * row_bytes);
        // SAFETY: row i is within the rows per the caller; the fetched addresses (past the
        // matrix for its last rows) are only hints.
        *o = unsafe { dot_row::<F>(row, x, row.wrapping_add(AHEAD)) };
    }
}

/// dot(row, x) for the row at `p`, four 16-lane accumulators (64 values a step), the tail
/// through masked loads; the lines at `fetch` are fetched in step with the reads at `p`.
///
/// One row at a time rather than a group side by side: a dense matrix is then read as one
/// sequential stream, which the memory system serves near its full read bandwidth (dense F16
/// 5504×2048 from DRAM on one thread: 41 GB/s, against 30 GB/s for four rows side by side,
/// whose four streams are four DRAM pages open at once).
///
/// # Safety
/// `x.len()` values readable at `p`; the CPU has the AVX-512 level. `fetch` may be any address
/// (prefetches never fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_row<F: WideFloat>(p: *const u8, x: &[f32], fetch: *const u8) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut c = 0;
    while c + 64 <= n {
        // The 64·BYTES bytes of this step are BYTES lines.
        for line in 0..F::BYTES {
            // A hint: it never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(fetch.wrapping_add(c * F::BYTES + 64 * line).cast());
        }
        // SAFETY: c + 64 <= n: x[c..c + 64] and the row's values c..c + 64 are in bounds.
        unsafe {
            for (k, a) in acc.iter_mut().enumerate() {
                let x0 = _mm512_loadu_ps(xp.add(c + 16 * k));
                *a = _mm512_fmadd_ps(F::load16(p.add((c + 16 * k) * F::BYTES)), x0, *a);
            }
        }
        c += 64;
    }
    while c + 16 <= n {
        // SAFETY: as above for 16 values.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(c));
            acc[0] = _mm512_fmadd_ps(F::load16(p.add(c * F::BYTES)), x0, acc[0]);
        }
        c += 16;
    }
    if c < n {
        let m = first_lanes(n - c);
        // SAFETY: only the n − c values from c, in bounds in x and in the row, are read.
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m, xp.add(c));
            acc[1] = _mm512_fmadd_ps(F::load_masked(p.add(c * F::BYTES), m), x0, acc[1]);
        }
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(sum)
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
