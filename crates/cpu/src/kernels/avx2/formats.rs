//! How each weight format turns into 8-lane f32 vectors under AVX2/F16C, and the one trait
//! every kernel of this ISA is written against. The float formats load eight consecutive
//! values ([`FloatFormat`]: [`F32`], [`F16`], [`Bf16`]); the quantized formats decode one
//! 32-weight block into four vectors of raw quants plus its scale `d` and per-weight offset
//! (w = d·q + offset, see [`super::quant`]). [`Format`] is a format's set of kernels (multi-row
//! dot, row accumulation, row decoding), shared by the dense products and the sparse row
//! kernels; each format's impl, and the macros that turn a runtime
//! [`powerinfer_core::DType`] into the format type, are in `super::select`.

use super::row_group::RowGroup;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// The kernels of one weight format. The `R` rows of a [`RowGroup`] are read, its `next` rows
/// fetched into the cache alongside where the kernel can.
pub(super) trait Format {
    /// out[i] = dot(row i, x) for the group's first `R` rows.
    ///
    /// # Safety
    /// `x.len()` weights readable at each of the `R` rows (a multiple of 32 for the quantized
    /// formats), `out.len() >= R`; the CPU has AVX2/FMA/F16C.
    unsafe fn dot<const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]);

    /// y += Σ a[i]·row i for the group's first `R` rows.
    ///
    /// # Safety
    /// `y.len()` weights readable at each of the `R` rows (a multiple of 32 for the quantized
    /// formats), `a.len() >= R`; the CPU has AVX2/FMA/F16C.
    unsafe fn axpy<const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]);

    /// Decode the row of `out.len()` weights at `row`.
    ///
    /// # Safety
    /// The row's `out.len()` weights readable at `row`; the CPU has AVX2/FMA/F16C.
    unsafe fn dequant(row: *const u8, out: &mut [f32]);
}

/// A format with one value per block (F32, F16, BF16).
pub(super) trait FloatFormat {
    /// Bytes per value.
    const BYTES: usize;

    /// The eight values at `p` as f32.
    ///
    /// # Safety
    /// `p..p + 8·BYTES` must be readable (any alignment); the CPU must have AVX2, FMA and F16C.
    unsafe fn load8(p: *const u8) -> __m256;

    /// The one value at `p`, for row tails.
    ///
    /// # Safety
    /// `BYTES` bytes readable at `p` (any alignment).
    unsafe fn load1(p: *const u8) -> f32;
}

/// Little-endian f32.
pub(super) struct F32;
/// IEEE half precision.
pub(super) struct F16;
/// bfloat16: the top 16 bits of an f32.
pub(super) struct Bf16;

impl FloatFormat for F32 {
    const BYTES: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 32 readable bytes; loadu takes any alignment.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }

    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 4 readable bytes per the caller.
        f32::from_le_bytes(unsafe { (p as *const [u8; 4]).read_unaligned() })
    }
}

impl FloatFormat for F16 {
    const BYTES: usize = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes; loadu takes any alignment.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
    }

    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the caller.
        f16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
    }
}

impl FloatFormat for Bf16 {
    const BYTES: usize = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes; loadu takes any alignment.
        let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    }

    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the caller.
        bf16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
    }
}
