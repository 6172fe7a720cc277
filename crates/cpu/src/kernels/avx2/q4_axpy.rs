//! Row accumulation y += Σ_i a_i · row_i over a group of 4-bit rows (Q4_0, Q4_1) on integer
//! multiplies: 1.3x faster than decoding every block to f32 (one thread, SmolLM2's down_t of
//! 1536 rows of 576 weights, all rows: 75 vs 98 µs); scattered rows at 2 threads are bound by
//! memory rather than arithmetic and gain little.
//!
//! Per 32-weight block b the group's coefficients c_i = a_i · d_ib (d_ib: row i's block scale)
//! are rounded to signed bytes k_i on one shared scale s_b = max_i |c_i| / 127. Rows are taken
//! in pairs, their nibbles interleaved byte by byte, and `vpmaddubsw` multiplies each nibble
//! pair by the pair's coefficient bytes; the pairs' 16-bit sums add up without overflow (at
//! most 8 rows: 8 · 15 · 127 < 2^15). Each block is then scaled back to f32 once per group:
//! y_j += s_b · Σ_i k_i q_ij + offset_b, where the offset carries the blocks' mins (Q4_1) and
//! centres the rounding on q = 8, so the error of weight column j is at most
//! Σ_i (s_b / 2) · |q_ij − 8|: relative to the largest term, about 1/254 per row, the
//! precision llama.cpp gets from its 8-bit activations. Coefficients are prepared for eight
//! blocks at a time, one block per vector lane; a chunk whose coefficients are not all finite
//! goes to the f32 kernel instead, so infinities and NaNs propagate as in the reference.

use super::quant::{Offset, QuantFormat};
use super::row_group::{fetch_lines, RowGroup, GROUP};
use super::rows::quant_axpy;
use std::arch::x86_64::*;

/// Blocks whose coefficients are prepared together (one per lane of an f32 vector).
const CHUNK: usize = 8;

/// Pairs of rows in a full group.
const PAIRS: usize = GROUP / 2;

/// One chunk's quantized coefficients.
struct Coefficients {
    /// Per pair of rows and block: the two coefficient bytes (first row low), repeated to fill
    /// 32 bits so a plain 32-bit broadcast spreads them over a vector.
    pairs: [[i32; CHUNK]; PAIRS],
    /// Per block: s_b.
    scale: [f32; CHUNK],
    /// Per block: the constant added to every weight column.
    offset: [f32; CHUNK],
}

/// y += Σ a[i]·row i for `R` rows of a 4-bit format (`y.len()` a multiple of 32), fetching the
/// rows at `q` alongside.
///
/// # Safety
/// `y.len() / 32` blocks readable at each of `p[..R]`, `a.len() >= R`; the CPU has
/// AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_axpy<Q: QuantFormat, const R: usize>(
    g: &RowGroup,
    a: &[f32],
    y: &mut [f32],
) {
    let (p, q) = (&g.p, &g.q);
    let blocks = y.len() / 32;
    let mut b0 = 0;
    while b0 < blocks {
        let len = CHUNK.min(blocks - b0);
        let (start, end) = (b0 * Q::BLOCK_BYTES, (b0 + len) * Q::BLOCK_BYTES);
        for off in (start..end).step_by(64).chain([end - 1]) {
            fetch_lines::<R>(q, off);
        }
        let ys = &mut y[32 * b0..32 * (b0 + len)];
        // SAFETY: blocks b0..b0+len of every row are readable (the caller's contract).
        let coef = unsafe { coefficients::<Q, R>(p, a, b0, len) };
        match coef {
            // SAFETY: as above; ys holds the chunk's 32·len values.
            Some(c) => unsafe { integer_blocks::<Q, R>(p, b0, &c, ys) },
            None => {
                let pc = p.map(|r| r.wrapping_add(start));
                let rest = RowGroup { p: pc, q: pc };
                // SAFETY: the rows from block b0 on hold ys.len() / 32 readable blocks.
                unsafe { quant_axpy::<Q, R>(&rest, a, ys) };
            }
        }
        b0 += len;
    }
}

