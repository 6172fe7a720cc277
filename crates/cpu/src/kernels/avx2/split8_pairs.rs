//! [`super::split8`]'s dot for several tokens at once (speculative verification): two tokens
//! share each 512-bit register, token a in the low 256 bits and token b in the high, so every
//! lane does exactly the arithmetic of the one-token kernel's 256-bit lane (the same exact
//! integer sums, the same conversion, the same FMA by the same `d·s_x`, the same final
//! `hsum`), and each token's dot is bit-identical to [`super::split8::quant_rows_split`]'s.
//! A block's quants are unpacked once for all the tokens (the one-token kernel's main cost
//! after the two `vpdpbusd`), and each 512-bit `vpdpbusd` serves two tokens.

use super::int16::XQuant;
use super::quant::Offset;
use super::reduce::hsum;
use super::split8::SplitFormat;
use std::arch::x86_64::*;

/// Blocks whose scales are gathered and converted together (as in [`super::split8`]).
const CHUNK: usize = 8;

/// Two tokens' int16 x laid out for the paired kernel: per block, the 32 high bytes of token
/// a, those of token b, the 32 low bytes of a, those of b; the start lanes (Q4_0's −8·Σx) of
/// a then b; and each token's block scales and sums (zero-padded to whole chunks).
pub(crate) struct XPair {
    hl: Vec<i8>,
    start: Vec<i32>,
    scale: [Vec<f32>; 2],
    sum: [Vec<f32>; 2],
    blocks: usize,
}

impl XPair {
    /// The pair (a, b); both quantized from x of the same length.
    pub(crate) fn new(a: &XQuant, b: &XQuant) -> XPair {
        assert_eq!(a.blocks(), b.blocks());
        let blocks = a.blocks();
        let mut hl = Vec::with_capacity(blocks * 128);
        let mut start = Vec::with_capacity(blocks * 16);
        for k in 0..blocks {
            let (ha, hb) = (&a.hl[64 * k..64 * k + 64], &b.hl[64 * k..64 * k + 64]);
            hl.extend_from_slice(&ha[..32]);
            hl.extend_from_slice(&hb[..32]);
            hl.extend_from_slice(&ha[32..]);
            hl.extend_from_slice(&hb[32..]);
            start.extend_from_slice(&a.neg_bias8[8 * k..8 * k + 8]);
            start.extend_from_slice(&b.neg_bias8[8 * k..8 * k + 8]);
        }
        XPair {
            hl,
            start,
            scale: [a.scale.clone(), b.scale.clone()],
            sum: [a.sum.clone(), b.sum.clone()],
            blocks,
        }
    }

    /// Number of 32-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }
}

/// `out[j][h][i]` = dot(row i, token h of pair j) for the `R` rows of a [`SplitFormat`]
/// starting at `p[i]`, each bit-identical to [`super::split8::quant_rows_split`] on that token.
///
/// # Safety
/// `blocks` blocks readable at each `p[i]` (every pair has `blocks` blocks); the CPU has
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_pairs<Q: SplitFormat, const R: usize, const P: usize>(
    p: &[*const u8; R],
    xs: &[&XPair; P],
    out: &mut [[[f32; R]; 2]; P],
) {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let mut offs = [[_mm512_setzero_ps(); P]; R];
    let blocks = xs[0].blocks;
    let full = blocks / CHUNK * CHUNK;
    for b0 in (0..full).step_by(CHUNK) {
        // SAFETY: blocks b0..b0 + CHUNK exist, per the caller.
        unsafe { chunk_pairs::<Q, R, P>(p, xs, b0, CHUNK, &mut acc, &mut offs) };
    }
    if full < blocks {
        // SAFETY: blocks full..blocks exist, per the caller.
        unsafe { chunk_pairs::<Q, R, P>(p, xs, full, blocks - full, &mut acc, &mut offs) };
    }
    for i in 0..R {
        for j in 0..P {
            let s = _mm512_add_ps(acc[i][j], offs[i][j]);
            out[j][0][i] = hsum(_mm512_castps512_ps256(s));
            out[j][1][i] = hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(s),
            )));
        }
    }
}

