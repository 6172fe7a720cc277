//! AVX2 kernel of the input-sparse matvec ([`crate::ops::input_major`]): a range of output rows
//! over the kept columns of some groups.
//!
//! Quantized lines: per 32-row sub-tile and pair of kept columns, 16 bytes (4-bit) or 32 bytes
//! (i8) of each column are widened to int16 and interleaved, so one `vpmaddwd` against the
//! pair's broadcast int16 inputs adds both columns' products for 8 rows; four int32 vectors
//! hold the sub-tile's exact group sums, scaled into the f32 output once per group. Float lines
//! accumulate f32 FMAs over 64 rows at a time.

use std::arch::x86_64::*;

use crate::operands::input_major::{ActiveInput, GroupInput, InputMajor, Lines, ScaleType, SUB};

/// Eight consecutive entries of a scale table as f32.
trait Table {
    const BYTES: usize;
    /// # Safety
    /// `p` points at 8 readable entries; AVX2/F16C available.
    unsafe fn load8(p: *const u8) -> __m256;
}

struct F16Table;
struct F32Table;

impl Table for F16Table {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes at p and F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
}

impl Table for F32Table {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 32 readable bytes at p.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
}

/// `out` (rows `rows.0..rows.1`, whole sub-tiles) = Σ over `groups` of their kept columns
/// times their inputs.
pub(crate) fn cols_tile(
    m: &InputMajor,
    rows: (usize, usize),
    a: &ActiveInput,
    groups: &[GroupInput],
    out: &mut [f32],
) {
    assert!(
        rows.0.is_multiple_of(SUB)
            && rows.1.is_multiple_of(SUB)
            && rows.0 <= rows.1
            && rows.1 <= m.rows_pad
    );
    assert!(out.len() >= rows.1 - rows.0);
    for gi in groups {
        assert!((gi.g as usize) < m.n_groups);
        assert!(gi.pairs.1 as usize <= a.pairs.len() && gi.cols.1 as usize <= a.cols.len());
    }
    // Every column index in a pair or list is < m.group (ActiveInput::fill checks the group
    // length against the matrix's), so every line read below lies inside its chunk.
    debug_assert!(a.cols.iter().all(|&c| (c as usize) < m.group));
    // SAFETY: AVX2/FMA/F16C are present (dispatch reaches here only on those levels); bounds as
    // argued above.
    unsafe {
        match (m.lines, m.scales) {
            (Lines::F32 | Lines::F16 | Lines::BF16, _) => float_rows(m, rows, a, groups, out),
            (_, ScaleType::F16) => quant_rows::<F16Table>(m, rows, a, groups, out),
            (_, ScaleType::F32) => quant_rows::<F32Table>(m, rows, a, groups, out),
        }
    }
}

/// Sixteen int16 of 16 rows of a sub-tile's line at `p`: the low (`high` false) or high
/// nibbles of 16 bytes, or 16 i8 (the first or second 16 bytes) sign-extended.
#[inline(always)]
unsafe fn widen(lines: Lines, p: *const u8, high: bool) -> __m256i {
    // SAFETY: the caller guarantees the sub-tile's 16 (nibble) or 32 (i8) bytes at p.
    unsafe {
        match lines {
            Lines::Nibble => {
                let v = _mm_loadu_si128(p as *const __m128i);
                let v = if high { _mm_srli_epi16(v, 4) } else { v };
                _mm256_cvtepu8_epi16(_mm_and_si128(v, _mm_set1_epi8(15)))
            }
            _ => {
                let q = if high { p.add(16) } else { p };
                _mm256_cvtepi8_epi16(_mm_loadu_si128(q as *const __m128i))
            }
        }
    }
}

