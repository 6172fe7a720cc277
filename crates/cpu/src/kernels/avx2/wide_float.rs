//! 512-bit forms of the float-format row kernels (F32, F16 and BF16 rows against f32 values),
//! taken on the AVX-512 level: the dense matvec's dot over consecutive rows ([`rows_dot`]), the
//! sparse kernels' dot of a group of scattered rows and their row accumulation
//! y += Σ a_i·row_i ([`dot`], [`axpy`]). One generic kernel per product serves the three
//! formats through [`WideFloat`], which loads 16 values as one vector of f32 (F16: one
//! `vcvtph2ps` of 32 bytes, BF16: a widening and a 16-bit shift).
//!
//! Besides halving the instructions per value (which is what counts for rows in cache), these
//! kernels read memory in a different order from the AVX2 forms in [`super::rows`], which read
//! four (dense) or eight (scattered) rows side by side: from DRAM, fewer streams at once are
//! served faster. The dense dot reads a matrix one row after the other (one sequential stream,
//! fetched a fixed distance ahead); the group kernels read their scattered rows two side by
//! side, each pair fetching the next pair line by line in step. Row tails shorter than a vector
//! are read with masked loads, which never touch the values past a row's end.

use super::formats::{Bf16, FloatFormat, F16, F32};
use super::row_group::{RowGroup, GROUP};
use std::arch::x86_64::*;

/// How far ahead of its reads the dense dot ([`rows_dot`]) fetches, in bytes.
const AHEAD: usize = 8192;
/// Rows the group kernels ([`dot`], [`axpy`]) read side by side.
const SIDE: usize = 2;

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
/// 5504×2048 from DRAM on one thread: 41–44 GB/s, against 30 GB/s for four rows side by side;
/// the read probe gives 42 GB/s).
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

/// Row `j` of the group's reading order: its `R` rows, then the rows it fetches (which repeat
/// its own rows where the caller has fewer to read next).
#[inline(always)]
fn row_at<const R: usize>(g: &RowGroup, j: usize) -> *const u8 {
    match j < R {
        true => g.p[j],
        false => g.q[(j - R).min(GROUP - 1)],
    }
}

/// Rows `s..s + S` of the group's reading order, and the `S` rows after them (to fetch).
#[inline(always)]
fn rows_from<const R: usize, const S: usize>(
    g: &RowGroup,
    s: usize,
) -> ([*const u8; S], [*const u8; S]) {
    (
        std::array::from_fn(|i| row_at::<R>(g, s + i)),
        std::array::from_fn(|i| row_at::<R>(g, s + S + i)),
    )
}

/// Fetch the lines of values `c..c + VALUES` of the `S` rows at `q` (`VALUES·BYTES` a multiple
/// of 64) into the cache.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fetch<F: FloatFormat, const S: usize, const VALUES: usize>(q: &[*const u8; S], c: usize) {
    for line in 0..VALUES * F::BYTES / 64 {
        for qi in q {
            // A hint: it never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(qi.wrapping_add(c * F::BYTES + 64 * line).cast());
        }
    }
}

/// out[i] = dot(row i, x) for the group's first `R` rows, [`SIDE`] rows side by side at a
/// time, each pair fetching the next pair in step (the last pair: the caller's next rows).
///
/// A pair at a time rather than all `R` rows side by side: fewer streams open at once, which
/// the memory system serves faster (F16 rows of 2048, 30% of 5504 rows, from DRAM on one
/// thread: 33 GB/s, against 27 GB/s for eight rows side by side and 32 GB/s for the AVX2 form),
/// and fewer loads of x per row than one row at a time.
///
/// # Safety
/// `x.len()` values readable at each of the first `R` rows, `out.len() >= R`; the CPU has the
/// AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn dot<F: WideFloat, const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
    let mut s = 0;
    while s + SIDE <= R {
        let (p, q) = rows_from::<R, SIDE>(g, s);
        // SAFETY: rows s..s + SIDE are among the group's first R rows, readable per the caller.
        unsafe { dot_side::<F, SIDE>(&p, &q, x, &mut out[s..s + SIDE]) };
        s += SIDE;
    }
    while s < R {
        let (p, q) = rows_from::<R, 1>(g, s);
        // SAFETY: as above, for row s.
        unsafe { dot_side::<F, 1>(&p, &q, x, &mut out[s..s + 1]) };
        s += 1;
    }
}