/// The quantized coefficients of blocks b0..b0+len (len <= CHUNK) of the `R` rows, or `None`
/// when one of them is not finite.
///
/// # Safety
/// Blocks b0..b0+len readable at each of `p[..R]`, `a.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn coefficients<Q: QuantFormat, const R: usize>(
    p: &[*const u8; GROUP],
    a: &[f32],
    b0: usize,
    len: usize,
) -> Option<Coefficients> {
    let abs = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let mut c = [_mm256_setzero_ps(); R];
    let mut max = _mm256_setzero_ps();
    let mut bad = _mm256_setzero_ps();
    // Σ_i a_i·m_i + 8·c_i: the blocks' mins, and the centring of q on 8 (Q4_1).
    let mut base = _mm256_setzero_ps();
    // Byte offsets of the chunk's blocks, and the lanes that hold one.
    let offsets = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(Q::BLOCK_BYTES as i32),
    );
    let live = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(len as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    // Within each 128-bit lane: the low 16 bits (d) of the four 32-bit words to bytes 0..8,
    // the high 16 bits (m) to bytes 8..16.
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
        10, 11, 14, 15,
    );
    for (i, ci) in c.iter_mut().enumerate() {
        let first = p[i].wrapping_add(b0 * Q::BLOCK_BYTES) as *const i32;
        // SAFETY: the first 4 bytes of blocks b0..b0+len of row i are readable; masked-off
        // lanes are not read.
        let words = unsafe {
            _mm256_mask_i32gather_epi32::<1>(_mm256_setzero_si256(), first, offsets, live)
        };
        // [d0..4 m0..4 | d4..8 m4..8] -> [d0..8 | m0..8].
        let halves = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(words, split));
        let ai = _mm256_set1_ps(a[i]);
        *ci = _mm256_mul_ps(ai, _mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
        let mag = _mm256_andnot_ps(abs, *ci);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(mag, inf));
        max = _mm256_max_ps(max, mag);
        if Q::OFFSET == Offset::Min {
            let mv = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(halves));
            base = _mm256_fmadd_ps(ai, mv, base);
            base = _mm256_fmadd_ps(_mm256_set1_ps(8.0), *ci, base);
        }
    }
    if _mm256_movemask_ps(bad) != 0 {
        return None;
    }
    let scale = _mm256_div_ps(max, _mm256_set1_ps(127.0));
    let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(max, _mm256_setzero_ps());
    let inv = _mm256_and_ps(positive, _mm256_div_ps(_mm256_set1_ps(127.0), max));
    let k: [__m256i; R] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(c[i], inv)));
    let ksum = k
        .iter()
        .fold(_mm256_setzero_si256(), |s, &ki| _mm256_add_epi32(s, ki));
    // offset = base − 8·s·Σk: with the mins and the centring, Σ_i s·k_i·q_ij + offset is
    // Σ_i s·k_i·(q_ij − 8) + Σ_i (a_i·m_i + 8·c_i) (Q4_1) or Σ_i s·k_i·(q_ij − 8) (Q4_0).
    let eight_s = _mm256_mul_ps(_mm256_set1_ps(8.0), scale);
    let offset = _mm256_fnmadd_ps(eight_s, _mm256_cvtepi32_ps(ksum), base);
    let mut out = Coefficients {
        pairs: [[0; CHUNK]; PAIRS],
        scale: [0.0; CHUNK],
        offset: [0.0; CHUNK],
    };
    let low = _mm256_set1_epi32(0xFF);
    for (pair, slot) in out.pairs.iter_mut().enumerate().take(R.div_ceil(2)) {
        let first = _mm256_and_si256(k[2 * pair], low);
        // An odd group's last pair has a zero second coefficient.
        let second = match 2 * pair + 1 < R {
            true => _mm256_slli_epi32::<8>(_mm256_and_si256(k[2 * pair + 1], low)),
            false => _mm256_setzero_si256(),
        };
        let word = _mm256_or_si256(first, second);
        let both = _mm256_or_si256(word, _mm256_slli_epi32::<16>(word));
        // SAFETY: slot holds 8 i32.
        unsafe { _mm256_storeu_si256(slot.as_mut_ptr() as *mut __m256i, both) };
    }
    // SAFETY: scale and offset hold 8 f32 each.
    unsafe {
        _mm256_storeu_ps(out.scale.as_mut_ptr(), scale);
        _mm256_storeu_ps(out.offset.as_mut_ptr(), offset);
    }
    Some(out)
}

