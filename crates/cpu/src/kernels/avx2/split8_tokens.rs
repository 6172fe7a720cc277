//! [`super::split8`]'s dot for several tokens at once (speculative verification). Each token
//! keeps the one-token kernel's 256-bit lanes and its arithmetic: lane j of a block holds the
//! exact integer Σ q·x over weights 4j..4j + 4 (the same integer however it is summed), then
//! the same conversion, the same FMA by the same `d·s_x`, the same final `hsum`; so each
//! token's dot is bit-identical to [`super::split8::quant_rows_split`]'s. The integer is taken
//! differently: the block's quants are unpacked once for all the tokens into int16 pairs in
//! lane order (weights 4j, 4j + 1 in one vector, 4j + 2, 4j + 3 in the other), and each token
//! adds its two `vpdpwssd` against its int16 x laid out the same way ([`XLanes`]): two
//! instructions a token and block where the one-token kernel's split bytes take four (two
//! `vpdpbusd`, a shift and an add). 256-bit registers, not 512: a pairing of two tokens per
//! 512-bit register measured slower than two one-token passes for two tokens (its ops run on
//! fewer ports).

use super::int16::{each_chunk, XQuant, CHUNK};
use super::quant::Offset;
use super::reduce::hsum;
use super::split8::SplitFormat;
use std::arch::x86_64::*;

/// One token's int16 x in the kernel's lane order: per block, the values of weights 4j, 4j + 1
/// for j = 0..8, then those of weights 4j + 2, 4j + 3.
pub(crate) struct XLanes {
    ab: Vec<i16>,
}

impl XLanes {
    /// `x`'s int16 values rearranged.
    pub(crate) fn new(x: &XQuant) -> XLanes {
        let mut ab = Vec::with_capacity(x.q.len());
        for q in x.q.chunks_exact(32) {
            for half in [0, 2] {
                for j in 0..8 {
                    ab.extend_from_slice(&q[4 * j + half..4 * j + half + 2]);
                }
            }
        }
        XLanes { ab }
    }

    /// Values held (32 a block).
    pub(crate) fn len(&self) -> usize {
        self.ab.len()
    }
}

/// In each 128-bit half of a block's 32 quant bytes (weights 0..16, 16..32): the bytes of
/// weights 4j, 4j + 1, then of 4j + 2, 4j + 3, so that unpacking the low and high eight bytes
/// to int16 gives the two vectors of lane-ordered pairs.
const PAIRS_FIRST: [i8; 16] = [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15];
/// Tokens per kernel call.
const TOKENS: usize = 4;
/// Rows per kernel call.
const QROWS: usize = 4;

/// `out[t][i]` = dot(row i, token `xs[t]`) for the `R` rows of a [`SplitFormat`] starting at
/// `p[i]`, each bit-identical to [`super::split8::quant_rows_split`] on that token.
///
/// # Safety
/// `blocks` blocks readable at each `p[i]` (every token has `blocks` blocks); the CPU has
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_tokens<Q: SplitFormat, const R: usize, const T: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xs: &[&XQuant; T],
    lanes: &[&XLanes; T],
    out: &mut [[f32; R]; T],
) {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut offs = [[_mm256_setzero_ps(); T]; R];
    each_chunk::<Q, R, FETCH>(next, xs[0].blocks(), |b0, n| {
        // SAFETY: blocks b0..b0 + n exist, per the caller.
        unsafe { chunk_tokens::<Q, R, T>(p, xs, lanes, b0, n, &mut acc, &mut offs) }
    });
    for i in 0..R {
        for t in 0..T {
            out[t][i] = hsum(_mm256_add_ps(acc[i][t], offs[i][t]));
        }
    }
}