/// out[i] = dot(row i, x) for the `S` rows at `p`, side by side, two 16-lane accumulators per
/// row (the same arithmetic for a row whatever `S`), the tail through masked loads; the rows
/// at `q` are fetched in step.
///
/// # Safety
/// `x.len()` values readable at each `p[i]`, `out.len() >= S`; the CPU has the AVX-512 level.
/// `q` may hold any addresses (prefetches never fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_side<F: WideFloat, const S: usize>(
    p: &[*const u8; S],
    q: &[*const u8; S],
    x: &[f32],
    out: &mut [f32],
) {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 2]; S];
    let mut c = 0;
    while c + 32 <= n {
        fetch::<F, S, 32>(q, c);
        // SAFETY: c + 32 <= n: x[c..c + 32] and values c..c + 32 of every row are in bounds.
        unsafe {
            let x0 = _mm512_loadu_ps(xp.add(c));
            let x1 = _mm512_loadu_ps(xp.add(c + 16));
            for (a, pi) in acc.iter_mut().zip(p) {
                let w = pi.add(c * F::BYTES);
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
            for (a, pi) in acc.iter_mut().zip(p) {
                a[0] = _mm512_fmadd_ps(F::load16(pi.add(c * F::BYTES)), x0, a[0]);
            }
        }
        c += 16;
    }
    if c < n {
        let m = first_lanes(n - c);
        // SAFETY: only the n − c values from c, in bounds in x and every row, are read.
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m, xp.add(c));
            for (a, pi) in acc.iter_mut().zip(p) {
                a[1] = _mm512_fmadd_ps(F::load_masked(pi.add(c * F::BYTES), m), x0, a[1]);
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
    }
}

/// y += Σ a[i]·row i for the group's first `R` rows, [`SIDE`] rows at a time, each pair
/// fetching the next pair in step (as [`dot`]; F16 rows of 2048, 30% of 5504, from DRAM on
/// one thread: 33 GB/s, against 26 GB/s for eight rows side by side and 29 GB/s for the AVX2
/// form). Each y value's sum is taken over the rows in order with one FMA per row, y stored
/// exactly in between: the same arithmetic as the AVX2 form, so both give the same bits.
///
/// # Safety
/// `y.len()` values readable at each of the first `R` rows, `a.len() >= R`; the CPU has the
/// AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn axpy<F: WideFloat, const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
    let mut s = 0;
    while s + SIDE <= R {
        let (p, q) = rows_from::<R, SIDE>(g, s);
        // SAFETY: rows s..s + SIDE are among the group's first R rows, readable per the caller.
        unsafe { axpy_side::<F, SIDE>(&p, &q, &a[s..s + SIDE], y) };
        s += SIDE;
    }
    while s < R {
        let (p, q) = rows_from::<R, 1>(g, s);
        // SAFETY: as above, for row s.
        unsafe { axpy_side::<F, 1>(&p, &q, &a[s..s + 1], y) };
        s += 1;
    }
}

