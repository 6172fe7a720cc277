//! What the lattice i-quants' AVX2 kernels share (IQ3_XXS, IQ3_S: [`super::iq3`]; IQ1_S,
//! IQ1_M: [`super::iq1`]): a block is eight 32-weight sub-blocks, each decoded by its format into 32
//! signed bytes in weight order (codebook points gathered from the grid, signs applied), with
//! one f32 scale per sub-block and no mins, so to the generic families it is what a ternary or
//! IQ4_XS super-block is: a [`KFormat`] (the int16-x dot, the f32 dot, row accumulation, row
//! decoding) from [`impl_lattice!`]. Their int8-x products take the fused kernel of
//! [`super::lattice_x8`] (its [`Int8Format`] is `FUSED`), which reads each sub-block as grid
//! magnitudes and signs put on x instead of decoded bytes.

use std::arch::x86_64::*;

/// The four sign bytes `signs` (one per 8 weights) spread to 32 bytes: −1 in byte i where bit
/// i % 8 of byte i / 8 is set, else 1 (a `vpsignb` source).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sign_bytes(signs: u32) -> __m256i {
    // Byte i takes sign byte i / 8, then keeps bit i % 8: −1 where set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(signs as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let neg = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_or_si256(neg, _mm256_set1_epi8(1))
}

/// `v` with byte i negated where bit i % 8 of byte i / 8 of `signs` is set (four sign bytes, one
/// per 8 weights).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn apply_signs(v: __m256i, signs: u32) -> __m256i {
    // sign_epi8 by −1 or 1: negated or kept (no value is 0 in the IQ3 grids, nor −128).
    _mm256_sign_epi8(v, sign_bytes(signs))
}

/// Eight 4-byte codebook points of `grid` (the points' indices in the lanes of `idx`), as 32
/// bytes in lane order.
///
/// # Safety
/// Every index below the grid's length; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gather4(grid: &[[i8; 4]], idx: __m256i) -> __m256i {
    // SAFETY: per the caller, each lane's 4 bytes lie inside `grid`.
    unsafe { _mm256_i32gather_epi32::<4>(grid.as_ptr().cast(), idx) }
}

/// Four 8-byte codebook points of `grid` (indices in the lanes of `idx`), 32 bytes in order.
///
/// # Safety
/// Every index below the grid's length; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gather8(grid: &[[i8; 8]], idx: __m128i) -> __m256i {
    // SAFETY: per the caller, each lane's 8 bytes lie inside `grid`.
    unsafe { _mm256_i32gather_epi64::<8>(grid.as_ptr().cast(), idx) }
}

/// Eight per-32 scales (the core's `unpack_table` `d`) as the families' factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn per32(d: [f32; 8]) -> [__m256; 2] {
    // SAFETY: eight f32 on the stack, unaligned load.
    [unsafe { _mm256_loadu_ps(d.as_ptr()) }, _mm256_setzero_ps()]
}

/// Sixteen per-16 scales (IQ1_M's) as the families' factors: lane j of vector h is half 8h + j.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn per16(d: [f32; 16]) -> [__m256; 2] {
    // SAFETY: sixteen f32 on the stack, unaligned loads.
    unsafe {
        [
            _mm256_loadu_ps(d.as_ptr()),
            _mm256_loadu_ps(d.as_ptr().add(8)),
        ]
    }
}

/// [`KFormat`], [`Int8Format`] (fused: [`super::lattice_x8`]) and
/// [`super::lattice_x8::LatticeX8`] for a lattice format: its block bytes, whether its scales
/// are per 16 weights, its factors (a function of the block's bytes giving the scales through
/// [`per32`] or [`per16`]), its sub-block decoder (`unsafe fn(p, s) -> __m256i`), and for the
/// fused kernel its sub-block reader and scales (`LatticeX8::sub`, `LatticeX8::scales`).
macro_rules! impl_lattice {
    ($t:ty, $bytes:expr, per16 $per16:expr, $factors:path, $sub:path,
     x8 $xsub:path, $xscales:path) => {
        impl $crate::kernels::avx2::lattice_x8::LatticeX8 for $t {
            const BYTES: usize = $bytes;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn sub(p: *const u8, s: usize) -> (__m256i, __m256i) {
                // SAFETY: forwarded from the caller.
                unsafe { $xsub(p, s) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn scales(p: *const u8) -> [__m256; 2] {
                // SAFETY: forwarded from the caller.
                unsafe { $xscales(p) }
            }
        }

        impl $crate::kernels::avx2::kquant::KFormat for $t {
            const BYTES: usize = $bytes;
            const HAS_MIN: bool = false;
            const CHUNK: usize = 128;
            const PER16: bool = $per16;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8) -> $crate::kernels::avx2::kquant::Factors {
                // SAFETY: the block's bytes are readable per the caller.
                let b = unsafe { std::slice::from_raw_parts(p, $bytes) };
                $crate::kernels::avx2::kquant::Factors {
                    scale: $factors(b),
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

        impl $crate::kernels::avx2::int8_formats::Int8Format for $t {
            const CHUNK_BYTES: usize = $bytes;
            const BLOCK_BYTES: usize = 0;
            const SIGNED: bool = true;
            const BIAS: i32 = 0;
            const PER16: bool = $per16;
            const MINS: $crate::kernels::avx2::int8_formats::Mins =
                $crate::kernels::avx2::int8_formats::Mins::None;
            const BLOCKWISE: bool = false;
            const FUSED: bool = true;

            #[inline]
            unsafe fn fused<const R: usize, const T: usize, const FETCH: bool>(
                p: &[*const u8; R],
                next: &[*const u8; R],
                xs: &[&$crate::kernels::avx2::int8::X8],
                blocks: usize,
            ) -> [[f32; $crate::kernels::avx2::int8_rows::TOKENS]; R] {
                // SAFETY: forwarded from the caller (the dispatcher detected AVX2).
                unsafe {
                    $crate::kernels::avx2::lattice_x8::rows::<Self, R, T, FETCH>(
                        p, next, xs, blocks,
                    )
                }
            }

            unsafe fn block(_p: *const u8, _k: usize) -> __m256i {
                unreachable!("a lattice block decodes whole")
            }

            unsafe fn factors(_p: *const u8, _n: usize) -> (__m256, __m256) {
                unreachable!("a lattice block decodes whole")
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(
                p: *const u8,
                _n: usize,
            ) -> $crate::kernels::avx2::int8_formats::Decoded {
                let mut v = [_mm256_setzero_si256(); 8];
                for (k, vk) in v.iter_mut().enumerate() {
                    // SAFETY: the block is readable per the caller; sub-block k < 8.
                    *vk = unsafe { $sub(p, k) };
                }
                // SAFETY: the block's bytes are readable per the caller.
                let b = unsafe { std::slice::from_raw_parts(p, $bytes) };
                $crate::kernels::avx2::int8_formats::Decoded {
                    q: v,
                    scale: $factors(b),
                    min: [_mm256_setzero_ps(); 2],
                }
            }
        }
    };
}
pub(super) use impl_lattice;
