//! 512-bit kernels of the query-block attention (see `crate::ops::attend_block`), taken on the
//! AVX-512 level: scores as a 4-query × 64-position register block over the transposed keys
//! (every key vector loaded once per four queries, no horizontal sums), the masked softmax row
//! on a vector form of [`crate::kernels::exp_nonpositive`], and the weighted value sums as a
//! 4-query × 64-value register block while the value rows stream by.

use crate::operands::attention::{ScoreBlock, ValueBlock};
use std::arch::x86_64::*;

/// Queries per register block.
const QB: usize = 4;
/// 16-lane vectors per register block (64 positions in the scores, 64 values in the sums).
const VB: usize = 4;

/// The scores of a query sub-block (see [`ScoreBlock`]).
///
/// # Safety
/// `sb.width` is a multiple of 16; row c < hd of the transposed keys holds `width` positions
/// at `c · kt_stride`; every query has hd values at `b · q_stride`; `s` holds n_q rows of
/// `width`; the CPU has the AVX-512 level.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn scores(sb: &ScoreBlock<'_>, s: &mut [f32]) {
    let vecs = sb.width / 16;
    let mut b = 0;
    while b < sb.n_q {
        let nb = (sb.n_q - b).min(QB);
        let mut j = 0;
        while j < vecs {
            let nv = (vecs - j).min(VB);
            let at = Block {
                kt: sb.kt[16 * j..].as_ptr(),
                kt_stride: sb.kt_stride,
                hd: sb.hd,
                q: sb.q[b * sb.q_stride..].as_ptr(),
                q_stride: sb.q_stride,
                s: s[b * sb.width + 16 * j..].as_mut_ptr(),
                s_stride: sb.width,
                scale: sb.scale,
            };
            // SAFETY: queries b..b + nb and position vectors j..j + nv exist, per the caller.
            unsafe {
                match (nb, nv) {
                    (4, 4) => score_block::<4, 4>(at),
                    (4, 3) => score_block::<4, 3>(at),
                    (4, 2) => score_block::<4, 2>(at),
                    (4, _) => score_block::<4, 1>(at),
                    (3, _) => score_block::<3, 1>(at),
                    (2, _) => score_block::<2, 1>(at),
                    _ => score_block::<1, 1>(at),
                }
            }
            // Short query blocks take one vector at a time (rare: the tail of a prefill).
            j += if nb == QB { nv } else { 1 };
        }
        b += nb;
    }
}

/// One register block of [`scores`]: `R` queries by `V` vectors of positions.
#[derive(Clone, Copy)]
struct Block {
    kt: *const f32,
    kt_stride: usize,
    hd: usize,
    q: *const f32,
    q_stride: usize,
    s: *mut f32,
    s_stride: usize,
    scale: f32,
}

/// # Safety
/// As for [`scores`], for the block's R queries and V vectors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn score_block<const R: usize, const V: usize>(b: Block) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for c in 0..b.hd {
        // SAFETY: row c of kt holds npad positions, the block's V vectors among them; query r
        // holds hd values.
        unsafe {
            let row = b.kt.add(c * b.kt_stride);
            let k: [__m512; V] = std::array::from_fn(|v| _mm512_loadu_ps(row.add(16 * v)));
            for (r, a) in acc.iter_mut().enumerate() {
                let qv = _mm512_set1_ps(*b.q.add(r * b.q_stride + c));
                for (av, kv) in a.iter_mut().zip(&k) {
                    *av = _mm512_fmadd_ps(qv, *kv, *av);
                }
            }
        }
    }
    let scale = _mm512_set1_ps(b.scale);
    for (r, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            // SAFETY: score row r holds the block's V vectors.
            unsafe {
                _mm512_storeu_ps(b.s.add(r * b.s_stride + 16 * v), _mm512_mul_ps(*av, scale))
            };
        }
    }
}

/// e^x for x <= 0 (and NaN for NaN), sixteen lanes: the polynomial of
/// [`crate::kernels::exp_nonpositive`] with the same range reduction.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn exp16(x: __m512) -> __m512 {
    // max(−87, x) keeps a NaN x (the second operand is returned when either is NaN).
    let x = _mm512_max_ps(_mm512_set1_ps(-87.0), x);
    let t = _mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        _mm512_set1_ps(0.5),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(t);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_add_ps(
        _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r),
        _mm512_set1_ps(1.0),
    );
    // n in −126..=0 here: 2^n as a float's exponent field (a NaN n converts to i32::MIN,
    // leaving e's NaN to decide the product).
    let pow2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(e, _mm512_castsi512_ps(pow2))
}

/// The 16 lanes of vector `j` (positions 16j..16j + 16) that fall in `lo..hi`.
#[inline]
fn lanes_in(j: usize, lo: usize, hi: usize) -> __mmask16 {
    let (start, end) = (16 * j, 16 * j + 16);
    let (a, b) = (lo.clamp(start, end) - start, hi.clamp(start, end) - start);
    (((1u32 << b) - 1) & !((1u32 << a) - 1)) as __mmask16
}

