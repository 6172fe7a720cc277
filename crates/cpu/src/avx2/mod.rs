//! AVX2 + FMA + F16C kernels. The safe entry points here are only reached through
//! [`crate::dispatch`] once [`crate::simd::level`] has detected those features.

pub(crate) mod attend;
mod dequant;
mod dot;
mod formats;
mod int16;
mod read;
mod tile;

use formats::{Bf16, F16, F32, Q4_0, Q4_1, Q8_0};
pub(crate) use int16::XQuant;
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Rows computed together by the float-format matvec kernels.
const ROWS: usize = 4;
/// Rows computed together by the quantized matvec kernels.
const QROWS: usize = 4;

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Panic unless this CPU really has the features (a debug-build guard).
fn debug_check_level() {
    debug_assert_eq!(crate::simd::detect(), crate::simd::Level::Avx2);
}

/// out[i] = dot(row i, x) over consecutive rows of `row_bytes` bytes (sizes checked by callers).
pub(crate) fn rows_dot(dtype: DType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    debug_check_level();
    assert!(
        rows.len() >= out.len() * row_bytes
            && row_bytes >= dtype.row_bytes(x.len()).unwrap_or(usize::MAX)
    );
    // SAFETY: the dispatcher only calls this after detecting AVX2/FMA/F16C, and the assert
    // above keeps every row of x.len() weights inside `rows`.
    unsafe {
        match dtype {
            DType::F32 => rows_with::<ROWS>(
                dot::float_rows::<F32, ROWS>,
                dot::float_rows::<F32, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
            DType::F16 => rows_with::<ROWS>(
                dot::float_rows::<F16, ROWS>,
                dot::float_rows::<F16, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
            DType::BF16 => rows_with::<ROWS>(
                dot::float_rows::<Bf16, ROWS>,
                dot::float_rows::<Bf16, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
            DType::Q8_0 => rows_with::<QROWS>(
                dot::quant_rows::<Q8_0, QROWS>,
                dot::quant_rows::<Q8_0, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
            DType::Q4_0 => rows_with::<QROWS>(
                dot::quant_rows::<Q4_0, QROWS>,
                dot::quant_rows::<Q4_0, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
            DType::Q4_1 => rows_with::<QROWS>(
                dot::quant_rows::<Q4_1, QROWS>,
                dot::quant_rows::<Q4_1, 1>,
                rows,
                row_bytes,
                x,
                out,
            ),
        }
    }
}

/// A multi-row kernel: (first row, row stride in bytes, x, out).
type RowsKernel = unsafe fn(*const u8, usize, &[f32], &mut [f32]);

/// Run `group` over whole groups of `G` rows and `single` over the rest.
///
/// # Safety
/// As for the kernels: every row readable, features present.
#[inline]
unsafe fn rows_with<const G: usize>(
    group: RowsKernel,
    single: RowsKernel,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let base = rows.as_ptr();
    let full = out.len() / G * G;
    for (g, o) in out[..full].chunks_exact_mut(G).enumerate() {
        // SAFETY: rows g·G.. are within `rows` per the caller.
        unsafe { group(base.add(g * G * row_bytes), row_bytes, x, o) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        // SAFETY: row i is within `rows` per the caller.
        unsafe {
            single(
                base.add(i * row_bytes),
                row_bytes,
                x,
                std::slice::from_mut(o),
            )
        };
    }
}

/// out[i] = dot(row i, x) for consecutive quantized rows, on the int16-quantized x
/// (see [`int16`]); `dtype` must be quantized.
pub(crate) fn rows_dot_i16(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    xq: &XQuant,
    out: &mut [f32],
) {
    debug_check_level();
    assert!(rows.len() >= out.len() * row_bytes && row_bytes >= xq.blocks() * dtype.block_bytes());
    let base = rows.as_ptr();
    let full = out.len() / QROWS * QROWS;
    for (g, o) in out[..full].chunks_exact_mut(QROWS).enumerate() {
        let p: [*const u8; QROWS] =
            std::array::from_fn(|i| base.wrapping_add((g * QROWS + i) * row_bytes));
        // The next tile's rows, fetched chunk by chunk in step: the int16 kernel is slow enough
        // per byte that the hardware prefetchers alone leave DRAM idle between tiles (dense
        // Q4_0 decode of the synthetic dim-2048 model: 39 -> 57 tok/s on 2 threads). The last
        // tile re-touches its own rows.
        let next = match (g + 1) * QROWS < full {
            true => (g + 1) * QROWS,
            false => g * QROWS,
        };
        let q: [*const u8; QROWS] =
            std::array::from_fn(|i| base.wrapping_add((next + i) * row_bytes));
        // SAFETY: features detected by the dispatcher; the assert keeps rows g·QROWS.. inside
        // `rows`, each with xq.blocks() blocks; `q` is only prefetched.
        unsafe { int16_rows::<QROWS, true>(dtype, &p, &q, xq, o) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        let p = [base.wrapping_add(i * row_bytes)];
        // SAFETY: as above, for the single row i.
        unsafe { int16_rows::<1, false>(dtype, &p, &p, xq, std::slice::from_mut(o)) };
    }
}

/// out[i] = dot(rows[i], x) for up to 8 scattered quantized rows (each at least `xq.blocks()`
/// blocks of `dtype`) on the int16-quantized x, fetching the `next` rows (up to as many, read
/// next by the caller) into the cache in step.
pub(crate) fn scattered_dot_i16(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    xq: &XQuant,
    out: &mut [f32],
) {
    debug_check_level();
    let want = xq.blocks() * dtype.block_bytes();
    assert!(
        dtype.is_quantized()
            && rows.len() == out.len()
            && rows.len() <= 8
            && next.len() <= 8
            && rows.iter().all(|r| r.len() >= want)
    );
    macro_rules! run {
        ($($r:literal)*) => {
            match rows.len() {
                $($r => {
                    let p: [*const u8; $r] = std::array::from_fn(|i| rows[i].as_ptr());
                    let q: [*const u8; $r] =
                        std::array::from_fn(|i| next.get(i).map_or(p[i], |r| r.as_ptr()));
                    // SAFETY: features detected by the dispatcher; the assert keeps every row's
                    // blocks readable; `q` is only prefetched.
                    unsafe { int16_rows::<$r, true>(dtype, &p, &q, xq, out) }
                })*
                _ => {}
            }
        };
    }
    run!(1 2 3 4 5 6 7 8);
}

/// The int16 kernel of `dtype` on `R` rows.
///
/// # Safety
/// As for [`int16::quant_rows_i16`]; `dtype` quantized.
#[inline]
unsafe fn int16_rows<const R: usize, const FETCH: bool>(
    dtype: DType,
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::Q8_0 => int16::quant_rows_i16::<Q8_0, R, FETCH>(p, next, xq, out),
            DType::Q4_0 => int16::quant_rows_i16::<Q4_0, R, FETCH>(p, next, xq, out),
            DType::Q4_1 => int16::quant_rows_i16::<Q4_1, R, FETCH>(p, next, xq, out),
            DType::F32 | DType::F16 | DType::BF16 => {}
        }
    }
}

/// Wrapping sum of `data` with AVX2 loads (the bandwidth probe's reader).
pub(crate) fn read_sum(data: &[u64]) -> u64 {
    debug_check_level();
    // SAFETY: only called on the AVX2 level, after the features were detected.
    unsafe { read::read_sum(data) }
}

/// Dequantise one row (sizes checked by callers).
pub(crate) fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    debug_check_level();
    assert!(row.len() >= dtype.row_bytes(out.len()).unwrap_or(usize::MAX));
    let p = row.as_ptr();
    // SAFETY: features detected by the dispatcher; the assert keeps the row in bounds.
    unsafe {
        match dtype {
            DType::F32 => dequant::float_row::<F32>(p, out),
            DType::F16 => dequant::float_row::<F16>(p, out),
            DType::BF16 => dequant::float_row::<Bf16>(p, out),
            DType::Q8_0 => dequant::quant_row::<Q8_0>(p, out),
            DType::Q4_0 => dequant::quant_row::<Q4_0>(p, out),
            DType::Q4_1 => dequant::quant_row::<Q4_1>(p, out),
        }
    }
}

/// Matmul tile product (see [`tile::tile_dot`]).
pub(crate) fn tile_dot(w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    debug_check_level();
    // SAFETY: features detected by the dispatcher; tile_dot checks its slice sizes.
    unsafe { tile::tile_dot(w, cols, x, out) }
}
