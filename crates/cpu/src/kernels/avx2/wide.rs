//! 512-bit forms of the hottest products, taken on the AVX-512 level (F/BW/VL/VNNI besides
//! AVX2, FMA and F16C). They compute exactly what their AVX2 forms compute, on the same
//! prepared x, with the integer work of a whole 32-block in one register:
//!
//! - the int16-x dot of the 32-weight block formats (see [`super::int16`]): a block's 32 quants
//!   widened to one vector of i16 and dotted with x's 32 i16 by one `vpdpwssd`, which also adds
//!   Q4_0's −8·Σx (a per-block vector computed once for all rows), then one conversion and one
//!   FMA per block-row. The AVX2 form needs two `pmaddwd`, two adds and a subtraction for the
//!   same block; on a core that is out of vector issue slots (a Q4_0 decode step on one thread
//!   is), that is most of the difference. Each format says how its 32 quants become one vector
//!   ([`WideFormat::quants32`]): nibbles are split inside one 512-bit register, Q5's fifth bits
//!   enter through a mask register, and Q5_0's −16 joins Q4_0's −8 in the integer start value.

use super::int16::{chunk_factors, each_chunk, XQuant};
use super::quant::{QuantFormat, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use std::arch::x86_64::*;

/// A 32-weight block format's quants as one 512-bit vector.
pub(super) trait WideFormat: QuantFormat {
    /// Subtracted from every quant (Q4_0: 8, Q5_0: 16, else 0), in the dot's integer start.
    const BIAS: i16;

    /// The block's 32 quants (before `BIAS`) as i16, in weight order.
    ///
    /// # Safety
    /// `BLOCK_BYTES` readable at `p`; the CPU has the AVX-512 level.
    unsafe fn quants32(p: *const u8) -> __m512i;
}

/// The 32 nibbles of the 16 bytes at `q` as i16 in weight order (low nibbles are weights 0..16,
/// high nibbles 16..32): the bytes broadcast to all four 128-bit lanes, each lane's eight bytes
/// zero-extended to words in place, the upper half shifted by four, all masked to four bits.
///
/// # Safety
/// 16 bytes readable at `q`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles32(q: *const u8) -> __m512i {
    // SAFETY: 16 readable bytes per the caller, unaligned.
    let v = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(q.cast()) });
    // Word k of lane l takes byte 8·(l % 2) + k; the high byte of every word is zeroed (−1).
    let z = -1i8;
    #[rustfmt::skip]
    let pick = _mm512_set_epi8(
        z, 15, z, 14, z, 13, z, 12, z, 11, z, 10, z, 9, z, 8,
        z, 7, z, 6, z, 5, z, 4, z, 3, z, 2, z, 1, z, 0,
        z, 15, z, 14, z, 13, z, 12, z, 11, z, 10, z, 9, z, 8,
        z, 7, z, 6, z, 5, z, 4, z, 3, z, 2, z, 1, z, 0,
    );
    let words = _mm512_shuffle_epi8(v, pick);
    let shift = _mm512_set_epi64(
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0x0004_0004_0004_0004,
        0,
        0,
        0,
        0,
    );
    _mm512_and_si512(_mm512_srlv_epi16(words, shift), _mm512_set1_epi16(0x0F))
}

/// A Q5 block's 32 five-bit quants: the nibbles at `p + 4` plus 16 where bit j of the u32 `qh`
/// at `p` is set (weight j).
///
/// # Safety
/// 20 bytes readable at `p`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn five_bits32(p: *const u8) -> __m512i {
    // SAFETY: 20 readable bytes per the caller: qh, then the nibbles.
    let (qh, nib) = unsafe { ((p as *const u32).read_unaligned(), nibbles32(p.add(4))) };
    _mm512_mask_add_epi16(nib, qh, nib, _mm512_set1_epi16(16))
}

impl WideFormat for Q8_0 {
    const BIAS: i16 = 0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn quants32(p: *const u8) -> __m512i {
        // SAFETY: the 32 quant bytes follow the f16 scale in the readable block.
        _mm512_cvtepi8_epi16(unsafe { _mm256_loadu_si256(p.add(2).cast()) })
    }
}

