//! The 2-bit lattice i-quants' fused dot on the int8 x per 256 ([`X8K`]; ggml's design for
//! `ggml_vec_dot_iq2_*_q8_K`, written anew): per 32-weight sub-block the four grid points are
//! gathered as unsigned bytes (values 8, 25, 43), the sign bits are applied to x
//! (`vpsignb` by ±1 bytes) instead of to the weights, one `vpmaddubsw` gives the pair sums and
//! one `vpmaddwd` by the sub-block's integer scale 2·ls + 1 (per 16 weights: one i16 per
//! 128-bit half) their scaled i32 sums. A block's eight sub-blocks add up in integers, exactly
//! (|lane| < 2^23), and enter the f32 accumulator with one conversion and one FMA by
//! d_w·d_x; the row's sum is scaled by 1/8 at the end (the scale d·(0.5 + ls)·0.25 is
//! d·(2·ls + 1)/8, exact in f32 as the core decodes it).
//!
//! Each (row, token) value sees the same operations in the same order whatever rows and tokens
//! share the call: one token runs the rows side by side on each x load, several tokens decode a
//! row's block once and dot it with each token in turn, the same integers either way.

use super::int8_k::{X8KRows, X8K, X8K_TOKENS};
use super::iq2::{entry, u32_at, IQ2S, IQ2XS, IQ2XXS};
use super::reduce::hsum;
use crate::reference::x8k::X8K_BLOCK;
use powerinfer_core::lattice_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use std::arch::x86_64::*;

/// One 32-weight sub-block ready for its integer dots: the grid bytes (unsigned), the sign
/// multipliers (1 or −1 per weight) and the i16 scales 2·ls + 1 (lanes 0..8: the first 16
/// weights' scale, 8..16 the second's).
#[derive(Clone, Copy)]
struct Sub {
    grid: __m256i,
    sign: __m256i,
    scale: __m256i,
}

/// An IQ2 format's block as sub-blocks for the fused dot.
trait Iq2Sub {
    /// Block bytes (256 weights).
    const BYTES: usize;
    /// What the block's sub-blocks share: the per-16 formats' sixteen scales 2·ls + 1 as bytes
    /// (byte h: the half h); unused by IQ2_XXS.
    ///
    /// # Safety
    /// The block readable at `p`; the CPU has AVX2.
    unsafe fn prep(p: *const u8) -> __m128i;
    /// Sub-block `k` (0..8) of the block at `p`, with `prep` the block's [`Iq2Sub::prep`].
    ///
    /// # Safety
    /// As for [`Iq2Sub::prep`]; `k < 8`.
    unsafe fn sub(p: *const u8, k: usize, prep: __m128i) -> Sub;
}

/// The sign multipliers of each 7-bit sign index (IQ2_XXS, IQ2_XS): its 7 bits and their parity
/// as the 8th (the core's `KSIGNS`), bit j giving byte j: 0xFF (−1) where set, else 1.
static SIGNS7: [i64; 128] = {
    let mut t = [0i64; 128];
    let mut i = 0;
    while i < 128 {
        let s = i | (((i as u32).count_ones() as usize & 1) << 7);
        let mut j = 0;
        while j < 8 {
            let byte: i64 = if s >> j & 1 == 1 { 0xFF } else { 0x01 };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// Four grid points as one vector (point l in bytes 8l..8l + 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn points(g: [i64; 4]) -> __m256i {
    _mm256_setr_epi64x(g[0], g[1], g[2], g[3])
}

/// The i16 scales of sub-block `k` from a block's sixteen scale bytes: half 2k in lanes 0..8,
/// half 2k + 1 in lanes 8..16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_scales(scales: __m128i, k: usize) -> __m256i {
    let pick = _mm_add_epi8(
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm_set1_epi8(2 * k as i8),
    );
    _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales, pick))
}

/// The sixteen scales 2·ls + 1 of the per-16 formats from the 8 scale bytes at `p` (half 2s:
/// the low nibble of byte s, half 2s + 1 the high one), byte h for half h.
///
/// # Safety
/// 8 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_scales(p: *const u8) -> __m128i {
    // SAFETY: per the caller, unaligned.
    let b = unsafe { _mm_loadl_epi64(p.cast()) };
    let m4 = _mm_set1_epi8(15);
    let lo = _mm_and_si128(b, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), m4);
    let ls = _mm_unpacklo_epi8(lo, hi);
    // 2·ls + 1 per byte (ls <= 15: no carry across bytes).
    _mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1))
}