/// Add one pair of columns' products into the int32 sums of 32 rows.
#[inline(always)]
unsafe fn pair_sub(lines: Lines, p0: *const u8, p1: *const u8, x: __m256i, acc: &mut [__m256i; 4]) {
    // SAFETY: the caller guarantees the sub-tile's bytes at p0 and p1.
    unsafe {
        let (a0, b0) = (widen(lines, p0, false), widen(lines, p1, false));
        let (a1, b1) = (widen(lines, p0, true), widen(lines, p1, true));
        let q = [
            _mm256_unpacklo_epi16(a0, b0),
            _mm256_unpackhi_epi16(a0, b0),
            _mm256_unpacklo_epi16(a1, b1),
            _mm256_unpackhi_epi16(a1, b1),
        ];
        for (acc, q) in acc.iter_mut().zip(q) {
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(q, x));
        }
    }
}

/// Groups fetched ahead of the one being computed.
const AHEAD: usize = 2;

/// Fetch into L2 the cache lines of rows `rows` of group `gi`'s scale and min tables and of
/// its kept columns.
#[inline(always)]
unsafe fn prefetch_group(m: &InputMajor, a: &ActiveInput, gi: &GroupInput, rows: (usize, usize)) {
    let fetch = |p: *const u8, from: usize, to: usize| {
        let mut at = from;
        while at < to {
            // SAFETY: a prefetch is a hint and never faults; the address is inside the data.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(at) as *const i8) };
            at += 64;
        }
    };
    // SAFETY: g < n_groups (checked by cols_tile): the chunk is inside the data.
    let chunk = unsafe { m.data.as_ptr().add(gi.g as usize * m.chunk_bytes) };
    if !m.lines.is_float() {
        let eb = m.scale_table_bytes() / m.rows_pad;
        let tables = 1 + m.has_min as usize;
        for t in 0..tables {
            let base = t * m.scale_table_bytes();
            fetch(chunk, base + rows.0 * eb, base + rows.1 * eb);
        }
    }
    let sub_bytes = m.lines.sub_bytes();
    let (from, to) = (rows.0 / SUB * sub_bytes, rows.1 / SUB * sub_bytes);
    // SAFETY: the body is inside the chunk.
    let body = unsafe { chunk.add(m.table_bytes()) };
    for &c in &a.cols[gi.cols.0 as usize..gi.cols.1 as usize] {
        // SAFETY: column c < group: its line is inside the body.
        fetch(unsafe { body.add(c as usize * m.line_bytes) }, from, to);
    }
}

/// Fetch the groups `AHEAD` after group `k` (and, at `k` = 0, the first ones too).
#[inline(always)]
unsafe fn prefetch_ahead(
    m: &InputMajor,
    a: &ActiveInput,
    groups: &[GroupInput],
    k: usize,
    rows: (usize, usize),
) {
    let from = if k == 0 { 0 } else { k + AHEAD };
    for gi in groups.iter().take(k + AHEAD + 1).skip(from) {
        // SAFETY: as prefetch_group's.
        unsafe { prefetch_group(m, a, gi, rows) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant_rows<T: Table>(
    m: &InputMajor,
    rows: (usize, usize),
    a: &ActiveInput,
    groups: &[GroupInput],
    out: &mut [f32],
) {
    let lb = m.line_bytes;
    let sub_bytes = m.lines.sub_bytes();
    let mins_at = m.scale_table_bytes();
    let body_at = m.table_bytes();
    let outp = out.as_mut_ptr();
    // SAFETY: out holds rows.1 − rows.0 floats.
    unsafe { std::ptr::write_bytes(outp, 0, rows.1 - rows.0) };
    for (k, gi) in groups.iter().enumerate() {
        // SAFETY: the chunk is group g's (g < n_groups); every line read is
        // c · lb + sub · sub_bytes + (< sub_bytes) with c < group and sub < rows_pad / 32,
        // inside the chunk's body; tables hold rows_pad entries; out holds the range's rows.
        unsafe {
            prefetch_ahead(m, a, groups, k, rows);
            let chunk = m.data.as_ptr().add(gi.g as usize * m.chunk_bytes);
            let body = chunk.add(body_at);
            let pairs = &a.pairs[gi.pairs.0 as usize..gi.pairs.1 as usize];
            let xs = _mm256_set1_ps(gi.xs);
            let offsum = _mm256_set1_epi32(m.off * gi.sumq);
            let minx = _mm256_set1_ps(gi.xs * gi.sumq as f32);
            for sub in rows.0 / SUB..rows.1 / SUB {
                let mut acc = [_mm256_setzero_si256(); 4];
                let o = sub * sub_bytes;
                for p in pairs {
                    let p0 = body.add(p.c[0] as usize * lb + o);
                    let p1 = body.add(p.c[1] as usize * lb + o);
                    pair_sub(m.lines, p0, p1, _mm256_set1_epi32(p.xq), &mut acc);
                }
                for (v, acc) in acc.iter().enumerate() {
                    let r = SUB * sub + 8 * v;
                    let sums = _mm256_cvtepi32_ps(_mm256_add_epi32(*acc, offsum));
                    let s = T::load8(chunk.add(r * T::BYTES));
                    let mut y = _mm256_mul_ps(s, _mm256_mul_ps(xs, sums));
                    if m.has_min {
                        let mn = T::load8(chunk.add(mins_at + r * T::BYTES));
                        y = _mm256_add_ps(y, _mm256_mul_ps(mn, minx));
                    }
                    let o = outp.add(r - rows.0);
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), y));
                }
            }
        }
    }
}

