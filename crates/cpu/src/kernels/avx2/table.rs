//! The table formats (IQ4_NL, MXFP4, IQ4_XS; layouts in `powerinfer_core::dtype`) under AVX2:
//! each 4-bit index is looked up in the format's 16 int8 values with one byte shuffle
//! (`vpshufb`, the table in every 128-bit lane), and from there a block is what Q8_0's is: 32
//! signed int8 quants and a scale. So every kernel family takes them through its existing
//! generic form: as 32-block [`QuantFormat`]s (IQ4_NL, MXFP4: the f32-x dot, row accumulation,
//! row decoding and the int16-x dot), as a [`KFormat`] (IQ4_XS: a super-block of eight
//! 32-weight sub-blocks, a scale each, no mins), and as [`Int8Format`]s (the int8-x dot, signed
//! quants as Q8_0's).

use super::int8_formats::{impl_blocks, Decoded, Int8Format, Mins};
use super::kquant::{Factors, KFormat};
use super::quant::{Offset, QuantFormat};
use powerinfer_core::dequantize::{e8m0_half, iq4xs_scale, IQ4NL_VALUES, MXFP4_VALUES};
use std::arch::x86_64::*;

/// IQ4_NL: f16 d, 16 bytes of indices into [`IQ4NL_VALUES`].
pub(super) struct IQ4NL;
/// MXFP4: an E8M0 exponent, 16 bytes of indices into [`MXFP4_VALUES`].
pub(super) struct MXFP4;
/// IQ4_XS: f16 d, 6-bit sub-block scales, 128 bytes of indices into [`IQ4NL_VALUES`].
pub(super) struct IQ4XS;

/// A format's 16 values in both 128-bit lanes, for `vpshufb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table256(values: &[i8; 16]) -> __m256i {
    // SAFETY: the table is 16 readable bytes; unaligned load.
    let t = unsafe { _mm_loadu_si128(values.as_ptr().cast()) };
    _mm256_set_m128i(t, t)
}

/// The 32 values of the 16 index bytes at `q` (Q4_0's nibble order), as signed bytes in weight
/// order: weights 0..16 (low nibbles) in the low lane, 16..32 in the high lane.
///
/// # Safety
/// 16 bytes readable at `q`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lookup32(q: *const u8, values: &[i8; 16]) -> __m256i {
    // SAFETY: 16 readable bytes per the caller, unaligned.
    let v = unsafe { _mm_loadu_si128(q.cast()) };
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    let idx = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
    _mm256_shuffle_epi8(table256(values), idx)
}

/// Sixteen signed bytes as two 8-lane f32 vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8x16_to_f32(v: __m128i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))),
    ]
}

/// The 32 looked-up values of a block's indices at `q` as four f32 vectors in weight order.
///
/// # Safety
/// As for [`lookup32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_f32(q: *const u8, values: &[i8; 16]) -> [__m256; 4] {
    // SAFETY: forwarded from the caller.
    let v = unsafe { lookup32(q, values) };
    let lo = i8x16_to_f32(_mm256_castsi256_si128(v));
    let hi = i8x16_to_f32(_mm256_extracti128_si256::<1>(v));
    [lo[0], lo[1], hi[0], hi[1]]
}

/// The 32 looked-up values as i16: weights 0..16, then 16..32.
///
/// # Safety
/// As for [`lookup32`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_i16(q: *const u8, values: &[i8; 16]) -> [__m256i; 2] {
    // SAFETY: forwarded from the caller.
    let v = unsafe { lookup32(q, values) };
    [
        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
        _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v)),
    ]
}

