//! How each quantized format reads for the int8-x kernels ([`super::int8_rows`]): eight
//! 32-weight blocks at a time (a K-quant super-block, or a chunk of eight blocks of the 32-block
//! formats) decoded into one byte vector of quants per block in weight order, plus the f32
//! factors that turn a block's exact integer dot into its share of the row's dot.
//!
//! A weight is `scale·(u − BIAS) + min` with `u` the stored quant as an unsigned byte (signed
//! for Q8_0), `scale` per 32-block or per 16-weight half, and `min` per 32-block or per half
//! (0 where the format has none). The kernels take the bias in integers from the x's
//! [`super::int8::X8::neg8`], and the mins against x's d·Σq sums.

use super::int8::{XOrder, X8};
use super::kquant::{KFormat, Q2K, Q3K, Q4K, Q5K, Q6K};
use super::quant::{halves8, QuantFormat, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use std::arch::x86_64::*;

/// Tokens one kernel call dots with its rows (callers with more split them).
pub(crate) const TOKENS: usize = 8;

/// Where a format's mins sit.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mins {
    /// No mins.
    None,
    /// One per 32-block, eight in `Decoded::min[0]`.
    Per32,
    /// One per 16-weight half, sixteen in `Decoded::min`.
    Per16,
}

/// Eight blocks decoded (see the module docs).
pub(super) struct Decoded {
    /// Block k's 32 quants `u` as bytes in weight order (blocks past the chunk's end: unset).
    pub(super) q: [__m256i; 8],
    /// The scales: per 32-block in `scale[0]` (lane k: block k), or per half in both (lane j of
    /// `scale[h]`: half 8h + j).
    pub(super) scale: [__m256; 2],
    /// The mins, laid out as [`Mins`] says (zeros where the format has none).
    pub(super) min: [__m256; 2],
}

/// A quantized format as the int8-x kernels read it.
pub(super) trait Int8Format {
    /// Bytes of eight blocks (one super-block of the K-quants).
    const CHUNK_BYTES: usize;
    /// Bytes of one 32-block, for a partial last chunk (the 32-block formats only; a K-quant row
    /// is whole super-blocks).
    const BLOCK_BYTES: usize;
    /// Whether the quants are signed bytes (Q8_0) rather than unsigned ones below 64.
    const SIGNED: bool;
    /// Subtracted from every quant: 0, 1, 4, 8, 12, 16 or 32.
    const BIAS: i32;
    /// Whether the scales are per 16-weight half (else per 32-block).
    const PER16: bool;
    /// Where the mins sit.
    const MINS: Mins;
    /// The order of a block's quants in [`Decoded::q`] (and the x they are dotted with).
    const ORDER: XOrder = XOrder::Natural;

    /// Whether each block decodes on its own ([`Int8Format::block`], the 32-block formats): a
    /// one-token kernel then decodes block by block beside its dots instead of chunk by chunk.
    const BLOCKWISE: bool;

    /// The first `n` blocks (1..=8; always 8 for the K-quants) of the chunk at `p`.
    ///
    /// # Safety
    /// `n` blocks readable at `p`; the CPU has AVX2, FMA and F16C.
    unsafe fn decode(p: *const u8, n: usize) -> Decoded;

    /// Block `k`'s quants `u` of the chunk at `p` (as in [`Decoded::q`]); only where
    /// `BLOCKWISE`.
    ///
    /// # Safety
    /// Block k readable at `p`; the CPU has AVX2, FMA and F16C.
    unsafe fn block(p: *const u8, k: usize) -> __m256i;

    /// The scales and mins of the first `n` blocks of the chunk at `p` (as in
    /// [`Decoded::scale`]`[0]` and [`Decoded::min`]`[0]`); only where `BLOCKWISE`.
    ///
    /// # Safety
    /// As for [`Int8Format::decode`].
    unsafe fn factors(p: *const u8, n: usize) -> (__m256, __m256);

