//! The low-bit formats (NVFP4, Q1_0, Q2_0; layouts in `powerinfer_core::dtype`) under AVX2.
//! For the int8-x kernels of [`super::int8_rows`] each format is an [`Int8Format`] whose
//! 32-weight sub-blocks (half an NVFP4 or Q2_0 block, a quarter of a Q1_0 block) decode on
//! their own into 32 unsigned bytes u with a bias (w = u − BIAS, the bias taken in integers
//! from x's sums): NVFP4's doubled E2M1 values plus 12, Q1_0's bits as 0 or 2 less 1, Q2_0's
//! codes less 1. The decoders read each bit field with the fewest operations and give the
//! quants in the order that leaves them in ([`XOrder`]; x is reordered alike once per vector):
//! - NVFP4 ([`XOrder::Nibbles`]): the sub-block's 16 bytes in both 128-bit lanes, the second
//!   lane shifted right by 4, masked to nibbles and looked up in the biased values with one
//!   byte shuffle. Scaled per 16 weights (its two UE4M3 scales per sub-block: each half's
//!   integer dot scaled by its own).
//! - Q2_0 ([`XOrder::Crumbs`]): the sub-block's 8 bytes in each 64-bit lane, lane i shifted
//!   right by 2i and masked to two bits (position 8i + b: field i of byte b).
//! - Q1_0 (weight order): the 4 sign bytes spread so that byte j holds the source byte of
//!   weight j, its bit tested by mask and compare, and the mask kept as 2.
//!
//! Q1_0 and Q2_0 are scaled per 32 (their block's f16 d). These formats take the int8 x
//! whatever the process's numerics (`crate::dispatch::Activations`); their f32-x kernels here
//! (dot, row accumulation, row decoding) decode each sub-block in weight order into its signed
//! values ([`LowBit::natural`]) and serve a non-finite x, and [`rows_i16`] the int16 x where a
//! caller hands one. There, NVFP4's nibbles are looked up in MXFP4's doubled E2M1 values (16
//! index bytes: low nibbles of bytes 0..8, their high nibbles, then the same of bytes 8..16);
//! Q2_0's 8 bytes and Q1_0's 4 are spread so that byte j holds the source byte of weight j,
//! then its two bits (or one) are tested by mask and compare.

use super::int16::XQuant;
use super::int8::XOrder;
use super::int8_formats::{Decoded, Int8Format, Mins};
use super::reduce::hsum;
use super::row_group::{fetch_lines, RowGroup};
use powerinfer_core::dequantize::MXFP4_VALUES;
use powerinfer_core::lowbit::UE4M3_HALF;
use std::arch::x86_64::*;

/// NVFP4: 4 UE4M3 scales and 32 bytes of E2M1 indices per 64 weights.
pub(super) struct NVFP4;
/// Q1_0: f16 d and 16 bytes of sign bits per 128 weights.
pub(super) struct Q1;
/// Q2_0: f16 d and 16 bytes of 2-bit codes per 64 weights.
pub(super) struct Q2;

/// 32 bytes in both 128-bit lanes' order, for shuffles and masks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes32(b: &[u8; 32]) -> __m256i {
    // SAFETY: 32 readable bytes, unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// Byte j: `f(j)`, for the constant vectors below.
const fn table32(f: [u8; 4], per: usize) -> [u8; 32] {
    let mut t = [0u8; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = f[(j / per) % 4];
        j += 1;
    }
    t
}

/// Byte j = j / 4 (Q2_0's source byte of weight j, within each lane's copy of the 8 bytes).
const Q2_SPREAD: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = (j / 4) as u8;
        j += 1;
    }
    t
};
/// Byte j = bit 2(j % 4), the low bit of weight j's code.
const Q2_LOW: [u8; 32] = table32([1, 4, 16, 64], 1);
/// Byte j = bit 2(j % 4) + 1, the high bit of weight j's code.
const Q2_HIGH: [u8; 32] = table32([2, 8, 32, 128], 1);
/// Byte j = j / 8 (Q1_0's source byte of weight j, within each lane's copy of the 4 bytes).
const Q1_SPREAD: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = (j / 8) as u8;
        j += 1;
    }
    t
};
/// Byte j = bit j % 8.
const Q1_BIT: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = 1 << (j % 8);
        j += 1;
    }
    t
};

/// −1 in each byte of `v` that has all the bits of the same byte of `mask`, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn has_bits(v: __m256i, mask: __m256i) -> __m256i {
    _mm256_cmpeq_epi8(_mm256_and_si256(v, mask), mask)
}

