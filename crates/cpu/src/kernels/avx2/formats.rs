//! How each weight format turns into 8-lane f32 vectors under AVX2/F16C, and the one trait
//! family every kernel of this ISA is written against. The float formats load eight consecutive
//! values ([`FloatFormat`]); the quantized formats decode one 32-weight block into four vectors
//! of raw quants plus its scale `d` and per-weight offset (w = d·q + offset, see
//! [`super::quant`]). [`Format`] is a format's set of kernels (multi-row dot, row accumulation,
//! row decoding), shared by the dense products and the sparse row kernels; [`with_format!`]
//! turns a runtime [`powerinfer_core::DType`] into the format type.

use super::rows::RowGroup;
use super::{dequant, dot, kquant, q4_axpy, quant, rows};
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

/// `$body` with the type `$F` standing for the [`Format`] of the runtime dtype `$dtype`.
macro_rules! with_format {
    ($dtype:expr, $F:ident => $body:expr) => {
        with_format!(@ $dtype, $F => $body;
            F32 = f::F32, F16 = f::F16, BF16 = f::Bf16, Q8_0 = q::Q8_0, Q4_0 = q::Q4_0, Q4_1 = q::Q4_1,
            Q5_0 = q::Q5_0, Q5_1 = q::Q5_1, Q2_K = k::Q2K, Q3_K = k::Q3K, Q4_K = k::Q4K,
            Q5_K = k::Q5K, Q6_K = k::Q6K)
    };
    (@ $dtype:expr, $F:ident => $body:expr; $($d:ident = $t:ty),*) => {{
        use $crate::kernels::avx2::{formats as f, kquant as k, quant as q};
        match $dtype {
            $(powerinfer_core::DType::$d => {
                type $F = $t;
                $body
            })*
        }
    }};
}
pub(super) use with_format;

/// `$body` with the type `$F` standing for the [`super::wide_float::WideFloat`] format of the
/// runtime dtype `$dtype` when `$wide` is set and `$dtype` is a float format; `$other` otherwise
/// (the AVX2 kernels).
macro_rules! with_wide_float {
    ($wide:expr, $dtype:expr, $F:ident => $body:expr, else => $other:expr) => {
        with_wide_float!(@ $wide, $dtype, $F => $body, $other; F32 = F32, F16 = F16, BF16 = Bf16)
    };
    (@ $wide:expr, $dtype:expr, $F:ident => $body:expr, $other:expr; $($d:ident = $t:ident),*) => {
        match ($wide, $dtype) {
            $((true, powerinfer_core::DType::$d) => {
                type $F = $crate::kernels::avx2::formats::$t;
                $body
            })*
            _ => $other,
        }
    };
}
pub(super) use with_wide_float;

/// `$body` with the constant `$R` set to the row count `$n`, for `$n` in 1..=8 (nothing for
/// other counts).
macro_rules! with_rows {
    ($n:expr, $R:ident => $body:expr) => {
        with_rows!(@ $n, $R => $body; 1 2 3 4 5 6 7 8)
    };
    (@ $n:expr, $R:ident => $body:expr; $($r:literal)*) => {
        match $n {
            $($r => {
                const $R: usize = $r;
                $body
            })*
            _ => {}
        }
    };
}
pub(super) use with_rows;

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

/// [`Format`] for formats of the given kinds, from the kind's generic kernels:
/// `float` formats, `quant` formats with their accumulation kernel, or `k`-quants.
macro_rules! impl_format {
    (float: $($t:ty),*) => {$(
        impl Format for $t {
            unsafe fn dot<const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { rows::float_dot::<Self, R>(g, x, out) }
            }
            unsafe fn axpy<const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { rows::float_axpy::<Self, R>(g, a, y) }
            }
            unsafe fn dequant(row: *const u8, out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { dequant::float_row::<Self>(row, out) }
            }
        }
    )*};
    (k: $($t:ty),*) => {$(
        impl Format for $t {
            unsafe fn dot<const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { kquant::dot::<Self, R>(g, x, out) }
            }
            unsafe fn axpy<const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { kquant::axpy::<Self, R>(g, a, y) }
            }
            unsafe fn dequant(row: *const u8, out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { kquant::dequant::<Self>(row, out) }
            }
        }
    )*};
    (quant: $($t:ty => $axpy:path),*) => {$(
        impl Format for $t {
            unsafe fn dot<const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { dot::quant_rows::<Self, R>(g, x, out) }
            }
            unsafe fn axpy<const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { $axpy(g, a, y) }
            }
            unsafe fn dequant(row: *const u8, out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { dequant::quant_row::<Self>(row, out) }
            }
        }
    )*};
}

impl_format!(float: F32, F16, Bf16);
impl_format!(quant:
    quant::Q8_0 => rows::quant_axpy::<Self, R>,
    quant::Q4_0 => q4_axpy::q4_axpy::<Self, R>,
    quant::Q4_1 => q4_axpy::q4_axpy::<Self, R>,
    quant::Q5_0 => rows::quant_axpy::<Self, R>,
    quant::Q5_1 => rows::quant_axpy::<Self, R>
);
impl_format!(k: kquant::Q2K, kquant::Q3K, kquant::Q4K, kquant::Q5K, kquant::Q6K);