    /// Block `k`'s two half scales in the lanes of its dot ([`XOrder::lane_halves`]); only
    /// where `BLOCKWISE` and `PER16`.
    ///
    /// # Safety
    /// As for [`Int8Format::block`].
    unsafe fn half_scales(_p: *const u8, _k: usize) -> __m256 {
        unreachable!("only the blockwise formats scaled per 16 have half scales")
    }

    /// Whether the format has a fused kernel of its own ([`Int8Format::fused`], the lattice
    /// formats' [`super::lattice_x8`]) that every int8-x product (dense, batched, by index)
    /// takes instead of the generic decode-then-dot kernel.
    const FUSED: bool = false;

    /// The fused kernel, as [`super::int8_rows::rows_of`] is called: out[i][t] = dot(row i,
    /// token t) for `R` rows and at most `T` tokens; only where `FUSED`.
    ///
    /// # Safety
    /// As for the generic kernel.
    unsafe fn fused<const R: usize, const T: usize, const FETCH: bool>(
        _p: &[*const u8; R],
        _next: &[*const u8; R],
        _xs: &[&X8],
        _blocks: usize,
    ) -> [[f32; TOKENS]; R] {
        unreachable!("the format has no fused int8-x kernel")
    }
}

/// 32 unsigned nibbles of the 16 bytes at `q`, in weight order (low nibbles are weights 0..16).
///
/// # Safety
/// 16 bytes readable at `q`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(q: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes per the caller, unaligned.
    let v = unsafe { _mm_loadu_si128(q.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// 16 in byte j where bit j of `qh` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits(qh: u32) -> __m256i {
    // Byte j takes byte j / 8 of qh, then keeps bit j % 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(16))
}

/// `value` in the bytes of `v` that have bit `bit` set, zero elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_bytes(v: __m256i, bit: usize, value: i8) -> __m256i {
    let m = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, m), m);
    _mm256_and_si256(set, _mm256_set1_epi8(value))
}

