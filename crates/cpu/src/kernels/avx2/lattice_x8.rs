//! The fused int8-x kernel of the lattice i-quants (IQ3_XXS, IQ3_S: [`super::iq3`]; IQ1_S,
//! IQ1_M: [`super::iq1`]), for 1..[`TOKENS`] tokens at once on rows read in place.
//!
//! ggml's design (its `ggml_vec_dot_iq3_s_q8_K` and kin) on this crate's int8 x
//! ([`super::int8::X8`], a scale per 16 values, finer than ggml's per 256): a 32-weight
//! sub-block comes from its format ([`LatticeX8::sub`]) as unsigned magnitudes `u` (the grid
//! bytes) and a sign source `g` (nonzero bytes, negative where the weight is), the signs are put
//! on x (`vpsignb`, one instruction per token) and one `vpmaddubsw` + `vpmaddwd` gives the
//! sub-block's exact lane sums. A super-block's eight sub-blocks' lanes are summed per 16-value
//! half by six `vphaddd` into two vectors whose lanes are (sub-block, half) pairs, in the order
//! x's `dh` holds its half scales; each pair then enters the row's f32 accumulator by one
//! conversion and one FMA by the weights' scale times x's. No weight is decoded to bytes in
//! memory, and there is one conversion per 128 weights instead of one per 32.
//!
//! Every integer sum is exact (|u| ≤ 62, so a `vpmaddubsw` pair is at most 2·62·128), and each
//! (row, token) pair sees the same float operations in the same order whatever rows and tokens
//! share the call: a token's dots are bit-identical alone or batched, dense or by index.

use super::int8::{CHUNK, X8};
use super::int8_rows::{fetch, TOKENS};
use super::reduce::hsum;
use std::arch::x86_64::*;

/// A lattice format as the fused kernel reads it: 256-weight super-blocks of `BYTES` bytes,
/// eight 32-weight sub-blocks each.
pub(super) trait LatticeX8 {
    /// Bytes of one super-block.
    const BYTES: usize;

    /// Sub-block `s` (0..8) of the super-block at `p`: the weights' magnitudes as unsigned
    /// bytes (at most 127) in weight order, and a sign source whose bytes are nonzero and
    /// negative exactly where the weight is (weights are then `scale · sign · u`).
    ///
    /// # Safety
    /// The super-block readable at `p`; the CPU has AVX2, FMA and F16C.
    unsafe fn sub(p: *const u8, s: usize) -> (__m256i, __m256i);

    /// The super-block's weight scales in the reduced lanes: lane 4h + j of vector k is the
    /// scale of half h of sub-block 4k + j.
    ///
    /// # Safety
    /// As for [`LatticeX8::sub`].
    unsafe fn scales(p: *const u8) -> [__m256; 2];
}

/// Sub-block lanes: Σ u·(x with the signs of g) over each 4 weights, exact.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sub_dot(u: __m256i, g: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, g));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Eight sub-blocks' lanes as their half sums: lane 4h + j of vector k is half h of sub-block
/// 4k + j (`vphaddd` pairs lanes within each 128-bit half, which is one 16-weight half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn halves(l: &[__m256i; 8]) -> [__m256i; 2] {
    let h01 = _mm256_hadd_epi32(l[0], l[1]);
    let h23 = _mm256_hadd_epi32(l[2], l[3]);
    let h45 = _mm256_hadd_epi32(l[4], l[5]);
    let h67 = _mm256_hadd_epi32(l[6], l[7]);
    [_mm256_hadd_epi32(h01, h23), _mm256_hadd_epi32(h45, h67)]
}

/// `acc` plus chunk `c`'s half sums `h` times the weights' scales `w` and x's half scales.
///
/// # Safety
/// Chunk c exists in `x`; the CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate(h: [__m256i; 2], w: &[__m256; 2], x: &X8, c: usize, acc: &mut [__m256; 2]) {
    for k in 0..2 {
        // SAFETY: dh holds sixteen lanes per chunk, chunk c among them per the caller.
        let dx = unsafe { _mm256_loadu_ps(x.dh.as_ptr().add(16 * c + 8 * k)) };
        acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h[k]), _mm256_mul_ps(w[k], dx), acc[k]);
    }
}

/// Block `b`'s 32 quants of `x`.
///
/// # Safety
/// Block b exists in `x`; the CPU has AVX.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn x_block(x: &X8, b: usize) -> __m256i {
    // SAFETY: per the caller, 32 quants at 32b.
    unsafe { _mm256_loadu_si256(x.q.as_ptr().add(32 * b).cast()) }
}