/// NVFP4's sub-block `k` (0..8) of the chunk at `p`: block k / 2's indices 16·(k % 2)..
///
/// # Safety
/// Block k / 2 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_sub(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 16 index bytes lie in block k / 2 (its qs from byte 4).
    let v = unsafe { _mm_loadu_si128(p.add(36 * (k / 2) + 4 + 16 * (k % 2)).cast()) };
    let m = _mm_set1_epi8(15);
    let (lo, hi) = (
        _mm_and_si128(v, m),
        _mm_and_si128(_mm_srli_epi16::<4>(v), m),
    );
    // Weights 0..8 are the low nibbles of bytes 0..8, 8..16 their high nibbles; the same for
    // the second 16 weights and bytes 8..16.
    let idx = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
    // SAFETY: MXFP4_VALUES is 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast()) };
    _mm256_shuffle_epi8(_mm256_set_m128i(t, t), idx)
}

/// NVFP4's per-16 scales of the first `n` sub-blocks of the chunk at `p`: half j (of 16) in
/// lane j % 8 of the vector j / 8, zeros past 2n.
///
/// # Safety
/// The n / 2 blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_scales(p: *const u8, n: usize) -> [__m256; 2] {
    let mut s = [0f32; 16];
    for b in 0..n / 2 {
        // SAFETY: block b < n / 2 is readable; its scales are its first 4 bytes.
        let head = unsafe { (p.add(36 * b) as *const [u8; 4]).read_unaligned() };
        for (t, &e) in head.iter().enumerate() {
            s[4 * b + t] = UE4M3_HALF[e as usize];
        }
    }
    // SAFETY: sixteen f32 on the stack.
    unsafe {
        [
            _mm256_loadu_ps(s.as_ptr()),
            _mm256_loadu_ps(s.as_ptr().add(8)),
        ]
    }
}

/// Q2_0's sub-block `k` (0..8) of the chunk at `p`: block k / 2's code bytes 8·(k % 2)..
///
/// # Safety
/// Block k / 2 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_sub(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 8 code bytes lie in block k / 2 (its qs from byte 2).
    let bits = unsafe { (p.add(18 * (k / 2) + 2 + 8 * (k % 2)) as *const i64).read_unaligned() };
    let v = _mm256_shuffle_epi8(_mm256_set1_epi64x(bits), bytes32(&Q2_SPREAD));
    let (lo, hi) = (
        has_bits(v, bytes32(&Q2_LOW)),
        has_bits(v, bytes32(&Q2_HIGH)),
    );
    // code − 1 = −1 + low + 2·high, the bits as −1 where set.
    let t = _mm256_sub_epi8(_mm256_set1_epi8(-1), lo);
    _mm256_sub_epi8(_mm256_sub_epi8(t, hi), hi)
}

/// Q1_0's sub-block `k` (0..8) of the chunk at `p`: block k / 4's sign bytes 4·(k % 4)..
///
/// # Safety
/// Block k / 4 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1_sub(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 4 sign bytes lie in block k / 4 (its qs from byte 2).
    let bits = unsafe { (p.add(18 * (k / 4) + 2 + 4 * (k % 4)) as *const i32).read_unaligned() };
    let v = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), bytes32(&Q1_SPREAD));
    let set = has_bits(v, bytes32(&Q1_BIT));
    // 1 where the bit is set, else −1: −1 − 2·(−1 or 0).
    _mm256_sub_epi8(_mm256_sub_epi8(_mm256_set1_epi8(-1), set), set)
}

/// The f16 d of the 18-byte block holding each of the first `n` sub-blocks of the chunk at
/// `p` (`per` sub-blocks to a block), one per lane, zeros past `n`.
///
/// # Safety
/// The blocks of those sub-blocks readable at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn d_per_sub(p: *const u8, n: usize, per: usize) -> __m256 {
    // The eight f16 lanes as two words, each block's d read once (no stores to reload).
    let mut w = [0u64; 2];
    for b in 0..n.div_ceil(per) {
        // SAFETY: block b holds one of the first n sub-blocks, so it is readable; its d is its
        // first 2 bytes.
        let h = u64::from(unsafe { (p.add(18 * b) as *const u16).read_unaligned() });
        for k in b * per..(b * per + per).min(n) {
            w[k / 4] |= h << (16 * (k % 4));
        }
    }
    _mm256_cvtph_ps(_mm_set_epi64x(w[1] as i64, w[0] as i64))
}