/// row[p] = e^(row[p] − max) for p in lo..hi, max over those positions; every other entry 0;
/// returns the sum of the row.
///
/// # Safety
/// `row.len()` is a multiple of 16 and `lo < hi <= row.len()`; the CPU has the AVX-512 level.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn softmax_row(row: &mut [f32], lo: usize, hi: usize) -> f32 {
    let rp = row.as_mut_ptr();
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    for j in lo / 16..hi.div_ceil(16) {
        // SAFETY: vector j lies inside the row (hi <= len, a multiple of 16).
        let x = unsafe { _mm512_loadu_ps(rp.add(16 * j)) };
        m = _mm512_mask_max_ps(m, lanes_in(j, lo, hi), m, x);
    }
    let max = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    let mut sum = _mm512_setzero_ps();
    for j in 0..row.len() / 16 {
        let k = lanes_in(j, lo, hi);
        // SAFETY: as above; vectors outside lo..hi are only written (with zeros).
        unsafe {
            let e = match k {
                0 => _mm512_setzero_ps(),
                _ => _mm512_maskz_mov_ps(
                    k,
                    exp16(_mm512_sub_ps(_mm512_loadu_ps(rp.add(16 * j)), max)),
                ),
            };
            _mm512_storeu_ps(rp.add(16 * j), e);
            sum = _mm512_add_ps(sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

/// The weighted value sums of a query sub-block (see [`ValueBlock`]).
///
/// # Safety
/// `vb.s` holds inv.len() rows of `width >= np`; position p < np has hd values at
/// `p · stride` of `vb.values`; `out` holds every query's hd values at `b · out_stride`; the
/// CPU has the AVX-512 level.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn values(vb: &ValueBlock<'_>, out: &mut [f32], out_stride: usize) {
    let n_q = vb.inv.len();
    let mut b = 0;
    while b < n_q {
        let nb = (n_q - b).min(QB);
        for c0 in (0..vb.hd).step_by(16 * VB) {
            let at = Sums {
                s: vb.s[b * vb.width..].as_ptr(),
                width: vb.width,
                np: vb.np,
                inv: vb.inv[b..].as_ptr(),
                v: vb.values[c0..].as_ptr(),
                stride: vb.stride,
                cols: (vb.hd - c0).min(16 * VB),
                out: out[b * out_stride + c0..].as_mut_ptr(),
                out_stride,
            };
            // SAFETY: queries b..b + nb exist and values c0..c0 + cols of every position and
            // output row, per the caller.
            unsafe {
                match nb {
                    4 => sum_block::<4>(at),
                    3 => sum_block::<3>(at),
                    2 => sum_block::<2>(at),
                    _ => sum_block::<1>(at),
                }
            }
        }
        b += nb;
    }
}

/// One register block of [`values`]: queries from `s`/`inv`/`out`, `cols` (<= 64) values from
/// `v` and `out`.
#[derive(Clone, Copy)]
struct Sums {
    s: *const f32,
    width: usize,
    np: usize,
    inv: *const f32,
    v: *const f32,
    stride: usize,
    cols: usize,
    out: *mut f32,
    out_stride: usize,
}

/// # Safety
/// As for [`values`], for the block's R queries and `cols` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sum_block<const R: usize>(b: Sums) {
    let masks: [__mmask16; VB] = std::array::from_fn(|v| lanes_in(v, 0, b.cols));
    let mut acc = [[_mm512_setzero_ps(); VB]; R];
    for p in 0..b.np {
        // SAFETY: position p holds `cols` values from v (lanes past them are masked off);
        // score row r holds np entries.
        unsafe {
            // Masked-off vectors may point past the values: wrapping, never dereferenced.
            let row = b.v.wrapping_add(p * b.stride);
            let vv: [__m512; VB] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], row.wrapping_add(16 * v)));
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*b.s.add(r * b.width + p));
                for (av, x) in a.iter_mut().zip(&vv) {
                    *av = _mm512_fmadd_ps(w, *x, *av);
                }
            }
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: inv holds R values; output row r holds `cols` values from out (masked).
        unsafe {
            let inv = _mm512_set1_ps(*b.inv.add(r));
            let o = b.out.wrapping_add(r * b.out_stride);
            for (v, av) in a.iter().enumerate() {
                let at = o.wrapping_add(16 * v);
                _mm512_mask_storeu_ps(at, masks[v], _mm512_mul_ps(*av, inv));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp16_matches_f64_and_the_scalar_form() {
        if crate::simd::detect() != crate::simd::Level::Avx512 {
            return;
        }
        let mut worst = 0f64;
        let mut x = -87.5f32;
        while x <= 0.0 {
            let xs: [f32; 16] = std::array::from_fn(|i| x + i as f32 * 1e-3);
            let mut got = [0f32; 16];
            // SAFETY: the AVX-512 level, checked above.
            unsafe {
                _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(xs.as_ptr())));
            }
            for (g, &xi) in got.iter().zip(&xs) {
                let want = (xi.max(-87.0) as f64).exp();
                let err = (*g as f64 - want).abs() / want;
                worst = worst.max(err);
                let s = crate::kernels::exp_nonpositive(xi);
                assert!(
                    (*g - s).abs() <= 2.0 * f32::EPSILON * s,
                    "{xi}: {g} vs scalar {s}"
                );
            }
            x += 0.0173;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        let nan = [f32::NAN; 16];
        let mut got = [0f32; 16];
        // SAFETY: as above.
        unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(nan.as_ptr()))) };
        assert!(got.iter().all(|v| v.is_nan()));
    }
}