/// 32 bytes at `p`, unaligned.
///
/// # Safety
/// 32 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: per the caller.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// [`Int8Format`] for a 32-block format: its block size, sign, bias and mins, how a block's
/// quants read (`$quants`: a function of the block's address) and, optionally, how n blocks'
/// scale and min factors read (`factors`: a function of the first block's address and n;
/// default: an f16 scale leading each block, and an f16 min after it where the format has mins).
macro_rules! impl_blocks {
    ($t:ty, signed $signed:expr, bias $bias:expr, mins $mins:expr, $quants:expr) => {
        impl_blocks!($t, signed $signed, bias $bias, mins $mins,
            factors |p: *const u8, n: usize| {
                let bb = <$t as QuantFormat>::BLOCK_BYTES;
                let min = match $mins {
                    Mins::None => _mm256_setzero_ps(),
                    _ => halves8(p.add(2), bb, n),
                };
                (halves8(p, bb, n), min)
            },
            $quants);
    };
    ($t:ty, signed $signed:expr, bias $bias:expr, mins $mins:expr, factors $factors:expr,
     $quants:expr) => {
        impl Int8Format for $t {
            const CHUNK_BYTES: usize = 8 * <$t as QuantFormat>::BLOCK_BYTES;
            const BLOCK_BYTES: usize = <$t as QuantFormat>::BLOCK_BYTES;
            const SIGNED: bool = $signed;
            const BIAS: i32 = $bias;
            const PER16: bool = false;
            const MINS: Mins = $mins;
            const BLOCKWISE: bool = true;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, n: usize) -> Decoded {
                let mut q = [_mm256_setzero_si256(); 8];
                // SAFETY: the n blocks at p are readable per the caller.
                unsafe {
                    for (k, qk) in q.iter_mut().enumerate().take(n) {
                        *qk = <Self as Int8Format>::block(p, k);
                    }
                    let (scale, min) = <Self as Int8Format>::factors(p, n);
                    Decoded {
                        q,
                        scale: [scale, _mm256_setzero_ps()],
                        min: [min, _mm256_setzero_ps()],
                    }
                }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn block(p: *const u8, k: usize) -> __m256i {
                // SAFETY: block k is readable per the caller; its quants follow its scale (and
                // min).
                unsafe { $quants(p.add(k * <Self as QuantFormat>::BLOCK_BYTES)) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8, n: usize) -> (__m256, __m256) {
                // SAFETY: the n blocks at p are readable per the caller; `$factors` reads only
                // their scales (and mins).
                unsafe { $factors(p, n) }
            }
        }
    };
}
pub(super) use impl_blocks;
// Each `$quants` runs inside `block`'s unsafe block: it is called with a readable block; the quants' offsets are the
// formats' own (Q8_0: 32 bytes after d; Q4: 16 nibble bytes after d (and m); Q5: qh, then the
// nibbles).
impl_blocks!(Q8_0, signed true, bias 0, mins Mins::None, |b: *const u8| { load32(b.add(2)) });
impl_blocks!(Q4_0, signed false, bias 8, mins Mins::None, |b: *const u8| { nibbles(b.add(2)) });
impl_blocks!(Q4_1, signed false, bias 0, mins Mins::Per32, |b: *const u8| { nibbles(b.add(4)) });
impl_blocks!(Q5_0, signed false, bias 16, mins Mins::None, |b: *const u8| {
    let qh = (b.add(2) as *const u32).read_unaligned();
    _mm256_or_si256(nibbles(b.add(6)), fifth_bits(qh))
});
impl_blocks!(Q5_1, signed false, bias 0, mins Mins::Per32, |b: *const u8| {
    let qh = (b.add(4) as *const u32).read_unaligned();
    _mm256_or_si256(nibbles(b.add(8)), fifth_bits(qh))
});

/// [`Int8Format`] for a K-quant: its bias and mins, and how the eight blocks' quants read
/// (`$quants`: a function of the super-block's address giving the eight byte vectors).
macro_rules! impl_k {
    ($t:ty, bias $bias:expr, mins $mins:expr, $quants:expr) => {
        impl Int8Format for $t {
            const CHUNK_BYTES: usize = <$t as KFormat>::BYTES;
            const BLOCK_BYTES: usize = 0;
            const SIGNED: bool = false;
            const BIAS: i32 = $bias;
            const PER16: bool = <$t as KFormat>::PER16;
            const MINS: Mins = $mins;
            const BLOCKWISE: bool = false;

            unsafe fn block(_p: *const u8, _k: usize) -> __m256i {
                unreachable!("a K-quant super-block decodes whole")
            }

            unsafe fn factors(_p: *const u8, _n: usize) -> (__m256, __m256) {
                unreachable!("a K-quant super-block decodes whole")
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, _n: usize) -> Decoded {
                // SAFETY: the super-block at p is readable per the caller.
                unsafe {
                    let f = <$t as KFormat>::factors(p);
                    let neg = _mm256_set1_ps(-0.0);
                    Decoded {
                        q: $quants(p),
                        scale: f.scale,
                        // Factors hold what is subtracted: w = scale·q − min.
                        min: [_mm256_xor_ps(f.min[0], neg), _mm256_xor_ps(f.min[1], neg)],
                    }
                }
            }
        }
    };
}

/// Q2_K's quants: block 4n + j is bits 2j..2j + 2 of the 32 bytes at 16 + 32n.
///
/// # Safety
/// A readable Q2_K super-block at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_quants(p: *const u8) -> [__m256i; 8] {
    let three = _mm256_set1_epi8(3);
    let mut q = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        // SAFETY: the 64 quant bytes start at 16.
        let v = unsafe { load32(p.add(16 + 32 * n)) };
        q[4 * n] = _mm256_and_si256(v, three);
        q[4 * n + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(v), three);
        q[4 * n + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), three);
        q[4 * n + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(v), three);
    }
    q
}