/// NVFP4's doubled E2M1 values plus its bias of 12 (0..=24: unsigned bytes for the dot).
const NVFP4_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (MXFP4_VALUES[i] + 12) as u8;
        i += 1;
    }
    t
};

/// NVFP4's sub-block `k` (0..8) of the chunk at `p` as biased values u (w = u − 12) in
/// [`XOrder::Nibbles`]: the low nibbles of its 16 bytes, then their high nibbles.
///
/// # Safety
/// Block k / 2 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_biased(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 16 index bytes lie in block k / 2 (its qs from byte 4).
    let v = unsafe { _mm_loadu_si128(p.add(36 * (k / 2) + 4 + 16 * (k % 2)).cast()) };
    let both = _mm256_broadcastsi128_si256(v);
    let idx = _mm256_and_si256(
        _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
        _mm256_set1_epi8(15),
    );
    // SAFETY: NVFP4_BIASED is 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(NVFP4_BIASED.as_ptr().cast()) };
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), idx)
}

/// NVFP4's sub-block `k`'s two half scales in the lanes of its dot in [`XOrder::Nibbles`].
///
/// # Safety
/// Block k / 2 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_half_scales(p: *const u8, k: usize) -> __m256 {
    const _: () = assert!(matches!(
        XOrder::Nibbles.lane_halves(),
        [0, 0, 1, 1, 0, 0, 1, 1]
    ));
    // SAFETY: the sub-block's two scale bytes lie in block k / 2's first 4; every byte indexes
    // the 256-entry table.
    unsafe {
        let e = p.add(36 * (k / 2) + 2 * (k % 2));
        let s0 = _mm256_broadcast_ss(UE4M3_HALF.get_unchecked(*e as usize));
        let s1 = _mm256_broadcast_ss(UE4M3_HALF.get_unchecked(*e.add(1) as usize));
        _mm256_blend_ps::<0b1100_1100>(s0, s1)
    }
}

/// Q2_0's sub-block `k` (0..8) of the chunk at `p` as its codes u (w = u − 1) in
/// [`XOrder::Crumbs`].
///
/// # Safety
/// Block k / 2 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_codes(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 8 code bytes lie in block k / 2 (its qs from byte 2).
    let bits = unsafe { (p.add(18 * (k / 2) + 2 + 8 * (k % 2)) as *const i64).read_unaligned() };
    let shifted = _mm256_srlv_epi64(_mm256_set1_epi64x(bits), _mm256_setr_epi64x(0, 2, 4, 6));
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

/// Q1_0's sub-block `k` (0..8) of the chunk at `p` as u = 2·bit (w = u − 1), weight order.
///
/// # Safety
/// Block k / 4 readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1_doubled(p: *const u8, k: usize) -> __m256i {
    // SAFETY: the 4 sign bytes lie in block k / 4 (its qs from byte 2).
    let bits = unsafe { (p.add(18 * (k / 4) + 2 + 4 * (k % 4)) as *const i32).read_unaligned() };
    let v = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), bytes32(&Q1_SPREAD));
    _mm256_and_si256(has_bits(v, bytes32(&Q1_BIT)), _mm256_set1_epi8(2))
}

/// Q1_0's scales of `n` sub-blocks, as [`Decoded::scale`] holds them (its blocks' d, per 32).
///
/// # Safety
/// As for [`d_per_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1_scales(p: *const u8, n: usize) -> [__m256; 2] {
    // SAFETY: per the caller.
    [unsafe { d_per_sub(p, n, 4) }, _mm256_setzero_ps()]
}

/// Q2_0's scales of `n` sub-blocks, as [`Decoded::scale`] holds them.
///
/// # Safety
/// As for [`d_per_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_scales(p: *const u8, n: usize) -> [__m256; 2] {
    // SAFETY: per the caller.
    [unsafe { d_per_sub(p, n, 2) }, _mm256_setzero_ps()]
}

/// A low-bit format as its f32-x kernels read it: each sub-block's signed values in weight
/// order, and the scales of a chunk's sub-blocks.
pub(super) trait LowBit: Int8Format {
    /// Sub-block `k`'s values of the chunk at `p`, in weight order.
    ///
    /// # Safety
    /// Sub-block k readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn natural(p: *const u8, k: usize) -> __m256i;

    /// The scales of the first `n` sub-blocks of the chunk at `p`, as [`Decoded::scale`] holds
    /// them.
    ///
    /// # Safety
    /// The blocks of the first `n` sub-blocks readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn scales(p: *const u8, n: usize) -> [__m256; 2];
}