/// [`QuantFormat`] for a 32-block table format: its block bytes, where its indices start, its
/// table, and how its scale reads (`$scale`: a function of the block's address giving f32).
macro_rules! impl_table_quant {
    ($t:ty, $bytes:expr, $qs:expr, $values:expr, $scale:expr) => {
        impl QuantFormat for $t {
            const BLOCK_BYTES: usize = $bytes;
            const OFFSET: Offset = Offset::None;
            const QS: usize = $qs;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn quants(p: *const u8) -> [__m256; 4] {
                // SAFETY: the indices are bytes QS..QS + 16 of the readable block.
                unsafe { values_f32(p.add($qs), $values) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn quants16(p: *const u8) -> [__m256i; 2] {
                // SAFETY: as above.
                unsafe { values_i16(p.add($qs), $values) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
                // SAFETY: the block is readable per the caller.
                unsafe { ($scale(p), 0.0, Self::quants(p)) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn scale(p: *const u8) -> __m256 {
                // SAFETY: the block is readable per the caller.
                _mm256_set1_ps(unsafe { $scale(p) })
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn scales8(p: *const u8, n: usize) -> __m256 {
                // SAFETY: the n blocks at p are readable per the caller.
                unsafe { scales8_of(p, $bytes, n, $scale) }
            }
        }
    };
}

/// The scales of `n <= 8` blocks `stride` bytes apart at `p`, one per lane (zeros above `n`).
///
/// # Safety
/// The `n` blocks readable at `p`; `scale` reads only its block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales8_of(
    p: *const u8,
    stride: usize,
    n: usize,
    scale: unsafe fn(*const u8) -> f32,
) -> __m256 {
    let mut s = [0f32; 8];
    for (k, sk) in s.iter_mut().enumerate().take(n) {
        // SAFETY: block k < n is readable per the caller.
        *sk = unsafe { scale(p.add(k * stride)) };
    }
    // SAFETY: eight f32 on the stack.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// The f16 at a block's start, as f32.
///
/// # Safety
/// 2 bytes readable at `p`.
#[inline]
unsafe fn f16_scale(p: *const u8) -> f32 {
    // SAFETY: per the caller.
    half::f16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
}

/// The E8M0 byte at a block's start as MXFP4's halved scale.
///
/// # Safety
/// 1 byte readable at `p`.
#[inline]
unsafe fn e8m0_scale(p: *const u8) -> f32 {
    // SAFETY: per the caller.
    e8m0_half(unsafe { p.read() })
}

impl_table_quant!(IQ4NL, 18, 2, &IQ4NL_VALUES, f16_scale);
impl_table_quant!(MXFP4, 17, 1, &MXFP4_VALUES, e8m0_scale);

/// IQ4_XS's eight sub-block scales d·(scale − 32), one per lane.
///
/// # Safety
/// The block's first 8 bytes readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_scales(p: *const u8) -> __m256 {
    // SAFETY: d, scales_h and scales_l are the block's first 8 bytes.
    let (d, head) = unsafe { (f16_scale(p), (p as *const [u8; 8]).read_unaligned()) };
    let mut s = [0f32; 8];
    for (k, sk) in s.iter_mut().enumerate() {
        *sk = d * (iq4xs_scale(&head, k) as i32 - 32) as f32;
    }
    // SAFETY: eight f32 on the stack.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

impl KFormat for IQ4XS {
    const BYTES: usize = 136;
    const HAS_MIN: bool = false;
    const CHUNK: usize = 64;
    const PER16: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(p: *const u8) -> Factors {
        Factors {
            // SAFETY: the block is readable per the caller.
            scale: [unsafe { iq4xs_scales(p) }, _mm256_setzero_ps()],
            min: [_mm256_setzero_ps(); 2],
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 8] {
        let mut out = [_mm256_setzero_si256(); 8];
        // SAFETY: sub-blocks 2c and 2c + 1 have their indices at 8 + 16·(2c + k), inside the
        // readable block (c < 4).
        unsafe {
            let [a, b] = values_i16(p.add(8 + 32 * c), &IQ4NL_VALUES);
            let [e, f] = values_i16(p.add(8 + 32 * c + 16), &IQ4NL_VALUES);
            out[..4].copy_from_slice(&[a, b, e, f]);
        }
        out
    }
}

// The 32-block table formats: signed quants as Q8_0's (no bias, no mins), read by lookup
// through the format's values; their scales as the format stores them (f16 d, E8M0 e).
impl_blocks!(IQ4NL, signed true, bias 0, mins Mins::None,
    factors |p: *const u8, n: usize| {
        (<IQ4NL as QuantFormat>::scales8(p, n), _mm256_setzero_ps())
    },
    |b: *const u8| { lookup32(b.add(<IQ4NL as QuantFormat>::QS), &IQ4NL_VALUES) });
impl_blocks!(MXFP4, signed true, bias 0, mins Mins::None,
    factors |p: *const u8, n: usize| {
        (<MXFP4 as QuantFormat>::scales8(p, n), _mm256_setzero_ps())
    },
    |b: *const u8| { lookup32(b.add(<MXFP4 as QuantFormat>::QS), &MXFP4_VALUES) });

impl Int8Format for IQ4XS {
    const CHUNK_BYTES: usize = 136;
    const BLOCK_BYTES: usize = 0;
    const SIGNED: bool = true;
    const BIAS: i32 = 0;
    const PER16: bool = false;
    const MINS: Mins = Mins::None;
    const BLOCKWISE: bool = false;

    unsafe fn block(_p: *const u8, _k: usize) -> __m256i {
        unreachable!("an IQ4_XS super-block decodes whole")
    }

    unsafe fn factors(_p: *const u8, _n: usize) -> (__m256, __m256) {
        unreachable!("an IQ4_XS super-block decodes whole")
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(p: *const u8, _n: usize) -> Decoded {
        let mut q = [_mm256_setzero_si256(); 8];
        // SAFETY: the super-block at p is readable per the caller: sub-block k's indices are
        // the 16 bytes at 8 + 16k.
        unsafe {
            for (k, qk) in q.iter_mut().enumerate() {
                *qk = lookup32(p.add(8 + 16 * k), &IQ4NL_VALUES);
            }
            Decoded {
                q,
                scale: [iq4xs_scales(p), _mm256_setzero_ps()],
                min: [_mm256_setzero_ps(); 2],
            }
        }
    }
}