/// [`WideFormat`] for a 4-bit format (`$decode` [`nibbles32`], its nibbles from byte `$at`) or
/// a 5-bit one ([`five_bits32`], its qh and then its nibbles from byte `$at`).
macro_rules! impl_wide {
    ($t:ty, $bias:expr, $decode:ident at $at:expr) => {
        impl WideFormat for $t {
            const BIAS: i16 = $bias;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn quants32(p: *const u8) -> __m512i {
                // SAFETY: the decoder's bytes start at $at in the readable block.
                unsafe { $decode(p.add($at)) }
            }
        }
    };
}
impl_wide!(Q4_0, 8, nibbles32 at 2);
impl_wide!(Q4_1, 0, nibbles32 at 4);
impl_wide!(Q5_0, 16, five_bits32 at 2);
impl_wide!(Q5_1, 0, five_bits32 at 4);

/// out[i] = dot(row i, x) for the `R` quantized rows starting at `p[i]`, on the int16 x; with
/// `FETCH`, the rows at `next[i]` are fetched into the cache chunk by chunk alongside. The
/// 512-bit form of [`super::int16::quant_rows_i16`].
///
/// # Safety
/// `xq.blocks()` blocks must be readable at each `p[i]`; `out.len() >= R`; the CPU must have
/// AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C. `next` may hold any addresses (prefetches never
/// fault).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quant_rows_i16<Q: WideFormat, const R: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [_mm512_setzero_ps(); R];
    // Q4_1 and Q5_1's Σ m_b·Σx_b, eight blocks per FMA.
    let mut offs = [_mm256_setzero_ps(); R];
    each_chunk::<Q, R, FETCH>(next, xq.blocks(), |b0, n| {
        // SAFETY: blocks b0..b0 + n exist, per the caller.
        unsafe { chunk_dot::<Q, R>(p, xq, b0, n, &mut acc, &mut offs) }
    });
    for ((a, m), o) in acc.iter().zip(&offs).zip(out.iter_mut()) {
        *o = _mm512_reduce_add_ps(*a) + super::reduce::hsum(*m);
    }
}

/// Add blocks `b0..b0 + n` (`n <= CHUNK`) of `R` rows to the accumulators (see
/// [`super::int16`]'s `chunk_dot`, of which this is the 512-bit form).
///
/// # Safety
/// As for [`quant_rows_i16`], with `b0 + n <= xq.blocks()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_dot<Q: WideFormat, const R: usize>(
    p: &[*const u8; R],
    xq: &XQuant,
    b0: usize,
    n: usize,
    acc_out: &mut [__m512; R],
    offs: &mut [__m256; R],
) {
    // A local copy: through the reference, LLVM stored every accumulator after each FMA.
    let mut acc = *acc_out;
    // SAFETY: per the caller.
    let ds = unsafe { chunk_factors::<Q, R>(p, xq, (b0, n), offs) };
    let xp = xq.q.as_ptr();
    for k in 0..n {
        let b = b0 + k;
        // SAFETY: b < blocks, so xq.q[32b..32b + 32] and every row's block b are in bounds per
        // the caller.
        unsafe {
            let x = _mm512_loadu_si512(xp.add(32 * b).cast());
            // Each i32 lane's share of −BIAS·Σx (exact in i32: |lane| <= 16·2·32767).
            let start = match Q::BIAS {
                0 => _mm512_setzero_si512(),
                bias => _mm512_madd_epi16(x, _mm512_set1_epi16(-bias)),
            };
            for (i, (a, dsi)) in acc.iter_mut().zip(&ds).enumerate() {
                let q = Q::quants32(p[i].add(b * Q::BLOCK_BYTES));
                let s = _mm512_dpwssd_epi32(start, q, x);
                let d = _mm512_set1_ps(*dsi.get_unchecked(k));
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *a);
            }
        }
    }
    *acc_out = acc;
}