impl Iq2Sub for IQ2XXS {
    const BYTES: usize = 66;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(_p: *const u8) -> __m128i {
        _mm_setzero_si128()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, k: usize, _prep: __m128i) -> Sub {
        // SAFETY: the sub-block's 8 bytes at 2 + 8k lie in the 66-byte block (k < 8).
        let (idx, aux) = unsafe { (u32_at(p.add(2 + 8 * k)), u32_at(p.add(6 + 8 * k))) };
        let g = std::array::from_fn(|l| entry(&IQ2XXS_GRID, (idx >> (8 * l)) as usize & 255));
        let s = std::array::from_fn(|l| SIGNS7[(aux >> (7 * l)) as usize & 127]);
        Sub {
            grid: points(g),
            sign: points(s),
            scale: _mm256_set1_epi16(2 * (aux >> 28) as i16 + 1),
        }
    }
}

impl Iq2Sub for IQ2XS {
    const BYTES: usize = 74;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(p: *const u8) -> __m128i {
        // SAFETY: the scale bytes at 66..74 lie in the block.
        unsafe { nibble_scales(p.add(66)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, k: usize, prep: __m128i) -> Sub {
        // SAFETY: the four u16 at 2 + 8k lie in the 74-byte block (k < 8).
        let v: [u16; 4] = unsafe { (p.add(2 + 8 * k) as *const [u16; 4]).read_unaligned() };
        let v = v.map(u16::from_le);
        let g = std::array::from_fn(|l| entry(&IQ2XS_GRID, (v[l] & 511) as usize));
        let s = std::array::from_fn(|l| SIGNS7[(v[l] >> 9) as usize]);
        Sub {
            grid: points(g),
            sign: points(s),
            scale: half_scales(prep, k),
        }
    }
}

impl Iq2Sub for IQ2S {
    const BYTES: usize = 82;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep(p: *const u8) -> __m128i {
        // SAFETY: the scale bytes at 74..82 lie in the block.
        unsafe { nibble_scales(p.add(74)) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(p: *const u8, k: usize, prep: __m128i) -> Sub {
        // SAFETY: index bytes 2 + 4k.., sign bytes 34 + 4k.. and qh[k] at 66 + k lie in the
        // 82-byte block (k < 8).
        let (idx, signs, qh) = unsafe {
            (
                u32_at(p.add(2 + 4 * k)),
                u32_at(p.add(34 + 4 * k)),
                *p.add(66 + k) as usize,
            )
        };
        let g = std::array::from_fn(|l| {
            let high = (qh << (8 - 2 * l)) & 0x300;
            entry(&IQ2S_GRID, (idx >> (8 * l)) as usize & 255 | high)
        });
        Sub {
            grid: points(g),
            sign: super::lattice::sign_bytes(signs),
            scale: half_scales(prep, k),
        }
    }
}

/// The sub-block's scaled i32 sums against the 32 quants `x`: 2·ls + 1 times Σ grid·sign·x
/// over each 4 weights (exact: the pair sums stay within 2·43·127, the lanes within 2^23).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_sub(s: &Sub, x: __m256i) -> __m256i {
    let signed_x = _mm256_sign_epi8(x, s.sign);
    _mm256_madd_epi16(_mm256_maddubs_epi16(s.grid, signed_x), s.scale)
}

/// The 32 quants of sub-block `k` of block `b` of `x`.
///
/// # Safety
/// Block b exists in `x`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn x_sub(x: &X8K, b: usize, k: usize) -> __m256i {
    // SAFETY: per the caller, 32 quants at 256b + 32k.
    unsafe { _mm256_loadu_si256(x.q.as_ptr().add(X8K_BLOCK * b + 32 * k).cast()) }
}

/// Block `b` of the `R` rows' blocks at `p` against one token: each row's i32 lane sums.
/// The rows go side by side on each of x's loads.
///
/// # Safety
/// The blocks readable; block b exists in `x`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_one<F: Iq2Sub, const R: usize>(
    p: &[*const u8; R],
    x: &X8K,
    b: usize,
) -> [__m256i; R] {
    let mut sum = [_mm256_setzero_si256(); R];
    // SAFETY: per the caller.
    unsafe {
        let prep: [__m128i; R] = std::array::from_fn(|i| F::prep(p[i]));
        for k in 0..8 {
            let xk = x_sub(x, b, k);
            for ((sum_i, &p_i), &prep_i) in sum.iter_mut().zip(p).zip(&prep) {
                let s = F::sub(p_i, k, prep_i);
                *sum_i = _mm256_add_epi32(*sum_i, dot_sub(&s, xk));
            }
        }
    }
    sum
}

/// Block `b` of one row's block at `p` against the tokens `xs`: each token's i32 lane sums.
/// The block is decoded once, then dotted with each token in turn.
///
/// # Safety
/// As for [`block_one`], for every token.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_tokens<F: Iq2Sub, const T: usize>(
    p: *const u8,
    xs: &[&X8K; T],
    b: usize,
) -> [__m256i; T] {
    // SAFETY: per the caller.
    unsafe {
        let prep = F::prep(p);
        let subs: [Sub; 8] = std::array::from_fn(|k| F::sub(p, k, prep));
        std::array::from_fn(|t| {
            let mut sum = _mm256_setzero_si256();
            for (k, s) in subs.iter().enumerate() {
                sum = _mm256_add_epi32(sum, dot_sub(s, x_sub(xs[t], b, k)));
            }
            sum
        })
    }
}