/// [`LowBit`] and [`Int8Format`] for a low-bit format: its chunk bytes (eight sub-blocks),
/// whether it is scaled per 16, its bias and order, its int8-x sub-block decoder (`$biased`)
/// and its weight-order one (`$natural`), and how a chunk's scales read (`$scales`: a function
/// of the chunk's address and n).
macro_rules! impl_lowbit {
    ($t:ty, chunk $chunk:expr, per16 $per16:expr, bias $bias:expr, order $order:expr,
     $biased:ident, $natural:ident, $scales:ident $(, halves $halves:ident)?) => {
        impl LowBit for $t {
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn natural(p: *const u8, k: usize) -> __m256i {
                // SAFETY: sub-block k is readable per the caller.
                unsafe { $natural(p, k) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn scales(p: *const u8, n: usize) -> [__m256; 2] {
                // SAFETY: the n sub-blocks' blocks are readable per the caller.
                unsafe { $scales(p, n) }
            }
        }

        impl Int8Format for $t {
            const CHUNK_BYTES: usize = $chunk;
            // A partial chunk's bytes per sub-block, rounded up (only its prefetch reads it).
            const BLOCK_BYTES: usize = ($chunk as usize).div_ceil(8);
            const SIGNED: bool = false;
            const BIAS: i32 = $bias;
            const PER16: bool = $per16;
            const MINS: Mins = Mins::None;
            const ORDER: XOrder = $order;
            const BLOCKWISE: bool = true;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, n: usize) -> Decoded {
                let mut q = [_mm256_setzero_si256(); 8];
                // SAFETY: the n sub-blocks at p are readable per the caller.
                unsafe {
                    for (k, qk) in q.iter_mut().enumerate().take(n) {
                        *qk = $biased(p, k);
                    }
                    Decoded {
                        q,
                        scale: $scales(p, n),
                        min: [_mm256_setzero_ps(); 2],
                    }
                }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn block(p: *const u8, k: usize) -> __m256i {
                // SAFETY: sub-block k is readable per the caller.
                unsafe { $biased(p, k) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8, n: usize) -> (__m256, __m256) {
                // SAFETY: the n sub-blocks are readable per the caller.
                (unsafe { $scales(p, n)[0] }, _mm256_setzero_ps())
            }

            $(
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn half_scales(p: *const u8, k: usize) -> __m256 {
                // SAFETY: sub-block k is readable per the caller.
                unsafe { $halves(p, k) }
            }
            )?
        }
    };
}

impl_lowbit!(NVFP4, chunk 144, per16 true, bias 12, order XOrder::Nibbles, nvfp4_biased,
    nvfp4_sub, nvfp4_scales, halves nvfp4_half_scales);
impl_lowbit!(Q1, chunk 36, per16 false, bias 1, order XOrder::Natural, q1_doubled, q1_sub,
    q1_scales);
impl_lowbit!(Q2, chunk 72, per16 false, bias 1, order XOrder::Crumbs, q2_codes, q2_sub,
    q2_scales);

/// Lane `i` of `v` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane(v: __m256, i: usize) -> __m256 {
    _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(i as i32))
}

/// Sub-block `k` of a decoded chunk as its 32 weights d·q in four f32 vectors (one product
/// each, as the core's decoder computes them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn weights32<F: Int8Format>(dec: &Decoded, k: usize) -> [__m256; 4] {
    let (lo, hi) = (
        _mm256_castsi256_si128(dec.q[k]),
        _mm256_extracti128_si256::<1>(dec.q[k]),
    );
    let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    let (s0, s1) = match F::PER16 {
        true => (
            lane(dec.scale[k / 4], 2 * (k % 4)),
            lane(dec.scale[k / 4], 2 * (k % 4) + 1),
        ),
        false => (lane(dec.scale[0], k), lane(dec.scale[0], k)),
    };
    [
        _mm256_mul_ps(f(lo), s0),
        _mm256_mul_ps(f(_mm_srli_si128::<8>(lo)), s0),
        _mm256_mul_ps(f(hi), s1),
        _mm256_mul_ps(f(_mm_srli_si128::<8>(hi)), s1),
    ]
}

