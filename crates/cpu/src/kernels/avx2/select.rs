//! Each weight format's kernels ([`Format`] for every [`powerinfer_core::DType`], from the
//! generic kernels of its kind), and the macros that pick them at run time: [`with_format!`]
//! turns a runtime dtype into its format type, [`with_wide_float!`] into a 512-bit float format
//! where asked, [`with_rows!`] a row count into a constant. Used by the entry points of the
//! avx2 module.

use super::formats::{Bf16, Format, F16, F32};
use super::row_group::RowGroup;
use super::{dequant, dot, iq1, iq2, iq3, kquant, lowbit, q4_axpy, quant, rows, table, ternary};

/// `$body` with the type `$F` standing for the [`Format`] of the runtime dtype `$dtype`.
macro_rules! with_format {
    ($dtype:expr, $F:ident => $body:expr) => {
        with_format!(@ $dtype, $F => $body;
            F32 = f::F32, F16 = f::F16, BF16 = f::Bf16, Q8_0 = q::Q8_0, Q4_0 = q::Q4_0, Q4_1 = q::Q4_1,
            Q5_0 = q::Q5_0, Q5_1 = q::Q5_1, Q2_K = k::Q2K, Q3_K = k::Q3K, Q4_K = k::Q4K,
            Q5_K = k::Q5K, Q6_K = k::Q6K, IQ4_NL = t::IQ4NL, IQ4_XS = t::IQ4XS, MXFP4 = t::MXFP4,
            TQ1_0 = tq::TQ1, TQ2_0 = tq::TQ2, NVFP4 = lb::NVFP4, Q1_0 = lb::Q1, Q2_0 = lb::Q2,
            IQ2_XXS = l2::IQ2XXS, IQ2_XS = l2::IQ2XS, IQ2_S = l2::IQ2S, IQ3_XXS = i3::IQ3XXS,
            IQ3_S = i3::IQ3S, IQ1_S = i1::IQ1S, IQ1_M = i1::IQ1M)
    };
    (@ $dtype:expr, $F:ident => $body:expr; $($d:ident = $t:ty),*) => {{
        use $crate::kernels::avx2::{
            formats as f, iq1 as i1, iq2 as l2, iq3 as i3, kquant as k, lowbit as lb, quant as q,
            table as t,
            ternary as tq,
        };
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

/// [`Format`] for formats of the given kinds, from the kind's generic kernels:
/// `float` formats, `quant` formats with their accumulation kernel, `k`-quants, or `lowbit`
/// formats.
macro_rules! impl_format {
    (@impl $t:ty, $dot:path, $axpy:path, $dequant:path) => {
        impl Format for $t {
            unsafe fn dot<const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { $dot(g, x, out) }
            }
            unsafe fn axpy<const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { $axpy(g, a, y) }
            }
            unsafe fn dequant(row: *const u8, out: &mut [f32]) {
                // SAFETY: forwarded from the caller.
                unsafe { $dequant(row, out) }
            }
        }
    };
    (float: $($t:ty),*) => {$(
        impl_format!(@impl $t, rows::float_dot::<Self, R>, rows::float_axpy::<Self, R>,
            dequant::float_row::<Self>);
    )*};
    (k: $($t:ty),*) => {$(
        impl_format!(@impl $t, kquant::dot::<Self, R>, kquant::axpy::<Self, R>,
            kquant::dequant::<Self>);
    )*};
    (lowbit: $($t:ty),*) => {$(
        impl_format!(@impl $t, lowbit::dot::<Self, R>, lowbit::axpy::<Self, R>,
            lowbit::dequant::<Self>);
    )*};
    (quant: $($t:ty => $axpy:path),*) => {$(
        impl_format!(@impl $t, dot::quant_rows::<Self, R>, $axpy, dequant::quant_row::<Self>);
    )*};
}

impl_format!(float: F32, F16, Bf16);
impl_format!(quant:
    quant::Q8_0 => rows::quant_axpy::<Self, R>,
    quant::Q4_0 => q4_axpy::q4_axpy::<Self, R>,
    quant::Q4_1 => q4_axpy::q4_axpy::<Self, R>,
    quant::Q5_0 => rows::quant_axpy::<Self, R>,
    quant::Q5_1 => rows::quant_axpy::<Self, R>,
    table::IQ4NL => rows::quant_axpy::<Self, R>,
    table::MXFP4 => rows::quant_axpy::<Self, R>
);
impl_format!(k: kquant::Q2K, kquant::Q3K, kquant::Q4K, kquant::Q5K, kquant::Q6K, table::IQ4XS,
    ternary::TQ1, ternary::TQ2, iq2::IQ2XXS, iq2::IQ2XS, iq2::IQ2S, iq3::IQ3XXS, iq3::IQ3S,
    iq1::IQ1S, iq1::IQ1M);
impl_format!(lowbit: lowbit::NVFP4, lowbit::Q1, lowbit::Q2);
