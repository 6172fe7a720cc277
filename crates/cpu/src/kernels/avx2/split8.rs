//! The int16-x dot of the 4- and 5-bit block formats on 8-bit multipliers, exactly: x's int16 value of
//! each weight is split into a high and a low signed byte, `x = 256·h + l`, so that
//! `Σ q·x = 256·Σ q·h + Σ q·l` with both sums taken by `vpdpbusd` (unsigned 4-bit quants times
//! signed bytes, four products per i32 lane). A block is one 256-bit register: its 16 nibble
//! bytes and their upper halves side by side are the 32 quants in weight order, and the two
//! `vpdpbusd` on 256 bits cost what one 512-bit `vpdpwssd` does, with a far cheaper unpacking
//! (two shifts and a mask instead of a broadcast, a byte shuffle, a variable shift and a mask on
//! 512 bits; Q5's fifth bits enter through a mask register). Q4_0's −8 and Q5_0's −16 are the
//! low sum's integer start value (−8·Σx or −16·Σx per lane, shared by all rows). Same x, same
//! products, same exact integer sums as [`super::wide`]: only faster.

use super::int16::{chunk_factors, each_chunk, XQuant};
use super::quant::{QuantFormat, Q4_0, Q4_1, Q5_0, Q5_1};
use std::arch::x86_64::*;

/// A 32-weight block format whose quants are unsigned bytes below 32.
pub(super) trait SplitFormat: QuantFormat {
    /// Subtracted from every quant (Q4_0: 8, Q5_0: 16, else 0), in the integer start value.
    const BIAS: i32;

    /// The block's 32 quants (before `BIAS`) as unsigned bytes in weight order.
    ///
    /// # Safety
    /// `BLOCK_BYTES` readable at `p`; the CPU has the AVX-512 level.
    unsafe fn quants_u8(p: *const u8) -> __m256i;
}

/// [`SplitFormat`] for a 4-bit format (`$decode` [`nibbles_u8`], its nibbles from byte `$at`)
/// or a 5-bit one ([`five_bits_u8`], its qh and then its nibbles from byte `$at`).
macro_rules! impl_split {
    ($t:ty, $bias:expr, $decode:ident at $at:expr) => {
        impl SplitFormat for $t {
            const BIAS: i32 = $bias;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn quants_u8(p: *const u8) -> __m256i {
                // SAFETY: the decoder's bytes start at $at in the readable block.
                unsafe { $decode(p.add($at)) }
            }
        }
    };
}
impl_split!(Q4_0, 8, nibbles_u8 at 2);
impl_split!(Q4_1, 0, nibbles_u8 at 4);
impl_split!(Q5_0, 16, five_bits_u8 at 2);
impl_split!(Q5_1, 0, five_bits_u8 at 4);

/// A Q5 block's 32 five-bit quants as unsigned bytes: the nibbles at `p + 4` plus 16 where bit
/// j of the u32 `qh` at `p` is set (weight j).
///
/// # Safety
/// 20 bytes readable at `p`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn five_bits_u8(p: *const u8) -> __m256i {
    // SAFETY: 20 readable bytes per the caller: qh, then the 16 nibble bytes.
    unsafe {
        let qh = (p as *const u32).read_unaligned();
        let q = nibbles_u8(p.add(4));
        _mm256_mask_add_epi8(q, qh, q, _mm256_set1_epi8(16))
    }
}

/// The 32 nibbles at `q` as unsigned bytes in weight order (low nibbles are weights 0..16,
/// high nibbles 16..32).
///
/// # Safety
/// 16 bytes readable at `q`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles_u8(q: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes per the caller, unaligned.
    let v = unsafe { _mm_loadu_si128(q.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// out[i] = dot(row i, x) for the `R` rows of a [`SplitFormat`] starting at `p[i]`,
/// on the int16 x split into bytes; with `FETCH`, the rows at `next[i]` are fetched alongside.
///
/// # Safety
/// `xq.blocks()` blocks readable at each `p[i]`; `out.len() >= R`; the CPU has AVX-512
/// F/BW/VL/VNNI, AVX2, FMA and F16C. `next` may hold any addresses.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quant_rows_split<Q: SplitFormat, const R: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut offs = [_mm256_setzero_ps(); R];
    each_chunk::<Q, R, FETCH>(next, xq.blocks(), |b0, n| {
        // SAFETY: blocks b0..b0 + n exist, per the caller.
        unsafe { chunk_dot::<Q, R>(p, xq, b0, n, &mut acc, &mut offs) }
    });
    for ((a, m), o) in acc.iter().zip(&offs).zip(out.iter_mut()) {
        *o = super::reduce::hsum(_mm256_add_ps(*a, *m));
    }
}

/// Add blocks `b0..b0 + n` (`n <= CHUNK`) of `R` rows to the accumulators.
///
/// # Safety
/// As for [`quant_rows_split`], with `b0 + n <= xq.blocks()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk_dot<Q: SplitFormat, const R: usize>(
    p: &[*const u8; R],
    xq: &XQuant,
    b0: usize,
    n: usize,
    acc_out: &mut [__m256; R],
    offs: &mut [__m256; R],
) {
    let mut acc = *acc_out;
    // SAFETY: per the caller.
    let ds = unsafe { chunk_factors::<Q, R>(p, xq, (b0, n), offs) };
    let (hl, start) = (xq.hl.as_ptr(), xq.neg_bias8.as_ptr());
    for k in 0..n {
        let b = b0 + k;
        // SAFETY: b < blocks: x's 64 split bytes and 8 start lanes of block b exist, and every
        // row's block b is readable per the caller.
        unsafe {
            let xh = _mm256_loadu_si256(hl.add(64 * b).cast());
            let xl = _mm256_loadu_si256(hl.add(64 * b + 32).cast());
            let s0 = match Q::BIAS {
                0 => _mm256_setzero_si256(),
                8 => _mm256_loadu_si256(start.add(8 * b).cast()),
                _ => _mm256_slli_epi32::<1>(_mm256_loadu_si256(start.add(8 * b).cast())),
            };
            for (i, (a, dsi)) in acc.iter_mut().zip(&ds).enumerate() {
                let q = Q::quants_u8(p[i].add(b * Q::BLOCK_BYTES));
                let sh = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xh);
                let sl = _mm256_dpbusd_epi32(s0, q, xl);
                let s = _mm256_add_epi32(_mm256_slli_epi32::<8>(sh), sl);
                let d = _mm256_set1_ps(*dsi.get_unchecked(k));
                *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
            }
        }
    }
    *acc_out = acc;
}
