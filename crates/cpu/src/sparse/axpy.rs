//! Row accumulation y += Σ a_i · row_i over a few scattered rows, routed to the SIMD level's
//! kernel; the portable path decodes a chunk of each row into a stack buffer and adds it in f32.

use crate::simd::Level;
use powerinfer_core::DType;

/// Rows accumulated together by one kernel call (y is read and written once per group).
#[cfg(target_arch = "x86_64")]
pub(super) const GROUP: usize = super::avx2_rows::GROUP;
/// Rows accumulated together by one kernel call (y is read and written once per group).
#[cfg(not(target_arch = "x86_64"))]
pub(super) const GROUP: usize = 8;

/// y += Σ_i a[i] · rows[i], each row holding `y.len()` weights of `dtype` (sizes checked by the
/// caller); `rows.len() <= GROUP`. `next` (at most GROUP rows, read next by the caller) is
/// fetched into the cache alongside, where the level can.
pub(super) fn axpy_group(
    level: Level,
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    a: &[f32],
    y: &mut [f32],
) {
    debug_assert!(rows.len() == a.len() && rows.len() <= GROUP && next.len() <= GROUP);
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => super::avx2_rows::axpy_group(dtype, rows, next, a, y),
        Level::Scalar => {
            for (row, &ai) in rows.iter().zip(a) {
                axpy_row_scalar(dtype, row, ai, y);
            }
        }
    }
}

/// out[i] = dot(rows[i], x) for a group of float-format rows on AVX2, fetching the `next` rows
/// into the cache alongside; `false` (nothing done) where the level or format has no group
/// kernel.
#[inline]
pub(super) fn dot_group(
    level: Level,
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    x: &[f32],
    out: &mut [f32],
) -> bool {
    match level {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 if !dtype.is_quantized() => {
            super::avx2_rows::dot_group(dtype, rows, next, x, out);
            true
        }
        _ => false,
    }
}

/// Weights decoded per step of the portable path (a multiple of the 32-weight block).
const CHUNK: usize = 256;

/// y += a · row on the portable path, in f32.
fn axpy_row_scalar(dtype: DType, row: &[u8], a: f32, y: &mut [f32]) {
    let mut buf = [0f32; CHUNK];
    let bytes_per_chunk = CHUNK / dtype.block_size() * dtype.block_bytes();
    for (yc, rc) in y.chunks_mut(CHUNK).zip(row.chunks(bytes_per_chunk)) {
        let w = &mut buf[..yc.len()];
        crate::scalar::dequantize_row(dtype, rc, w);
        for (yk, &wk) in yc.iter_mut().zip(w.iter()) {
            *yk += a * wk;
        }
    }
}