/// Calls `each(sub-block index in the row, its 32 weights)` over the row of `len` weights at
/// `row`, chunk by chunk, fetching the row at `next` alongside.
///
/// # Safety
/// The row's `len` weights (a multiple of the format's block) readable at `row`; AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn each_sub<F: LowBit>(
    row: *const u8,
    next: *const u8,
    len: usize,
    mut each: impl FnMut(usize, [__m256; 4]),
) {
    let subs = len / 32;
    for c in 0..subs.div_ceil(8) {
        let n = (subs - 8 * c).min(8);
        let at = c * F::CHUNK_BYTES;
        let mut off = at & !63;
        while off < at + F::CHUNK_BYTES {
            fetch_lines::<1>(&[next; 8], off);
            off += 64;
        }
        let mut dec = Decoded {
            q: [_mm256_setzero_si256(); 8],
            // SAFETY: chunk c's n sub-blocks are inside the readable row.
            scale: unsafe { F::scales(row.add(at), n) },
            min: [_mm256_setzero_ps(); 2],
        };
        for (k, qk) in dec.q.iter_mut().enumerate().take(n) {
            // SAFETY: as above.
            *qk = unsafe { F::natural(row.add(at), k) };
        }
        for k in 0..n {
            each(8 * c + k, weights32::<F>(&dec, k));
        }
    }
}

/// out[i] = dot(row i, x) for the rows at `p` (f32 x, two accumulators per row).
///
/// # Safety
/// `x.len()` weights readable at each row, `out.len() >= p.len()`; AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_rows<F: LowBit>(p: &[*const u8], q: &[*const u8], x: &[f32], out: &mut [f32]) {
    let xp = x.as_ptr();
    for ((&row, &next), o) in p.iter().zip(q).zip(out.iter_mut()) {
        let mut acc = [_mm256_setzero_ps(); 2];
        // SAFETY: the row is readable per the caller; x holds 32 values per sub-block.
        unsafe {
            each_sub::<F>(row, next, x.len(), |s, w| {
                for (v, wv) in w.iter().enumerate() {
                    let xv = _mm256_loadu_ps(xp.add(32 * s + 8 * v));
                    acc[v % 2] = _mm256_fmadd_ps(*wv, xv, acc[v % 2]);
                }
            });
        }
        *o = hsum(_mm256_add_ps(acc[0], acc[1]));
    }
}

/// [`super::formats::Format::dot`] of a low-bit format.
///
/// # Safety
/// As for `Format::dot`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<F: LowBit, const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
    // SAFETY: forwarded from the caller.
    unsafe { dot_rows::<F>(&g.p[..R], &g.q[..R], x, out) }
}

/// [`super::formats::Format::axpy`] of a low-bit format: y += a[i]·row i, row by row.
///
/// # Safety
/// As for `Format::axpy`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy<F: LowBit, const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
    let yp = y.as_mut_ptr();
    for (i, &coef) in a.iter().enumerate().take(R) {
        let ai = _mm256_set1_ps(coef);
        // SAFETY: y.len() weights readable at each row per the caller; y holds 32 per
        // sub-block.
        unsafe {
            each_sub::<F>(g.p[i], g.q[i], y.len(), |s, w| {
                for (v, wv) in w.iter().enumerate() {
                    let at = yp.add(32 * s + 8 * v);
                    _mm256_storeu_ps(at, _mm256_fmadd_ps(ai, *wv, _mm256_loadu_ps(at)));
                }
            });
        }
    }
}

/// [`super::formats::Format::dequant`] of a low-bit format: the core decoder's values bit for
/// bit (one product d·q each).
///
/// # Safety
/// As for `Format::dequant`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant<F: LowBit>(row: *const u8, out: &mut [f32]) {
    let op = out.as_mut_ptr();
    // SAFETY: out.len() weights readable at row per the caller; out holds 32 per sub-block.
    unsafe {
        each_sub::<F>(row, row, out.len(), |s, w| {
            for (v, wv) in w.iter().enumerate() {
                _mm256_storeu_ps(op.add(32 * s + 8 * v), *wv);
            }
        });
    }
}

/// out[i] = dot(row i, x̂) for the `R` rows at `p` and the int16 x (x̂ = its scale·q per
/// block, formed once), through the f32-x dot: these formats have no int16-x kernel of their
/// own (they take the int8 x).
///
/// # Safety
/// `32·xq.blocks()` weights readable at each row, `out.len() >= R`; AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_i16<F: LowBit, const R: usize>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let hat: Vec<f32> =
        xq.q.iter()
            .enumerate()
            .map(|(i, &q)| xq.scale[i / 32] * q as f32)
            .collect();
    // SAFETY: forwarded from the caller.
    unsafe { dot_rows::<F>(p, next, &hat, out) }
}