/// Eight values of a float line from row `r` as f32.
#[inline(always)]
unsafe fn load_float(lines: Lines, line: *const u8, r: usize) -> __m256 {
    // SAFETY: the caller guarantees the line holds rows r..r + 8.
    unsafe {
        match lines {
            Lines::F32 => _mm256_loadu_ps((line as *const f32).add(r)),
            Lines::F16 => _mm256_cvtph_ps(_mm_loadu_si128(line.add(2 * r) as *const __m128i)),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(line.add(2 * r) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
        }
    }
}

/// Add `N`·8 rows from `r` of group `gi`'s kept columns times their inputs into `out`.
#[inline(always)]
unsafe fn float_block<const N: usize>(
    m: &InputMajor,
    r: usize,
    a: &ActiveInput,
    gi: &GroupInput,
    out: *mut f32,
) {
    // SAFETY: the caller guarantees N·8 floats at out; the chunk is group g's, its lines inside
    // it, rows < rows_pad.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); N];
        for (v, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_loadu_ps(out.add(8 * v));
        }
        let body = m.data.as_ptr().add(gi.g as usize * m.chunk_bytes);
        for k in gi.cols.0 as usize..gi.cols.1 as usize {
            let line = body.add(a.cols[k] as usize * m.line_bytes);
            let x = _mm256_set1_ps(a.x[k]);
            for (v, acc) in acc.iter_mut().enumerate() {
                let w = load_float(m.lines, line, r + 8 * v);
                *acc = _mm256_fmadd_ps(x, w, *acc);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(8 * v), *acc);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_rows(
    m: &InputMajor,
    rows: (usize, usize),
    a: &ActiveInput,
    groups: &[GroupInput],
    out: &mut [f32],
) {
    out[..rows.1 - rows.0].fill(0.0);
    for (k, gi) in groups.iter().enumerate() {
        // SAFETY: g < n_groups (checked by cols_tile).
        unsafe { prefetch_ahead(m, a, groups, k, rows) };
        let mut r = rows.0;
        while r < rows.1 {
            // SAFETY: out holds rows.1 − rows.0 floats; blocks of 64 rows, then one of 32.
            unsafe {
                let o = out.as_mut_ptr().add(r - rows.0);
                if rows.1 - r >= 64 {
                    float_block::<8>(m, r, a, gi, o);
                    r += 64;
                } else {
                    float_block::<4>(m, r, a, gi, o);
                    r += 32;
                }
            }
        }
    }
}
