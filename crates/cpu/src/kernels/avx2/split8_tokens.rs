//! [`super::split8`]'s dot for several tokens at once (speculative verification). Each token
//! keeps the one-token kernel's 256-bit lanes and does exactly its arithmetic (the same exact
//! integer sums, the same conversion, the same FMA by the same `d·s_x`, the same final
//! `hsum`), so each token's dot is bit-identical to
//! [`super::split8::quant_rows_split`]'s; what the tokens share is the block's quants, loaded
//! and unpacked once, and the per-chunk scales. 256-bit registers, not 512: a pairing of two
//! tokens per 512-bit register measured slower than two one-token passes for two tokens (its
//! ops run on fewer ports).

use super::int16::{fetch_chunk, XQuant};
use super::quant::Offset;
use super::reduce::hsum;
use super::split8::SplitFormat;
use std::arch::x86_64::*;

/// Blocks whose scales are gathered and converted together (as in [`super::split8`]).
const CHUNK: usize = 8;
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
    out: &mut [[f32; R]; T],
) {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut offs = [[_mm256_setzero_ps(); T]; R];
    let blocks = xs[0].blocks();
    let full = blocks / CHUNK * CHUNK;
    for b0 in (0..full).step_by(CHUNK) {
        if FETCH {
            fetch_chunk::<Q, R>(next, b0, CHUNK);
        }
        // SAFETY: blocks b0..b0 + CHUNK exist, per the caller.
        unsafe { chunk_tokens::<Q, R, T>(p, xs, b0, CHUNK, &mut acc, &mut offs) };
    }
    if full < blocks {
        if FETCH {
            fetch_chunk::<Q, R>(next, full, blocks - full);
        }
        // SAFETY: blocks full..blocks exist, per the caller.
        unsafe { chunk_tokens::<Q, R, T>(p, xs, full, blocks - full, &mut acc, &mut offs) };
    }
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
    for k in 0..n {
        let b = b0 + k;
        // SAFETY: b < blocks: every token's 64 split bytes and 8 start lanes of block b exist,
        // and every row's block b is readable per the caller.
        unsafe {
            let xh: [__m256i; T] =
                std::array::from_fn(|t| _mm256_loadu_si256(xs[t].hl.as_ptr().add(64 * b).cast()));
            let xl: [__m256i; T] = std::array::from_fn(|t| {
                _mm256_loadu_si256(xs[t].hl.as_ptr().add(64 * b + 32).cast())
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
                let q = Q::quants_u8(p[i].add(b * Q::BLOCK_BYTES));
                for t in 0..T {
                    let sh = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xh[t]);
                    let sl = _mm256_dpbusd_epi32(s0[t], q, xl[t]);
                    let s = _mm256_add_epi32(_mm256_slli_epi32::<8>(sh), sl);
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
        unsafe { tokens_of_rows::<Q, QROWS>(&at(r0), &at(next), xs, outs, r0) };
    }
    for r in full..count {
        let p = [base.wrapping_add(r * row_bytes)];
        // SAFETY: row r exists, per the caller.
        unsafe { tokens_of_rows::<Q, 1>(&p, &p, xs, outs, r) };
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
    outs: &mut [&mut [f32]],
    r0: usize,
) {
    /// Tokens `t0..t0 + $nt` through the kernel with `$nt` tokens.
    macro_rules! run {
        ($nt:literal, $t0:expr) => {{
            let group: [&XQuant; $nt] = std::array::from_fn(|t| xs[$t0 + t]);
            let mut out = [[0f32; R]; $nt];
            // SAFETY: forwarded from the caller.
            unsafe {
                match $t0 {
                    0 => rows_tokens::<Q, R, $nt, true>(p, next, &group, &mut out),
                    _ => rows_tokens::<Q, R, $nt, false>(p, next, &group, &mut out),
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
