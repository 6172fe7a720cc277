//! Routes each kernel to the implementation of a SIMD [`Level`]; the public API passes the level
//! chosen once by [`crate::simd::level`], tests pass every level the CPU has.

use crate::scalar;
use crate::simd::Level;
use powerinfer_core::DType;

/// out[i] = dot(row i, x) over consecutive rows of `row_bytes` bytes.
pub(crate) fn rows_dot(
    level: Level,
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    debug_assert_eq!(rows.len(), out.len() * row_bytes);
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::avx2::rows_dot(dtype, rows, row_bytes, x, out),
        Level::Scalar => scalar::rows_dot(dtype, rows, row_bytes, x, out),
    }
}

/// Dequantise one row (sizes already checked).
pub(crate) fn dequantize_row(level: Level, dtype: DType, row: &[u8], out: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::avx2::dequantize_row(dtype, row, out),
        Level::Scalar => scalar::dequantize_row(dtype, row, out),
    }
}

/// Matmul tile: out[t·r + i] = dot(w row i, x token t) for the `r` f32 rows in `w`.
pub(crate) fn tile_dot(level: Level, w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => crate::avx2::tile_dot(w, cols, x, out),
        Level::Scalar => scalar::tile_dot(w, cols, x, out),
    }
}