/// The block's f16 d at `p` (F16C's conversion: exact, as every f16 is an f32).
///
/// # Safety
/// Two bytes readable at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn d_at(p: *const u8) -> f32 {
    // SAFETY: per the caller, unaligned.
    let bits = u16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() });
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Hint the cache to fetch bytes `start..end` of each row at `next[i]`.
#[inline(always)]
fn fetch<const R: usize>(next: &[*const u8; R], start: usize, end: usize) {
    for q in next {
        let mut off = start & !63;
        while off < end {
            // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is
            // baseline on x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(off) as *const i8) };
            off += 64;
        }
    }
}

/// The fused kernel of [`X8KRows::rows`] for the IQ2 format `F`.
///
/// # Safety
/// As for [`X8KRows::rows`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_iq2<F: Iq2Sub, const R: usize, const T: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xs: &[&X8K; T],
    blocks: usize,
) -> [[f32; X8K_TOKENS]; R] {
    debug_assert!(T <= X8K_TOKENS && xs.iter().all(|x| x.blocks() == blocks));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for b in 0..blocks {
        let at = b * F::BYTES;
        if FETCH {
            fetch(next, at, at + F::BYTES);
        }
        let pb: [*const u8; R] = std::array::from_fn(|i| p[i].wrapping_add(at));
        // SAFETY: block b of every row is readable and in every token per the caller.
        let sums: [[__m256i; T]; R] = unsafe {
            match T {
                1 => block_one::<F, R>(&pb, xs[0], b).map(|s| [s; T]),
                _ => std::array::from_fn(|i| block_tokens::<F, T>(pb[i], xs, b)),
            }
        };
        for ((a, s), &pi) in acc.iter_mut().zip(&sums).zip(&pb) {
            // SAFETY: the block's d is readable per the caller.
            let dw = unsafe { d_at(pi) };
            for ((a_t, s_t), x) in a.iter_mut().zip(s).zip(xs) {
                let d = _mm256_set1_ps(dw * x.d[b]);
                *a_t = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(*s_t), *a_t);
            }
        }
    }
    let mut out = [[0f32; X8K_TOKENS]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        for (o_t, a_t) in o.iter_mut().zip(a) {
            *o_t = 0.125 * hsum(*a_t);
        }
    }
    out
}