/// out[i][t] = dot(row i, token t) for the `R` rows at `p[i]` (`blocks` 32-blocks of `F`
/// each, a multiple of 8) and the tokens `xs` (at most `T` ≤ [`TOKENS`]); with `FETCH` the rows
/// at `next[i]` are fetched alongside. One token decodes each sub-block straight into its dot;
/// several decode a row's super-block once and dot it with each token in turn (the same
/// arithmetic per token).
///
/// # Safety
/// The rows readable; the CPU has AVX2, FMA and F16C. `next` may hold any addresses.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<F: LatticeX8, const R: usize, const T: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xs: &[&X8],
    blocks: usize,
) -> [[f32; TOKENS]; R] {
    debug_assert!(xs.len() <= T && T <= TOKENS && blocks.is_multiple_of(CHUNK));
    debug_assert!(xs.iter().all(|x| x.blocks() == blocks));
    let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
    for c in 0..blocks / CHUNK {
        let at = c * F::BYTES;
        if FETCH {
            fetch(next, at, at + F::BYTES);
        }
        for (&pi, a) in p.iter().zip(acc.iter_mut()) {
            // SAFETY: super-block c of every row is readable per the caller; the tokens hold
            // its eight blocks 8c.. (every block of the rows).
            unsafe {
                let b = pi.add(at);
                let w = F::scales(b);
                let mut l = [_mm256_setzero_si256(); CHUNK];
                if T == 1 {
                    for (s, ls) in l.iter_mut().enumerate() {
                        let (u, g) = F::sub(b, s);
                        *ls = sub_dot(u, g, x_block(xs[0], CHUNK * c + s));
                    }
                    accumulate(halves(&l), &w, xs[0], c, &mut a[0]);
                    continue;
                }
                let mut sub = [(_mm256_setzero_si256(), _mm256_setzero_si256()); CHUNK];
                for (s, sb) in sub.iter_mut().enumerate() {
                    *sb = F::sub(b, s);
                }
                for (x, ax) in xs.iter().zip(a.iter_mut()) {
                    for (s, ls) in l.iter_mut().enumerate() {
                        *ls = sub_dot(sub[s].0, sub[s].1, x_block(x, CHUNK * c + s));
                    }
                    accumulate(halves(&l), &w, x, c, ax);
                }
            }
        }
    }
    let mut out = [[0f32; TOKENS]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (ot, at) in o.iter_mut().zip(a).take(xs.len()) {
            *ot = hsum(_mm256_add_ps(at[0], at[1]));
        }
    }
    out
}

/// The eight per-32 scales `v` (lane s: sub-block s) in the reduced lanes (each sub-block's
/// scale on both its halves).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn per32_lanes(v: __m256) -> [__m256; 2] {
    [
        _mm256_permute2f128_ps::<0x00>(v, v),
        _mm256_permute2f128_ps::<0x11>(v, v),
    ]
}

/// The sixteen per-16 scales `d` (half 2s + h of sub-block s) in the reduced lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn per16_lanes(d: &[f32; 16]) -> [__m256; 2] {
    let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    // SAFETY: sixteen f32 behind the reference, two unaligned loads.
    let (v0, v1) = unsafe {
        (
            _mm256_loadu_ps(d.as_ptr()),
            _mm256_loadu_ps(d.as_ptr().add(8)),
        )
    };
    [
        _mm256_permutevar8x32_ps(v0, order),
        _mm256_permutevar8x32_ps(v1, order),
    ]
}

/// The f16 at `p` as an f32 (exact).
///
/// # Safety
/// Two bytes readable at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: per the caller.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le(bits) as i32)))
}

#[cfg(test)]
mod tests {
    use super::super::int8_formats::Int8Format;
    use super::super::{iq1, iq3, rows_dot_x8, scattered_dot_x8};
    use super::*;
    use crate::reference::{abs_dot_row, dot_row_f64, x8::x8_hat};
    use crate::testutil::{random_weight, Rng};
    use powerinfer_core::DType;

    /// The four formats of the fused kernel.
    const FUSED: [DType; 4] = [DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M];

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// The int8-x products of these formats are the fused kernel's (no other decodes them).
    #[test]
    fn the_lattice_formats_take_the_fused_kernel() {
        const { assert!(<iq3::IQ3XXS as Int8Format>::FUSED && <iq3::IQ3S as Int8Format>::FUSED) };
        const { assert!(<iq1::IQ1S as Int8Format>::FUSED && <iq1::IQ1M as Int8Format>::FUSED) };
        assert!(FUSED.iter().all(|&d| crate::numerics::int8_always(d)));
    }

    /// Odd sizes: 7 rows (a group of four and three single rows), 9 tokens (a call of eight
    /// and one), 3 super-blocks, rows by odd indices: every dot within f32 accumulation of the
    /// float64 dot of the same weights with the same x̂, and the same bits alone, batched and by
    /// index.
    #[test]
    fn exact_on_the_same_x_at_odd_sizes_and_the_same_bits_every_way() {
        let mut rng = Rng::new(97);
        let (rows, tokens, cols) = (7, 9, 256 * 3);
        for dtype in FUSED {
            let w = random_weight(&mut rng, dtype, rows, cols);
            let rb = dtype.row_bytes(cols).unwrap();
            let mut x: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(cols)).collect();
            x[4][cols / 3] = -90.0;
            let xq: Vec<X8> = x.iter().map(|t| X8::new(t).unwrap()).collect();
            let refs: Vec<&X8> = xq.iter().collect();
            let mut outs = vec![vec![f32::NAN; rows]; tokens];
            let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
            rows_dot_x8(dtype, w.bytes(), rb, &refs, &mut o, false);
            for (t, out) in outs.iter().enumerate() {
                let hat = x8_hat(&x[t]).unwrap();
                for (r, &got) in out.iter().enumerate() {
                    let want = dot_row_f64(dtype, w.row(r), &hat);
                    let tol = f64::from(f32::EPSILON) * 32.0 * abs_dot_row(dtype, w.row(r), &hat);
                    let err = (got as f64 - want).abs();
                    assert!(err <= tol, "{dtype} row {r} token {t}: {got} vs {want}");
                }
                let mut alone = vec![f32::NAN; rows];
                rows_dot_x8(dtype, w.bytes(), rb, &[refs[t]], &mut [&mut alone], false);
                assert_eq!(bits(&alone), bits(out), "{dtype} token {t} alone");
                let picks = [5, 1, 3, 6, 0];
                let scattered: Vec<&[u8]> = picks.iter().map(|&r| w.row(r)).collect();
                let mut s = vec![f32::NAN; picks.len()];
                scattered_dot_x8(dtype, &scattered, &[], refs[t], &mut s, false);
                let want: Vec<f32> = picks.iter().map(|&r| out[r]).collect();
                assert_eq!(bits(&s), bits(&want), "{dtype} token {t} by index");
            }
        }
    }
}
