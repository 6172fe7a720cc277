//! The ternary formats (TQ1_0, TQ2_0; layouts in `powerinfer_core::dtype`) under AVX2, a first
//! kernel: a 256-weight block is unpacked by the core's scalar decoder
//! ([`powerinfer_core::dequantize::unpack_table`]) into its int8 trits on the stack, and from
//! there it is what an IQ4_XS super-block is to the generic families: eight 32-weight
//! sub-blocks of signed int8 values, a scale each (here all the block's d), no mins. So the
//! K-quant kernels take them as a [`KFormat`] (the int16-x dot, the f32 dot, row accumulation,
//! row decoding) and the int8-x kernels as an [`Int8Format`].

use super::int8_formats::{Decoded, Int8Format, Mins};
use super::kquant::{Factors, KFormat};
use powerinfer_core::dequantize::unpack_table;
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// TQ1_0: 48 bytes of five trits, 4 bytes of four, f16 d.
pub(super) struct TQ1;
/// TQ2_0: 64 bytes of four 2-bit values, f16 d.
pub(super) struct TQ2;

/// The block of `dtype` at `p` unpacked: its eight per-32 scales and 256 int8 values.
///
/// # Safety
/// `dtype.block_bytes()` bytes readable at `p`.
#[inline]
unsafe fn unpacked(dtype: DType, p: *const u8) -> ([f32; 8], [i8; 256]) {
    // SAFETY: the block is readable per the caller.
    let b = unsafe { std::slice::from_raw_parts(p, dtype.block_bytes()) };
    let (mut d, mut q) = ([0f32; 8], [0i8; 256]);
    unpack_table(dtype, b, &mut d, &mut q);
    (d, q)
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

/// [`KFormat`] and [`Int8Format`] for a ternary format: its dtype, block bytes, and where its
/// f16 d sits.
macro_rules! impl_ternary {
    ($t:ty, $dtype:expr, $bytes:expr, $d_at:expr) => {
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
                // SAFETY: the block is readable per the caller.
                let (_, q) = unsafe { unpacked($dtype, p) };
                let mut out = [_mm256_setzero_si256(); 8];
                for (k, o) in out.iter_mut().enumerate() {
                    // SAFETY: bytes 128c + 16k .. + 16 of q, c < 2 and k < 8.
                    let v = unsafe { _mm_loadu_si128(q.as_ptr().add(128 * c + 16 * k).cast()) };
                    *o = _mm256_cvtepi8_epi16(v);
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
                // SAFETY: the block is readable per the caller.
                let (_, q) = unsafe { unpacked($dtype, p) };
                let mut v = [_mm256_setzero_si256(); 8];
                for (k, vk) in v.iter_mut().enumerate() {
                    // SAFETY: bytes 32k .. 32k + 32 of q, k < 8.
                    *vk = unsafe { _mm256_loadu_si256(q.as_ptr().add(32 * k).cast()) };
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

impl_ternary!(TQ1, DType::TQ1_0, 54, 52);
impl_ternary!(TQ2, DType::TQ2_0, 66, 64);
