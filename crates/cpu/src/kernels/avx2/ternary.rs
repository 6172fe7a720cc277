//! The ternary formats (TQ1_0, TQ2_0; layouts in `powerinfer_core::dtype`) under AVX2: each
//! format says how one 32-weight sub-block of its 256-weight block decodes into 32 signed bytes
//! (−1, 0, 1, and TQ2_0's 2) in weight order, and from there a block is what an IQ4_XS
//! super-block is to the generic families: eight 32-weight sub-blocks of signed int8 values, a
//! scale each (here all the block's d), no mins. So the K-quant kernels take them as a
//! [`KFormat`] (the int16-x dot, the f32 dot, row accumulation, row decoding) and the int8-x
//! kernels as an [`Int8Format`].
//!
//! TQ2_0's sub-block s is the 2-bit field s % 4 of the 32 bytes at 32·(s / 4), less 1. TQ1_0's
//! bytes hold five trits as a base-3 fraction of 256: trit n of byte b is the top base-3 digit
//! of b·3^n mod 256 (ggml's `(v·3) >> 8`), i.e. 0, 1 or 2 as that lies below 86, below 171, or
//! above; the products are byte adds (×3 = b + b + b, wrapping), the thresholds unsigned
//! compares.

use super::int8_formats::{Decoded, Int8Format, Mins};
use super::kquant::{Factors, KFormat};
use std::arch::x86_64::*;

/// TQ1_0: 48 bytes of five trits, 4 bytes of four, f16 d.
pub(super) struct TQ1;
/// TQ2_0: 64 bytes of four 2-bit values, f16 d.
pub(super) struct TQ2;

/// TQ2_0's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: bytes 32·(s / 4) .. + 32 lie in the 64 bytes of qs (s < 8).
    let v = unsafe { _mm256_loadu_si256(p.add(32 * (s / 4)).cast()) };
    // Shifting 16-bit lanes moves the upper byte's bits into the top of the lower one only;
    // the mask keeps each byte's own two bits.
    let field = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (s % 4) as i32));
    let q = _mm256_and_si256(field, _mm256_set1_epi8(3));
    _mm256_sub_epi8(q, _mm256_set1_epi8(1))
}

/// Each byte times 3, mod 256.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn times3(v: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_add_epi8(v, v), v)
}

/// Each byte times 3^n, mod 256.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn times_pow3(mut v: __m256i, n: usize) -> __m256i {
    for _ in 0..n {
        v = times3(v);
    }
    v
}

/// The top trit of each byte (already multiplied by its 3^n), less 1: −1, 0 or 1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn top_trit(v: __m256i) -> __m256i {
    // −1 − (−1 if v >= 86) − (−1 if v >= 171).
    let t = _mm256_sub_epi8(_mm256_set1_epi8(-1), at_least(v, 86));
    _mm256_sub_epi8(t, at_least(v, 171))
}

/// −1 in each byte of `v` at least `k` (unsigned: where max(v, k) == v), else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn at_least(v: __m256i, k: u8) -> __m256i {
    _mm256_cmpeq_epi8(_mm256_max_epu8(v, _mm256_set1_epi8(k as i8)), v)
}

/// TQ1_0's sub-block `s` (0..8) of the block at `p` (weight order in `powerinfer_core::dtype`).
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq1_sub(p: *const u8, s: usize) -> __m256i {
    if s < 5 {
        // SAFETY: qs[0..32] of the readable block.
        let v = unsafe { _mm256_loadu_si256(p.cast()) };
        return top_trit(times_pow3(v, s));
    }
    // Weights 160..240: trit n of qs[32..48], 16 weights per n; s = 5, 6 take n = 2(s − 5) and
    // the next, s = 7 takes n = 4 and then the 16 weights of qh.
    // SAFETY: qs[32..48] of the readable block.
    let x = unsafe { _mm_loadu_si128(p.add(32).cast()) };
    let both = _mm256_set_m128i(_mm_setzero_si128(), x);
    let n = 2 * (s - 5);
    let lo = _mm256_castsi256_si128(times_pow3(both, n));
    let hi = match s {
        // SAFETY: qh, bytes 48..52 of the readable block.
        7 => unsafe { qh_bytes(p.add(48)) },
        _ => _mm256_castsi256_si128(times_pow3(both, n + 1)),
    };
    top_trit(_mm256_set_m128i(hi, lo))
}