/// Q3_K's quants (before its bias of 4): block b = 4n + j is bits 2j..2j + 2 of the 32 bytes at
/// 32 + 32n, plus 4 where bit b of the 32 hmask bytes is set.
///
/// # Safety
/// A readable Q3_K super-block at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_quants(p: *const u8) -> [__m256i; 8] {
    // SAFETY: hmask is the first 32 bytes.
    let hm = unsafe { load32(p) };
    // SAFETY: a Q3_K super-block is Q2_K's quant layout shifted by 16 bytes (its 64 quant
    // bytes start at 32), so the same reader at p + 16 reads them.
    let mut q = unsafe { q2k_quants(p.add(16)) };
    for (b, qb) in q.iter_mut().enumerate() {
        *qb = _mm256_or_si256(*qb, bit_bytes(hm, b, 4));
    }
    q
}

/// Q4_K's and Q5_K's low nibbles (at `QS`): block 2c is the low nibbles of the 32 bytes at
/// QS + 32c, block 2c + 1 their high nibbles.
///
/// # Safety
/// A readable super-block at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45k_nibbles<const QS: usize>(p: *const u8) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        // SAFETY: the 128 nibble bytes start at QS.
        let v = unsafe { load32(p.add(QS + 32 * c)) };
        q[2 * c] = _mm256_and_si256(v, low);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
    }
    q
}

/// Q5_K's quants: Q4_K's nibbles at 48, plus 16 where bit b of the 32 qh bytes at 16 is set.
///
/// # Safety
/// A readable Q5_K super-block at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k_quants(p: *const u8) -> [__m256i; 8] {
    // SAFETY: qh is bytes 16..48, the nibbles 48..176.
    let (qh, mut q) = unsafe { (load32(p.add(16)), q45k_nibbles::<48>(p)) };
    for (b, qb) in q.iter_mut().enumerate() {
        *qb = _mm256_or_si256(*qb, bit_bytes(qh, b, 16));
    }
    q
}

/// Q6_K's quants (before its bias of 32): in half n, with A and B the 32 ql bytes at 64n and
/// 64n + 32 and H the 32 qh bytes at 128 + 32n, block 4n + k is the low (k = 0, 1: A, B) or
/// high (k = 2, 3: A, B) nibbles plus bits 2k..2k + 2 of H as bits 4..6.
///
/// # Safety
/// A readable Q6_K super-block at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_quants(p: *const u8) -> [__m256i; 8] {
    let (low, two) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let mut q = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        // SAFETY: ql is bytes 0..128, qh 128..192.
        let (a, b, h) = unsafe {
            (
                load32(p.add(64 * n)),
                load32(p.add(64 * n + 32)),
                load32(p.add(128 + 32 * n)),
            )
        };
        let highs = [
            _mm256_slli_epi16::<4>(h),
            _mm256_slli_epi16::<2>(h),
            h,
            _mm256_srli_epi16::<2>(h),
        ];
        let lows = [
            _mm256_and_si256(a, low),
            _mm256_and_si256(b, low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(a), low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(b), low),
        ];
        for k in 0..4 {
            q[4 * n + k] = _mm256_or_si256(lows[k], _mm256_and_si256(highs[k], two));
        }
    }
    q
}

// Each `$quants` runs inside the decoder's unsafe block, called with a readable super-block,
// as the readers require.
impl_k!(Q2K, bias 0, mins Mins::Per16, |p: *const u8| { q2k_quants(p) });
impl_k!(Q3K, bias 4, mins Mins::None, |p: *const u8| { q3k_quants(p) });
impl_k!(Q4K, bias 0, mins Mins::Per16, |p: *const u8| { q45k_nibbles::<16>(p) });
impl_k!(Q5K, bias 0, mins Mins::Per16, |p: *const u8| { q5k_quants(p) });
impl_k!(Q6K, bias 32, mins Mins::None, |p: *const u8| { q6k_quants(p) });