/// [`X8KRows`] for the IQ2 formats, from [`rows_iq2`].
macro_rules! impl_x8k_rows {
    ($($t:ty),*) => {$(
        impl X8KRows for $t {
            #[inline]
            unsafe fn rows<const R: usize, const T: usize, const FETCH: bool>(
                p: &[*const u8; R],
                next: &[*const u8; R],
                xs: &[&X8K; T],
                blocks: usize,
            ) -> [[f32; X8K_TOKENS]; R] {
                // SAFETY: forwarded from the caller.
                unsafe { rows_iq2::<Self, R, T, FETCH>(p, next, xs, blocks) }
            }
        }
    )*};
}
impl_x8k_rows!(IQ2XXS, IQ2XS, IQ2S);

#[cfg(test)]
mod tests {
    use super::super::{rows_dot_x8k, scattered_dot_x8k};
    use super::*;
    use crate::reference::{abs_dot_row, dot_row_f64, x8k::x8k_hat};
    use crate::testutil::{random_weight, x8_tol, Rng};
    use powerinfer_core::lattice_grids::KSIGNS;
    use powerinfer_core::DType;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Every IQ2 format, rows of 1, 3 and 5 blocks, an odd number of rows (groups of four and
    /// single rows) and of tokens (a call of eight and more): every dot within the f32
    /// roundings ([`x8_tol`]) of the float64 dot of the same weights with x̂ (the int8 x per
    /// 256), bit-identical to the same token dotted alone and to odd-indexed scattered rows;
    /// x holds an outlier, and one token is all ±127 quants (the integer sums' largest).
    #[test]
    fn exact_on_the_same_x_and_the_same_bits_at_any_batch() {
        if !crate::simd::detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(87);
        for dtype in DType::LATTICE_IQ2 {
            for blocks in [1, 3, 5] {
                let cols = 256 * blocks;
                let rows = 2 * (rng.next_u64() as usize % 7) + 1;
                let tokens = 2 * (rng.next_u64() as usize % 3) + 7;
                let w = random_weight(&mut rng, dtype, rows, cols);
                let row_bytes = dtype.row_bytes(cols).unwrap();
                let mut x: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(cols)).collect();
                x[0][cols / 3] = 90.0;
                x[1] = (0..cols)
                    .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                    .collect();
                let xq: Vec<X8K> = x.iter().map(|t| X8K::new(t).unwrap()).collect();
                let refs: Vec<&X8K> = xq.iter().collect();
                let mut outs = vec![vec![f32::NAN; rows]; tokens];
                let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
                rows_dot_x8k(dtype, w.bytes(), row_bytes, &refs, &mut o);
                for (t, out) in outs.iter().enumerate() {
                    let hat = x8k_hat(&x[t]).unwrap();
                    for (r, &got) in out.iter().enumerate() {
                        let want = dot_row_f64(dtype, w.row(r), &hat);
                        let scale = abs_dot_row(dtype, w.row(r), &hat);
                        let err = (got as f64 - want).abs();
                        assert!(
                            err <= x8_tol(cols) * scale + 1e-30,
                            "{dtype} blocks {blocks} row {r} token {t}: got {got}, want {want}"
                        );
                    }
                    let mut alone = vec![f32::NAN; rows];
                    rows_dot_x8k(dtype, w.bytes(), row_bytes, &[refs[t]], &mut [&mut alone]);
                    assert_eq!(bits(&alone), bits(out), "{dtype} token {t} alone");
                    let picked: Vec<usize> = (0..rows).rev().step_by(3).take(7).collect();
                    let scattered: Vec<&[u8]> = picked.iter().map(|&r| w.row(r)).collect();
                    let mut s = vec![f32::NAN; picked.len()];
                    scattered_dot_x8k(dtype, &scattered, &[], refs[t], &mut s);
                    let want: Vec<f32> = picked.iter().map(|&r| out[r]).collect();
                    assert_eq!(bits(&s), bits(&want), "{dtype} token {t} scattered");
                }
            }
        }
    }

    /// The sign multipliers of every 7-bit index are the core's sign bytes, bit for bit.
    #[test]
    fn signs7_are_the_cores_sign_bytes() {
        for (i, &s) in KSIGNS.iter().enumerate() {
            let want: i64 = (0..8)
                .map(|j| (if s >> j & 1 == 1 { 0xFFi64 } else { 1 }) << (8 * j))
                .sum();
            assert_eq!(SIGNS7[i], want, "index {i}");
        }
    }
}