/// Add blocks `b0..b0 + n` (`n <= CHUNK`) of `R` rows to every token's accumulators.
///
/// # Safety
/// As for [`rows_tokens`], with `b0 + n <= blocks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_tokens<Q: SplitFormat, const R: usize, const T: usize>(
    p: &[*const u8; R],
    xs: &[&XQuant; T],
    lanes: &[&XLanes; T],
    b0: usize,
    n: usize,
    acc_out: &mut [[__m256; T]; R],
    offs: &mut [[__m256; T]; R],
) {
    let mut acc = *acc_out;
    // Per row and token: d·s_x of the chunk's blocks, read back one broadcast per block.
    let mut ds = [[[0f32; CHUNK]; T]; R];
    // SAFETY: the per-block vectors of every token are padded to whole chunks; each row's
    // blocks b0..b0 + n are readable per the caller.
    unsafe {
        for i in 0..R {
            let row = p[i].add(b0 * Q::BLOCK_BYTES);
            let d = Q::scales8(row, n);
            for (t, x) in xs.iter().enumerate() {
                let sx = _mm256_loadu_ps(x.scale.as_ptr().add(b0));
                _mm256_storeu_ps(ds[i][t].as_mut_ptr(), _mm256_mul_ps(d, sx));
            }
            if Q::OFFSET == Offset::Min {
                let m = Q::mins8(row, n);
                for (t, x) in xs.iter().enumerate() {
                    let s = _mm256_loadu_ps(x.sum.as_ptr().add(b0));
                    offs[i][t] = _mm256_fmadd_ps(m, s, offs[i][t]);
                }
            }
        }
    }
    let pairs_first = _mm256_broadcastsi128_si256(_mm_loadu_si128(PAIRS_FIRST.as_ptr().cast()));
    for k in 0..n {
        let b = b0 + k;
        // SAFETY: b < blocks: every token's 32 int16 x and 8 start lanes of block b exist, and
        // every row's block b is readable per the caller.
        unsafe {
            let xa: [__m256i; T] = std::array::from_fn(|t| {
                _mm256_loadu_si256(lanes[t].ab.as_ptr().add(32 * b).cast())
            });
            let xb: [__m256i; T] = std::array::from_fn(|t| {
                _mm256_loadu_si256(lanes[t].ab.as_ptr().add(32 * b + 16).cast())
            });
            let s0: [__m256i; T] = std::array::from_fn(|t| {
                let start = xs[t].neg_bias8.as_ptr().add(8 * b).cast();
                match Q::BIAS {
                    0 => _mm256_setzero_si256(),
                    8 => _mm256_loadu_si256(start),
                    _ => _mm256_slli_epi32::<1>(_mm256_loadu_si256(start)),
                }
            });
            for i in 0..R {
                let u =
                    _mm256_shuffle_epi8(Q::quants_u8(p[i].add(b * Q::BLOCK_BYTES)), pairs_first);
                let qa = _mm256_unpacklo_epi8(u, _mm256_setzero_si256());
                let qb = _mm256_unpackhi_epi8(u, _mm256_setzero_si256());
                for t in 0..T {
                    let s = _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(s0[t], qa, xa[t]), qb, xb[t]);
                    let d = _mm256_set1_ps(*ds[i][t].get_unchecked(k));
                    acc[i][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[i][t]);
                }
            }
        }
    }
    *acc_out = acc;
}

/// `outs[t][i]` = dot(row i, token `xs[t]`) over consecutive rows of `Q` (`outs[0].len()` of
/// them, `row_bytes` apart in `rows`), each bit-identical to the one-token kernel's.
///
/// # Safety
/// The CPU has the AVX-512 level; `rows` holds `outs[0].len()` rows of at least
/// `xs[..].blocks()` blocks of `Q`, every `outs[t]` as many values, `outs.len() == xs.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_dot_tokens<Q: SplitFormat>(
    rows: &[u8],
    row_bytes: usize,
    xs: &[&XQuant],
    lanes: &[&XLanes],
    outs: &mut [&mut [f32]],
    ahead: usize,
) {
    let count = outs.first().map_or(0, |o| o.len());
    let base = rows.as_ptr();
    let full = count / QROWS * QROWS;
    for r0 in (0..full).step_by(QROWS) {
        let at = |first: usize| -> [*const u8; QROWS] {
            std::array::from_fn(|i| base.wrapping_add((first + i) * row_bytes))
        };
        // The rows `ahead` groups on are fetched in step (as the one-token kernel does).
        let next = match r0 + ahead * QROWS < full {
            true => r0 + ahead * QROWS,
            false => r0,
        };
        // SAFETY: rows r0..r0 + QROWS exist, per the caller; `next` is only fetched.
        unsafe { tokens_of_rows::<Q, QROWS>(&at(r0), &at(next), xs, lanes, outs, r0) };
    }
    for r in full..count {
        let p = [base.wrapping_add(r * row_bytes)];
        // SAFETY: row r exists, per the caller.
        unsafe { tokens_of_rows::<Q, 1>(&p, &p, xs, lanes, outs, r) };
    }
}

/// Every token's dots with the `R` rows at `p` into `outs[..][r0..r0 + R]`, the rows at
/// `next` fetched alongside the first group of tokens.
///
/// # Safety
/// As for [`rows_tokens`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tokens_of_rows<Q: SplitFormat, const R: usize>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xs: &[&XQuant],
    lanes: &[&XLanes],
    outs: &mut [&mut [f32]],
    r0: usize,
) {
    /// Tokens `t0..t0 + $nt` through the kernel with `$nt` tokens.
    macro_rules! run {
        ($nt:literal, $t0:expr) => {{
            let group: [&XQuant; $nt] = std::array::from_fn(|t| xs[$t0 + t]);
            let group_lanes: [&XLanes; $nt] = std::array::from_fn(|t| lanes[$t0 + t]);
            let mut out = [[0f32; R]; $nt];
            // SAFETY: forwarded from the caller.
            unsafe {
                match $t0 {
                    0 => rows_tokens::<Q, R, $nt, true>(p, next, &group, &group_lanes, &mut out),
                    _ => rows_tokens::<Q, R, $nt, false>(p, next, &group, &group_lanes, &mut out),
                }
            };
            for (t, o) in out.iter().enumerate() {
                outs[$t0 + t][r0..r0 + R].copy_from_slice(o);
            }
        }};
    }
    let mut t0 = 0;
    while t0 < xs.len() {
        match xs.len() - t0 {
            1 => run!(1, t0),
            2 => run!(2, t0),
            3 => run!(3, t0),
            _ => run!(4, t0),
        }
        t0 += TOKENS.min(xs.len() - t0);
    }
}