/// y += the chunk starting at block b0 (ys: its 32·len values) on the prepared coefficients.
///
/// # Safety
/// Blocks b0..b0 + ys.len()/32 readable at each of `p[..R]`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn integer_blocks<Q: QuantFormat, const R: usize>(
    p: &[*const u8; GROUP],
    b0: usize,
    c: &Coefficients,
    ys: &mut [f32],
) {
    // Low nibbles in the low 128-bit lane (weights 0..16), high nibbles in the high lane.
    let shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    let mask = _mm256_set1_epi8(0x0F);
    let nibbles = |row: *const u8| {
        // SAFETY: the block's 16 nibble bytes are readable (the caller's contract).
        let raw = unsafe { _mm_loadu_si128(row as *const __m128i) };
        _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_broadcastsi128_si256(raw), shift),
            mask,
        )
    };
    for (t, yb) in ys.chunks_exact_mut(32).enumerate() {
        let at = (b0 + t) * Q::BLOCK_BYTES + Q::QS;
        // 16-bit sums; lo: weights 0..8 and 16..24, hi: 8..16 and 24..32.
        let mut lo = _mm256_setzero_si256();
        let mut hi = _mm256_setzero_si256();
        for pair in 0..R.div_ceil(2) {
            let first = p[2 * pair];
            let second = p[(2 * pair + 1).min(R - 1)];
            // SAFETY: block b0 + t of both rows is readable.
            let (qa, qb) = unsafe { (nibbles(first.add(at)), nibbles(second.add(at))) };
            let k = _mm256_set1_epi32(c.pairs[pair][t]);
            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_unpacklo_epi8(qa, qb), k));
            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_unpackhi_epi8(qa, qb), k));
        }
        let s = _mm256_set1_ps(c.scale[t]);
        let off = _mm256_set1_ps(c.offset[t]);
        let parts = [
            (0, _mm256_castsi256_si128(lo)),
            (8, _mm256_castsi256_si128(hi)),
            (16, _mm256_extracti128_si256::<1>(lo)),
            (24, _mm256_extracti128_si256::<1>(hi)),
        ];
        let yp = yb.as_mut_ptr();
        for (j, v) in parts {
            let sum = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(v));
            // SAFETY: yb holds 32 values, j + 8 <= 32.
            unsafe {
                let yv = _mm256_add_ps(_mm256_loadu_ps(yp.add(j)), off);
                _mm256_storeu_ps(yp.add(j), _mm256_fmadd_ps(sum, s, yv));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::axpy_group;
    use crate::simd::detect;
    use crate::testutil::{random_row, Rng};
    use half::f16;
    use powerinfer_core::DType;

    /// y0 + Σ_i a_i·row_i computed the kernel's way in f64 (coefficients rounded exactly as
    /// it rounds them), and the scale of the terms it adds (for the f32 rounding allowance).
    fn mirror(dtype: DType, rows: &[Vec<u8>], a: &[f32], y0: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (bb, qs, min) = match dtype {
            DType::Q4_0 => (18, 2, false),
            _ => (20, 4, true),
        };
        let half_at = |r: &[u8], at: usize| f16::from_le_bytes([r[at], r[at + 1]]).to_f32();
        let mut want: Vec<f64> = y0.iter().map(|&v| v as f64).collect();
        let mut scale: Vec<f64> = y0.iter().map(|&v| v.abs() as f64).collect();
        for b in 0..y0.len() / 32 {
            let blk = |i: usize| &rows[i][b * bb..(b + 1) * bb];
            let c: Vec<f32> = (0..rows.len()).map(|i| a[i] * half_at(blk(i), 0)).collect();
            let max = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inv = if max > 0.0 { 127.0 / max } else { 0.0 };
            let s = (max / 127.0) as f64;
            for j in 0..32 {
                let (w, sc) = (&mut want[32 * b + j], &mut scale[32 * b + j]);
                for (i, &ci) in c.iter().enumerate() {
                    let k = (ci * inv).round_ties_even() as f64;
                    let byte = blk(i)[qs + j % 16];
                    let q = if j < 16 { byte & 0x0F } else { byte >> 4 } as f64;
                    *w += s * k * (q - 8.0);
                    *sc += (s * k).abs() * 16.0 + 8.0 * (ci as f64).abs();
                    if min {
                        let am = a[i] as f64 * half_at(blk(i), 2) as f64;
                        *w += am + 8.0 * ci as f64;
                        *sc += am.abs();
                    }
                }
            }
        }
        (want, scale)
    }

    /// `f(dtype, rng)` for each 4-bit format, on a generator seeded with `seed`; nothing on
    /// CPUs without AVX2.
    fn each_q4(seed: u64, mut f: impl FnMut(DType, &mut Rng)) {
        if !detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(seed);
        for dtype in [DType::Q4_0, DType::Q4_1] {
            f(dtype, &mut rng);
        }
    }

    #[test]
    fn matches_its_rounding_model_exactly() {
        each_q4(41, |dtype, rng| {
            for blocks in [1, 7, 8, 9, 18, 25] {
                for n in 1..=8 {
                    let cols = 32 * blocks;
                    let rows: Vec<Vec<u8>> = (0..n).map(|_| random_row(rng, dtype, cols)).collect();
                    let mut a = rng.vec(n);
                    if n > 2 {
                        a[1] = 0.0;
                    }
                    let y0 = rng.vec(cols);
                    let refs: Vec<&[u8]> = rows.iter().map(|r| &r[..]).collect();
                    let mut got = y0.clone();
                    axpy_group(dtype, &refs, &refs[..1], &a, &mut got, false);
                    let (want, scale) = mirror(dtype, &rows, &a, &y0);
                    for j in 0..cols {
                        let err = (got[j] as f64 - want[j]).abs();
                        let tol = 1e-5 * scale[j] + 1e-6;
                        assert!(
                            err <= tol,
                            "{dtype} {n} rows x {cols} [{j}]: got {}, want {}, err {err:e} > {tol:e}",
                            got[j],
                            want[j]
                        );
                    }
                }
            }
        });
    }

    #[test]
    fn non_finite_coefficients_propagate() {
        each_q4(42, |dtype, rng| {
            for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
                let rows: Vec<Vec<u8>> = (0..5).map(|_| random_row(rng, dtype, 320)).collect();
                let refs: Vec<&[u8]> = rows.iter().map(|r| &r[..]).collect();
                let a = [0.5, -1.0, bad, 2.0, 0.25];
                let mut y = rng.vec(320);
                axpy_group(dtype, &refs, &[], &a, &mut y, false);
                assert!(y.iter().all(|v| !v.is_finite()), "{dtype} a = {bad}");
            }
        });
    }
}