/// TQ1_0's last 16 weights' bytes: weight 240 + 4n + j is trit n of qh[j] (n < 4), so byte
/// 4n + j is qh[j]·3^n (mod 256).
///
/// # Safety
/// 4 bytes readable at `qh`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn qh_bytes(qh: *const u8) -> __m128i {
    // SAFETY: per the caller.
    let q = unsafe { (qh as *const [u8; 4]).read_unaligned() };
    let mut b = [0u8; 16];
    for (i, o) in b.iter_mut().enumerate() {
        *o = q[i % 4].wrapping_mul([1, 3, 9, 27][i / 4]);
    }
    // SAFETY: 16 bytes on the stack.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// The f16 at byte `at` of the block at `p`, in all eight lanes.
///
/// # Safety
/// Two bytes readable at `p + at`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn d8(p: *const u8, at: usize) -> __m256 {
    // SAFETY: per the caller.
    let bits = unsafe { (p.add(at) as *const [u8; 2]).read_unaligned() };
    _mm256_set1_ps(half::f16::from_le_bytes(bits).to_f32())
}

/// [`KFormat`] and [`Int8Format`] for a ternary format: its block bytes, where its f16 d sits,
/// and its sub-block decoder.
macro_rules! impl_ternary {
    ($t:ty, $bytes:expr, $d_at:expr, $sub:expr) => {
        impl KFormat for $t {
            const BYTES: usize = $bytes;
            const HAS_MIN: bool = false;
            const CHUNK: usize = 128;
            const PER16: bool = false;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8) -> Factors {
                Factors {
                    // SAFETY: the block is readable per the caller.
                    scale: [unsafe { d8(p, $d_at) }, _mm256_setzero_ps()],
                    min: [_mm256_setzero_ps(); 2],
                }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 8] {
                let mut out = [_mm256_setzero_si256(); 8];
                for k in 0..4 {
                    // SAFETY: the block is readable per the caller; sub-block 4c + k < 8.
                    let v = unsafe { $sub(p, 4 * c + k) };
                    out[2 * k] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
                    out[2 * k + 1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v));
                }
                out
            }
        }

        impl Int8Format for $t {
            const CHUNK_BYTES: usize = $bytes;
            const BLOCK_BYTES: usize = 0;
            const SIGNED: bool = true;
            const BIAS: i32 = 0;
            const PER16: bool = false;
            const MINS: Mins = Mins::None;
            const BLOCKWISE: bool = false;

            unsafe fn block(_p: *const u8, _k: usize) -> __m256i {
                unreachable!("a ternary block decodes whole")
            }

            unsafe fn factors(_p: *const u8, _n: usize) -> (__m256, __m256) {
                unreachable!("a ternary block decodes whole")
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, _n: usize) -> Decoded {
                let mut v = [_mm256_setzero_si256(); 8];
                for (k, vk) in v.iter_mut().enumerate() {
                    // SAFETY: the block is readable per the caller; sub-block k < 8.
                    *vk = unsafe { $sub(p, k) };
                }
                Decoded {
                    q: v,
                    // SAFETY: the block is readable per the caller.
                    scale: [unsafe { d8(p, $d_at) }, _mm256_setzero_ps()],
                    min: [_mm256_setzero_ps(); 2],
                }
            }
        }
    };
}

impl_ternary!(TQ1, 54, 52, tq1_sub);
impl_ternary!(TQ2, 66, 64, tq2_sub);