/// y += Σ a[i]·row i for the `S` rows at `p`: y read and written once per 64 values, the
/// rows' FMAs in row order; the rows at `q` are fetched in step. Four y vectors per step are
/// four FMA chains, and the steps are independent, so the core overlaps them.
///
/// # Safety
/// `y.len()` values readable at each `p[i]`, `a.len() >= S`; the CPU has the AVX-512 level.
/// `q` may hold any addresses (prefetches never fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn axpy_side<F: WideFloat, const S: usize>(
    p: &[*const u8; S],
    q: &[*const u8; S],
    a: &[f32],
    y: &mut [f32],
) {
    let n = y.len();
    let av: [__m512; S] = std::array::from_fn(|i| _mm512_set1_ps(a[i]));
    let yp = y.as_mut_ptr();
    let mut c = 0;
    while c + 64 <= n {
        fetch::<F, S, 64>(q, c);
        // SAFETY: c + 64 <= n: y[c..c + 64] and values c..c + 64 of every row are in bounds.
        unsafe {
            let mut yv = [0, 16, 32, 48].map(|k| _mm512_loadu_ps(yp.add(c + k)));
            for (&ai, pi) in av.iter().zip(p) {
                let w = pi.add(c * F::BYTES);
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
            for (&ai, pi) in av.iter().zip(p) {
                v = _mm512_fmadd_ps(ai, F::load16(pi.add(c * F::BYTES)), v);
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
            for (&ai, pi) in av.iter().zip(p) {
                v = _mm512_fmadd_ps(ai, F::load_masked(pi.add(c * F::BYTES), m), v);
            }
            _mm512_mask_storeu_ps(yp.add(c), m, v);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The float-format row kernels on odd shapes (row counts off the pair, column counts off
    //! the 16- and 64-value steps), AVX2 and 512-bit forms, against the f64 reference.

    use super::super::{dot_group, rows_dot, wide_choices, GROUP};
    use crate::testutil::{assert_dot_close, random_row, Rng, DOT_ABS_TOL, DOT_REL_TOL};
    use powerinfer_core::DType;

    const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    const COLS: [usize; 16] = [
        1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 129, 1001, 2050,
    ];

    /// `f(rng, dtype, cols)` for every float format and column count; nothing on CPUs without
    /// AVX2.
    fn each_shape(seed: u64, mut f: impl FnMut(&mut Rng, DType, usize)) {
        if !crate::simd::detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(seed);
        for dtype in FLOATS {
            for cols in COLS {
                f(&mut rng, dtype, cols);
            }
        }
    }

    #[test]
    fn rows_dot_matches_reference_on_odd_shapes() {
        each_shape(61, |rng, dtype, cols| {
            for rows in [1, 2, 3, 4, 5, 9] {
                let row_bytes = dtype.row_bytes(cols).unwrap();
                let bytes: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(rng, dtype, cols))
                    .collect();
                let x = rng.vec(cols);
                for wide in wide_choices() {
                    let mut out = vec![f32::NAN; rows];
                    rows_dot(dtype, &bytes, row_bytes, &x, &mut out, wide);
                    for (r, &got) in out.iter().enumerate() {
                        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        assert_dot_close(got, dtype, row, &x, &format!("rows_dot wide={wide}"));
                    }
                }
            }
        });
    }

    #[test]
    fn group_dot_matches_reference_on_odd_shapes() {
        each_shape(62, |rng, dtype, cols| {
            let rows: Vec<Vec<u8>> = (0..2 * GROUP)
                .map(|_| random_row(rng, dtype, cols))
                .collect();
            let refs: Vec<&[u8]> = rows.iter().map(|r| &r[..]).collect();
            let x = rng.vec(cols);
            for n in 1..=GROUP {
                for next in [0, 1, n, GROUP] {
                    for wide in wide_choices() {
                        let mut out = vec![f32::NAN; n];
                        dot_group(
                            dtype,
                            &refs[..n],
                            &refs[GROUP..GROUP + next],
                            &x,
                            &mut out,
                            wide,
                        );
                        for (r, &got) in out.iter().enumerate() {
                            let what = format!("dot_group {n} rows wide={wide}");
                            assert_dot_close(got, dtype, refs[r], &x, &what);
                        }
                    }
                }
            }
        });
    }

    #[test]
    fn axpy_group_matches_reference_and_both_forms_agree() {
        each_shape(63, |rng, dtype, cols| {
            let rows: Vec<Vec<u8>> = (0..2 * GROUP)
                .map(|_| random_row(rng, dtype, cols))
                .collect();
            let refs: Vec<&[u8]> = rows.iter().map(|r| &r[..]).collect();
            let decoded: Vec<Vec<f32>> = rows
                .iter()
                .map(|r| {
                    let mut w = vec![0f32; cols];
                    crate::reference::dequantize_row(dtype, r, &mut w).unwrap();
                    w
                })
                .collect();
            let y0 = rng.vec(cols);
            for n in 1..=GROUP {
                let a = rng.vec(n);
                let mut first: Option<Vec<f32>> = None;
                for wide in wide_choices() {
                    let mut y = y0.clone();
                    let next = &refs[GROUP..GROUP + n.min(3)];
                    super::super::axpy_group(dtype, &refs[..n], next, &a, &mut y, wide);
                    for (c, &got) in y.iter().enumerate() {
                        let terms = a
                            .iter()
                            .zip(&decoded)
                            .map(|(&ai, w)| ai as f64 * w[c] as f64);
                        let want = y0[c] as f64 + terms.clone().sum::<f64>();
                        let scale = y0[c].abs() as f64 + terms.map(f64::abs).sum::<f64>();
                        let err = (got as f64 - want).abs();
                        let tol = DOT_REL_TOL * scale + DOT_ABS_TOL;
                        assert!(
                            err <= tol,
                            "axpy {dtype} {n} rows x {cols} wide={wide} [{c}]: got {got}, want {want}"
                        );
                    }
                    // One FMA per row in row order in both forms: the same bits.
                    match &first {
                        None => first = Some(y),
                        Some(f) => assert_eq!(f, &y, "axpy {dtype} {n} rows x {cols}"),
                    }
                }
            }
        });
    }
}