/// Add blocks `b0..b0 + n` (`n <= CHUNK`) of `R` rows to every pair's accumulators.
///
/// # Safety
/// As for [`rows_pairs`], with `b0 + n <= blocks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_pairs<Q: SplitFormat, const R: usize, const P: usize>(
    p: &[*const u8; R],
    xs: &[&XPair; P],
    b0: usize,
    n: usize,
    acc_out: &mut [[__m512; P]; R],
    offs: &mut [[__m512; P]; R],
) {
    let mut acc = *acc_out;
    // Per row and pair: d·s_x of the chunk's blocks, token a's eight then token b's.
    let mut ds = [[_mm512_setzero_ps(); P]; R];
    // SAFETY: the per-block vectors are padded to whole chunks; each row's blocks b0..b0 + n
    // are readable per the caller.
    unsafe {
        for i in 0..R {
            let row = p[i].add(b0 * Q::BLOCK_BYTES);
            let d = Q::scales8(row, n);
            let mins = match Q::OFFSET {
                Offset::Min => Some(Q::mins8(row, n)),
                Offset::None | Offset::MinusEight => None,
            };
            for (j, x) in xs.iter().enumerate() {
                let [sa, sb] = [0, 1].map(|h| _mm256_loadu_ps(x.scale[h].as_ptr().add(b0)));
                ds[i][j] = join(_mm256_mul_ps(d, sa), _mm256_mul_ps(d, sb));
                if let Some(m) = mins {
                    let [ua, ub] = [0, 1].map(|h| _mm256_loadu_ps(x.sum[h].as_ptr().add(b0)));
                    offs[i][j] = _mm512_fmadd_ps(join(m, m), join(ua, ub), offs[i][j]);
                }
            }
        }
    }
    for k in 0..n {
        let b = b0 + k;
        // Lane k of token a's eight in the low half, of token b's in the high.
        let pick = _mm512_inserti64x4::<1>(
            _mm512_set1_epi32(k as i32),
            _mm256_set1_epi32((CHUNK + k) as i32),
        );
        // SAFETY: b < blocks: every pair's bytes and start lanes of block b exist, and every
        // row's block b is readable per the caller.
        unsafe {
            let xh: [__m512i; P] =
                std::array::from_fn(|j| _mm512_loadu_si512(xs[j].hl.as_ptr().add(128 * b).cast()));
            let xl: [__m512i; P] = std::array::from_fn(|j| {
                _mm512_loadu_si512(xs[j].hl.as_ptr().add(128 * b + 64).cast())
            });
            let s0: [__m512i; P] = std::array::from_fn(|j| match Q::BIAS {
                0 => _mm512_setzero_si512(),
                8 => _mm512_loadu_si512(xs[j].start.as_ptr().add(16 * b).cast()),
                _ => _mm512_slli_epi32::<1>(_mm512_loadu_si512(
                    xs[j].start.as_ptr().add(16 * b).cast(),
                )),
            });
            for i in 0..R {
                let q = Q::quants_u8(p[i].add(b * Q::BLOCK_BYTES));
                let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), q);
                for j in 0..P {
                    let sh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xh[j]);
                    let sl = _mm512_dpbusd_epi32(s0[j], q, xl[j]);
                    let s = _mm512_add_epi32(_mm512_slli_epi32::<8>(sh), sl);
                    let d = _mm512_permutexvar_ps(pick, ds[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc[i][j]);
                }
            }
        }
    }
    *acc_out = acc;
}

/// `lo` in the low 256 bits, `hi` in the high.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn join(lo: __m256, hi: __m256) -> __m512 {
    let lo = _mm512_castps_pd(_mm512_castps256_ps512(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
}

/// Pairs per kernel call (2·4 accumulator rows of tokens with [`QROWS`] rows: 16 registers).
const PAIRS: usize = 4;
/// Rows per kernel call.
const QROWS: usize = 4;

/// `outs[2j + h][i]` = dot(row i, token h of `pairs[j]`) over consecutive rows of `Q`
/// (`outs[0].len()` of them, `row_bytes` apart in `rows`), each bit-identical to the
/// one-token kernel's.
///
/// # Safety
/// The CPU has the AVX-512 level; `rows` holds `outs[0].len()` rows of at least
/// `pairs[..].blocks()` blocks of `Q`, every `outs[t]` as many values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_dot_pairs<Q: SplitFormat>(
    rows: &[u8],
    row_bytes: usize,
    pairs: &[XPair],
    outs: &mut [&mut [f32]],
) {
    let count = outs.first().map_or(0, |o| o.len());
    let base = rows.as_ptr();
    let full = count / QROWS * QROWS;
    for r0 in (0..full).step_by(QROWS) {
        let p: [*const u8; QROWS] =
            std::array::from_fn(|i| base.wrapping_add((r0 + i) * row_bytes));
        // SAFETY: rows r0..r0 + QROWS exist, per the caller.
        unsafe { pairs_of_rows::<Q, QROWS>(&p, pairs, outs, r0) };
    }
    for r in full..count {
        // SAFETY: row r exists, per the caller.
        unsafe { pairs_of_rows::<Q, 1>(&[base.wrapping_add(r * row_bytes)], pairs, outs, r) };
    }
}

/// Every pair's dots with the `R` rows at `p` into `outs[..][r0..r0 + R]`.
///
/// # Safety
/// As for [`rows_pairs`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pairs_of_rows<Q: SplitFormat, const R: usize>(
    p: &[*const u8; R],
    pairs: &[XPair],
    outs: &mut [&mut [f32]],
    r0: usize,
) {
    /// Pairs `j0..j0 + $np` through the kernel with `$np` pairs.
    macro_rules! run {
        ($np:literal, $j0:expr) => {{
            let xs: [&XPair; $np] = std::array::from_fn(|j| &pairs[$j0 + j]);
            let mut out = [[[0f32; R]; 2]; $np];
            // SAFETY: forwarded from the caller.
            unsafe { rows_pairs::<Q, R, $np>(p, &xs, &mut out) };
            for (j, o) in out.iter().enumerate() {
                for (h, v) in o.iter().enumerate() {
                    outs[2 * ($j0 + j) + h][r0..r0 + R].copy_from_slice(v);
                }
            }
        }};
    }
    let mut j0 = 0;
    while j0 < pairs.len() {
        match pairs.len() - j0 {
            1 => run!(1, j0),
            2 => run!(2, j0),
            3 => run!(3, j0),
            _ => run!(4, j0),
        }
        j0 += PAIRS.min(pairs.len() - j0);
    }
}
