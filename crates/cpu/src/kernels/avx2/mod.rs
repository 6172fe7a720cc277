//! AVX2 + FMA + F16C kernels. The safe entry points here are only reached through
//! [`crate::dispatch`] once [`crate::simd::level`] has detected those features. Every format's
//! kernels are reached through the [`formats::Format`] trait, the same for the dense products
//! and the sparse row kernels. On the AVX-512 level, the entry points that take a `wide` flag
//! run the 512-bit forms of [`wide`] (int16-x dot of the 32-block formats), [`wide_float`]
//! (float-format rows) and [`wide_tile`] (matmul tile) instead; the AVX-512 level's matmul of
//! quantized rows takes the integer tile of [`int_tile`].
//!
//! Layering (each file imports only files below it; none imports this one): [`reduce`]
//! (horizontal sums), [`row_group`] (rows read together and their cache hints), [`quant`] and
//! [`formats`] (how formats decode, the [`formats::Format`] trait), the generic kernels
//! ([`rows`], [`dot`], [`dequant`], [`int16`], [`kquant`], [`int8_k`] and [`iq2_dot`], ...),
//! [`select`] (each dtype's `Format` impl and the macros that pick one at run time), and this
//! module's entry points.

mod attend;
mod attend_block;
pub(crate) mod cols;
mod dequant;
mod dot;
mod formats;
mod int16;
pub(crate) mod int8;
mod int8_formats;
mod int8_k;
mod int8_rows;
mod int_tile;
pub(crate) mod interleaved;
mod iq1;
mod iq2;
mod iq2_dot;
mod iq3;
mod kquant;
mod kv_passes;
mod lattice;
mod lowbit;
mod q4_axpy;
mod quant;
mod read;
mod reduce;
mod row_group;
mod rows;
mod select;
mod split8;
mod split8_tokens;
pub(crate) use split8_tokens::XLanes;
mod table;
mod ternary;
mod tile;
mod wide;
mod wide_float;
mod wide_k;
mod wide_tile;

use crate::operands::attention::{Head, KvHead, KvScratch, ScoreBlock, ValueBlock};
use crate::simd::{debug_check_level, debug_check_wide};
use formats::Format;
pub(crate) use int16::XQuant;
pub(crate) use int8::X8;
pub(crate) use int8_k::{takes_x8k, X8K};
use int8_k::{with_x8k, X8KRows, X8K_TOKENS};
use int8_rows::with_int8;
pub(crate) use int8_rows::TOKENS as X8_TOKENS;
pub(crate) use int_tile::{
    rows_times_tokens as int_tile_rows, token_fits as int_tile_fits, XTile,
    TILE_ROWS as INT_TILE_ROWS,
};
use powerinfer_core::DType;
use quant::{Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use row_group::RowGroup;
pub(crate) use row_group::GROUP;
use select::{with_format, with_rows, with_wide_float};

/// Rows computed together by the dense f32-x matvec kernels.
const ROWS: usize = 4;
/// Rows computed together by the dense int16-x matvec kernel.
const QROWS: usize = 4;
/// Take the split-byte 8-bit kernels ([`split8`]) for the 4- and 5-bit formats on the AVX-512
/// level.
const SPLIT8: bool = true;
/// Bytes the dense int16-x matvec fetches ahead of its reads: with one tile ahead, rows of 28
/// Q4_0 blocks (dim 896) ran the gate/up product 15% slower per byte than rows of 152 blocks
/// (Qwen-shaped Q4_0, one thread, gate/up 322 -> 272 ms over 33 tokens with 4-16 KiB ahead).
const PREFETCH_BYTES: usize = 4 << 10;

/// Tiles of `tile_bytes` to fetch ahead of the one being computed so that at least
/// [`PREFETCH_BYTES`] are in flight (one tile for long rows; more for short ones, whose single
/// next tile is fetched too late to hide DRAM latency).
fn prefetch_tiles(tile_bytes: usize) -> usize {
    PREFETCH_BYTES.div_ceil(tile_bytes.max(1)).max(1)
}

/// The `wide` arguments to test on this CPU: false, and true where it has the AVX-512 level.
#[cfg(test)]
pub(crate) fn wide_choices() -> Vec<bool> {
    let mut v = vec![false];
    if crate::simd::detect() == crate::simd::Level::Avx512 {
        v.push(true);
    }
    v
}

/// out[i] = dot(row i, x) over consecutive rows of `row_bytes` bytes (sizes checked by callers).
/// `wide`: float-format rows take the 512-bit kernels (only on the AVX-512 level).
pub(crate) fn rows_dot(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
    wide: bool,
) {
    debug_check_level();
    debug_check_wide(wide);
    assert!(
        rows.len() >= out.len() * row_bytes
            && row_bytes >= dtype.row_bytes(x.len()).unwrap_or(usize::MAX)
    );
    let base = rows.as_ptr();
    // SAFETY: the dispatcher only calls this after detecting AVX2/FMA/F16C (and with `wide`,
    // the AVX-512 level), and the assert above keeps every row of x.len() weights inside
    // `rows`.
    unsafe {
        with_wide_float!(wide, dtype, F => wide_float::rows_dot::<F>(base, row_bytes, x, out),
            else => with_format!(dtype, F => rows_with::<F>(base, row_bytes, x, out)))
    }
}

/// The format's dot kernel over whole groups of [`ROWS`] rows, then over single rows, fetching
/// the next group's rows (or the next row) in step with each group's reads.
///
/// # Safety
/// As for the kernels: `out.len()` rows readable at `base`, `row_bytes` apart; features present.
#[inline]
unsafe fn rows_with<F: Format>(base: *const u8, row_bytes: usize, x: &[f32], out: &mut [f32]) {
    let full = out.len() / ROWS * ROWS;
    for (g, o) in out[..full].chunks_exact_mut(ROWS).enumerate() {
        // The next tile's rows: past the end for the last tile, harmless for a hint.
        let group = RowGroup::strided(base, row_bytes, g * ROWS, (g + 1) * ROWS);
        // SAFETY: rows g·ROWS.. are within the rows per the caller.
        unsafe { F::dot::<ROWS>(&group, x, o) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        let group = RowGroup::strided(base, row_bytes, i, i + 1);
        // SAFETY: row i is within the rows per the caller.
        unsafe { F::dot::<1>(&group, x, std::slice::from_mut(o)) };
    }
}

/// An entry point over a group of rows (`rows[..n]`, `n <= GROUP`, each of `dtype`; sizes checked
/// by the caller), fetching the `next` rows alongside: `$name(dtype, rows, next, $x, $y, wide)`
/// runs the format's `$op` kernel (`wide`: float-format rows take the 512-bit one, only on the
/// AVX-512 level) after [`RowGroup::checked`] with `$weights` weights per row and `$count`
/// values per row.
macro_rules! group_entry {
    ($(#[$doc:meta])* $name:ident($x:ident, $y:ident), $weights:expr, $count:expr, $op:ident) => {
        $(#[$doc])*
        pub(crate) fn $name(
            dtype: DType,
            rows: &[&[u8]],
            next: &[&[u8]],
            $x: &[f32],
            $y: &mut [f32],
            wide: bool,
        ) {
            debug_check_wide(wide);
            let g = RowGroup::checked(dtype, rows, next, $weights, $count);
            // SAFETY: features detected (the dispatcher's contract, checked in debug builds),
            // the AVX-512 level where `wide`; the check above keeps every row's weights
            // readable.
            unsafe {
                with_rows!(rows.len(), R => with_wide_float!(wide, dtype,
                    F => wide_float::$op::<F, R>(&g, $x, $y),
                    else => with_format!(dtype, F => F::$op::<R>(&g, $x, $y))))
            }
        }
    };
}

group_entry!(
    /// y += Σ_i a[i] · row i, for the rows each holding `y.len()` weights.
    axpy_group(a, y),
    y.len(),
    a.len(),
    axpy
);

group_entry!(
    /// out[i] = dot(rows[i], x) for the rows each holding `x.len()` values. Quantized rows take
    /// the f32 path here; the int16-x kernel (`super::scattered_dot_i16`) is the fast one for
    /// them.
    dot_group(x, out),
    x.len(),
    out.len(),
    dot
);

/// Rows `first..first + R` of the consecutive rows at `base`, `row_bytes` apart, as pointers
/// (wrapping: ones past the end are only ever prefetched).
#[inline(always)]
fn row_ptrs<const R: usize>(base: *const u8, row_bytes: usize, first: usize) -> [*const u8; R] {
    std::array::from_fn(|i| base.wrapping_add((first + i) * row_bytes))
}

/// The first row of the tile fetched alongside tile `g` of the `full` rows in whole tiles: the
/// tile `ahead` tiles later (PREFETCH_BYTES ahead), fetched chunk by chunk in step; the last
/// tiles re-touch their own rows.
#[inline(always)]
fn tile_ahead(g: usize, ahead: usize, full: usize) -> usize {
    match (g + ahead) * QROWS < full {
        true => (g + ahead) * QROWS,
        false => g * QROWS,
    }
}

/// The checks of a call on up to 8 scattered rows of `dtype` and as many `next` ones: each row
/// holds `blocks` blocks, and `out_len` is the row count.
fn check_scattered(
    dtype: DType,
    (rows, next): (&[&[u8]], &[&[u8]]),
    blocks: usize,
    out_len: usize,
) {
    let want = dtype.row_bytes(32 * blocks).unwrap_or(usize::MAX);
    assert!(
        dtype.is_quantized()
            && rows.len() == out_len
            && rows.len() <= 8
            && next.len() <= 8
            && rows.iter().all(|r| r.len() >= want)
    );
}

/// The `R` scattered rows and the rows fetched beside them (a row's own where `next` has
/// none), as pointers.
#[inline(always)]
fn scattered_ptrs<const R: usize>(
    rows: &[&[u8]],
    next: &[&[u8]],
) -> ([*const u8; R], [*const u8; R]) {
    let p: [*const u8; R] = std::array::from_fn(|i| rows[i].as_ptr());
    let q: [*const u8; R] = std::array::from_fn(|i| next.get(i).map_or(p[i], |r| r.as_ptr()));
    (p, q)
}

/// out[i] = dot(row i, x) for consecutive quantized rows, on the int16-quantized x
/// (see [`int16`]); `dtype` must be quantized. `wide`: take the 512-bit kernels (only on the
/// AVX-512 level).
pub(crate) fn rows_dot_i16(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    xq: &XQuant,
    out: &mut [f32],
    wide: bool,
) {
    debug_check_level();
    debug_check_wide(wide);
    let want = dtype.row_bytes(32 * xq.blocks()).unwrap_or(usize::MAX);
    assert!(dtype.is_quantized() && rows.len() >= out.len() * row_bytes && row_bytes >= want);
    let base = rows.as_ptr();
    let full = out.len() / QROWS * QROWS;
    let ahead = prefetch_tiles(QROWS * row_bytes);
    for (g, o) in out[..full].chunks_exact_mut(QROWS).enumerate() {
        let p = row_ptrs::<QROWS>(base, row_bytes, g * QROWS);
        // A later tile's rows, fetched in step: the int16 kernel is slow enough per byte that
        // the hardware prefetchers alone leave DRAM idle between tiles (dense Q4_0 decode of
        // the synthetic dim-2048 model: 39 -> 57 tok/s on 2 threads).
        let q = row_ptrs::<QROWS>(base, row_bytes, tile_ahead(g, ahead, full));
        // SAFETY: features detected by the dispatcher; the assert keeps rows g·QROWS.. inside
        // `rows`, each with xq.blocks() blocks; `q` is only prefetched.
        unsafe { int16_rows::<QROWS, true>(dtype, &p, &q, xq, o, wide) };
    }
    for (i, o) in out.iter_mut().enumerate().skip(full) {
        let p = [base.wrapping_add(i * row_bytes)];
        // SAFETY: as above, for the single row i.
        unsafe { int16_rows::<1, false>(dtype, &p, &p, xq, std::slice::from_mut(o), wide) };
    }
}

/// `outs[t][i]` = dot(row i, token `xs[t]`) over consecutive rows of `dtype`
/// (`outs[0].len()` of them), each bit-identical to [`rows_dot_i16`] (wide) on that token;
/// false, with nothing written, where `dtype` has no several-token kernel.
pub(crate) fn rows_dot_tokens(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    xs: &[&XQuant],
    lanes: &[&XLanes],
    outs: &mut [&mut [f32]],
) -> bool {
    debug_check_wide(true);
    let count = outs.first().map_or(0, |o| o.len());
    let blocks = xs.first().map_or(0, |x| x.blocks());
    let want = dtype.row_bytes(32 * blocks).unwrap_or(usize::MAX);
    assert!(outs.len() == xs.len() && outs.iter().all(|o| o.len() == count));
    assert!(xs.iter().all(|x| x.blocks() == blocks) && lanes.len() == xs.len());
    assert!(lanes.iter().all(|l| l.len() == 32 * blocks));
    assert!(rows.len() >= count * row_bytes && row_bytes >= want);
    let ahead = prefetch_tiles(QROWS * row_bytes);
    // SAFETY: the AVX-512 level (checked above in debug builds, by the dispatcher always); the
    // asserts keep every row inside `rows` with `blocks` blocks, and every output in range.
    unsafe {
        match dtype {
            DType::Q4_0 if SPLIT8 => {
                split8_tokens::rows_dot_tokens::<Q4_0>(rows, row_bytes, xs, lanes, outs, ahead)
            }
            DType::Q4_1 if SPLIT8 => {
                split8_tokens::rows_dot_tokens::<Q4_1>(rows, row_bytes, xs, lanes, outs, ahead)
            }
            DType::Q5_0 if SPLIT8 => {
                split8_tokens::rows_dot_tokens::<Q5_0>(rows, row_bytes, xs, lanes, outs, ahead)
            }
            DType::Q5_1 if SPLIT8 => {
                split8_tokens::rows_dot_tokens::<Q5_1>(rows, row_bytes, xs, lanes, outs, ahead)
            }
            _ => return false,
        }
    }
    true
}

/// `outs[t][i]` = dot(row i, token `xs[t]`) over consecutive quantized rows of `dtype`
/// (`outs[t].len()` of them), on the int8 x (see [`int8_rows`]): each token's values are the
/// same bits whatever tokens share the call, and on both instruction sets. `vnni`: take the
/// AVX-512 VNNI form (only on the AVX-512 level).
pub(crate) fn rows_dot_x8(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    xs: &[&X8],
    outs: &mut [&mut [f32]],
    vnni: bool,
) {
    debug_check_level();
    debug_check_wide(vnni);
    let count = outs.first().map_or(0, |o| o.len());
    let blocks = xs.first().map_or(0, |x| x.blocks());
    let want = dtype.row_bytes(32 * blocks).unwrap_or(usize::MAX);
    assert!(dtype.is_quantized() && outs.len() == xs.len());
    assert!(outs.iter().all(|o| o.len() == count) && xs.iter().all(|x| x.blocks() == blocks));
    assert!(rows.len() >= count * row_bytes && row_bytes >= want);
    let base = rows.as_ptr();
    let full = count / QROWS * QROWS;
    let ahead = prefetch_tiles(QROWS * row_bytes);
    for (xs, outs) in xs.chunks(X8_TOKENS).zip(outs.chunks_mut(X8_TOKENS)) {
        for g in 0..full / QROWS {
            let p = row_ptrs::<QROWS>(base, row_bytes, g * QROWS);
            let q = row_ptrs::<QROWS>(base, row_bytes, tile_ahead(g, ahead, full));
            // SAFETY: features detected by the dispatcher (VNNI where `vnni`); the asserts keep
            // rows g·QROWS.. inside `rows`, each with `blocks` blocks; `q` is only prefetched.
            let got = with_int8!(dtype, F => unsafe {
                int8_rows::rows_of::<F, QROWS, true>(vnni, &p, &q, xs, blocks)
            }, else => unreachable!("{dtype} is not quantized"));
            for (t, o) in outs.iter_mut().enumerate() {
                for (i, r) in got.iter().enumerate() {
                    o[g * QROWS + i] = r[t];
                }
            }
        }
        for i in full..count {
            let p = [base.wrapping_add(i * row_bytes)];
            // SAFETY: as above, for the single row i.
            let got = with_int8!(dtype, F => unsafe {
                int8_rows::rows_of::<F, 1, false>(vnni, &p, &p, xs, blocks)
            }, else => unreachable!("{dtype} is not quantized"));
            for (t, o) in outs.iter_mut().enumerate() {
                o[i] = got[0][t];
            }
        }
    }
}

/// `outs[t][i]` = dot(row i, token `xs[t]`) over consecutive rows of `dtype`
/// (`outs[t].len()` of them), on the int8 x per 256 (see [`int8_k`]; `dtype` one that
/// [`takes_x8k`]): each token's values the same bits whatever tokens share the call.
pub(crate) fn rows_dot_x8k(
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    xs: &[&X8K],
    outs: &mut [&mut [f32]],
) {
    debug_check_level();
    let count = outs.first().map_or(0, |o| o.len());
    let blocks = xs.first().map_or(0, |x| x.blocks());
    let want = dtype.row_bytes(256 * blocks).unwrap_or(usize::MAX);
    assert!(takes_x8k(dtype) && outs.len() == xs.len());
    assert!(outs.iter().all(|o| o.len() == count) && xs.iter().all(|x| x.blocks() == blocks));
    assert!(rows.len() >= count * row_bytes && row_bytes >= want);
    let base = rows.as_ptr();
    let full = count / QROWS * QROWS;
    let ahead = prefetch_tiles(QROWS * row_bytes);
    for (xs, outs) in xs.chunks(X8K_TOKENS).zip(outs.chunks_mut(X8K_TOKENS)) {
        with_rows!(xs.len(), T => {
            let xt: [&X8K; T] = std::array::from_fn(|t| xs[t]);
            for g in 0..full / QROWS {
                let p = row_ptrs::<QROWS>(base, row_bytes, g * QROWS);
                let q = row_ptrs::<QROWS>(base, row_bytes, tile_ahead(g, ahead, full));
                // SAFETY: features detected by the dispatcher; the asserts keep rows
                // g·QROWS.. inside `rows`, each with `blocks` blocks; `q` is only prefetched.
                let got = with_x8k!(dtype, F => unsafe {
                    F::rows::<QROWS, T, true>(&p, &q, &xt, blocks)
                }, else => unreachable!("{dtype} takes no int8 x per 256"));
                for (t, o) in outs.iter_mut().enumerate() {
                    for (i, r) in got.iter().enumerate() {
                        o[g * QROWS + i] = r[t];
                    }
                }
            }
            for i in full..count {
                let p = [base.wrapping_add(i * row_bytes)];
                // SAFETY: as above, for the single row i.
                let got = with_x8k!(dtype, F => unsafe {
                    F::rows::<1, T, false>(&p, &p, &xt, blocks)
                }, else => unreachable!("{dtype} takes no int8 x per 256"));
                for (t, o) in outs.iter_mut().enumerate() {
                    o[i] = got[0][t];
                }
            }
        })
    }
}

/// out[i] = dot(rows[i], x) for up to 8 scattered rows of `dtype` (one that [`takes_x8k`],
/// each at least `x.blocks()` blocks) on the int8 x per 256, fetching the `next` rows (up to
/// as many, read next by the caller) in step; each value the bits [`rows_dot_x8k`] gives that
/// row.
pub(crate) fn scattered_dot_x8k(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    x: &X8K,
    out: &mut [f32],
) {
    debug_check_level();
    check_scattered(dtype, (rows, next), 8 * x.blocks(), out.len());
    assert!(takes_x8k(dtype));
    with_rows!(rows.len(), R => {
        let (p, q) = scattered_ptrs::<R>(rows, next);
        // SAFETY: features detected by the dispatcher; the asserts keep every row's blocks
        // readable; `q` is only prefetched.
        let got = with_x8k!(dtype, F => unsafe {
            F::rows::<R, 1, true>(&p, &q, &[x], x.blocks())
        }, else => unreachable!("{dtype} takes no int8 x per 256"));
        for (o, r) in out.iter_mut().zip(&got) {
            *o = r[0];
        }
    })
}

/// out[i] = dot(rows[i], x) for up to 8 scattered quantized rows (each at least `x.blocks()`
/// blocks of `dtype`) on the int8 x, fetching the `next` rows (up to as many, read next by the
/// caller) into the cache in step; each value the bits [`rows_dot_x8`] gives that row.
pub(crate) fn scattered_dot_x8(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    x: &X8,
    out: &mut [f32],
    vnni: bool,
) {
    debug_check_level();
    debug_check_wide(vnni);
    check_scattered(dtype, (rows, next), x.blocks(), out.len());
    with_rows!(rows.len(), R => {
        let (p, q) = scattered_ptrs::<R>(rows, next);
        // SAFETY: features detected by the dispatcher (VNNI where `vnni`); the assert keeps
        // every row's blocks readable; `q` is only prefetched.
        let got = with_int8!(dtype, F => unsafe {
            int8_rows::rows_of::<F, R, true>(vnni, &p, &q, &[x], x.blocks())
        }, else => unreachable!("{dtype} is not quantized"));
        for (o, r) in out.iter_mut().zip(&got) {
            *o = r[0];
        }
    })
}

/// out[i] = dot(rows[i], x) for up to 8 scattered quantized rows (each at least `xq.blocks()`
/// blocks of `dtype`) on the int16-quantized x, fetching the `next` rows (up to as many, read
/// next by the caller) into the cache in step. `wide` as for [`rows_dot_i16`].
pub(crate) fn scattered_dot_i16(
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    xq: &XQuant,
    out: &mut [f32],
    wide: bool,
) {
    debug_check_level();
    debug_check_wide(wide);
    check_scattered(dtype, (rows, next), xq.blocks(), out.len());
    with_rows!(rows.len(), R => {
        let (p, q) = scattered_ptrs::<R>(rows, next);
        // SAFETY: features detected by the dispatcher; the assert keeps every row's blocks
        // readable; `q` is only prefetched.
        unsafe { int16_rows::<R, true>(dtype, &p, &q, xq, out, wide) }
    })
}

/// The int16 kernel of `dtype` on `R` rows (`wide`: its 512-bit form where it has one).
///
/// # Safety
/// As for [`int16::quant_rows_i16`]; `dtype` quantized; `wide` only on the AVX-512 level.
#[inline]
unsafe fn int16_rows<const R: usize, const FETCH: bool>(
    dtype: DType,
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
    wide: bool,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match (wide, dtype) {
            (true, DType::Q8_0) => wide::quant_rows_i16::<Q8_0, R, FETCH>(p, next, xq, out),
            (true, DType::Q4_0) if SPLIT8 => {
                split8::quant_rows_split::<Q4_0, R, FETCH>(p, next, xq, out)
            }
            (true, DType::Q4_1) if SPLIT8 => {
                split8::quant_rows_split::<Q4_1, R, FETCH>(p, next, xq, out)
            }
            (true, DType::Q5_0) if SPLIT8 => {
                split8::quant_rows_split::<Q5_0, R, FETCH>(p, next, xq, out)
            }
            (true, DType::Q5_1) if SPLIT8 => {
                split8::quant_rows_split::<Q5_1, R, FETCH>(p, next, xq, out)
            }
            (true, DType::Q4_0) => wide::quant_rows_i16::<Q4_0, R, FETCH>(p, next, xq, out),
            (true, DType::Q4_1) => wide::quant_rows_i16::<Q4_1, R, FETCH>(p, next, xq, out),
            (true, DType::Q5_0) => wide::quant_rows_i16::<Q5_0, R, FETCH>(p, next, xq, out),
            (true, DType::Q5_1) => wide::quant_rows_i16::<Q5_1, R, FETCH>(p, next, xq, out),
            (true, DType::Q2_K) => wide_k::rows_i16::<kquant::Q2K, R, FETCH>(p, next, xq, out),
            (true, DType::Q3_K) => wide_k::rows_i16::<kquant::Q3K, R, FETCH>(p, next, xq, out),
            (true, DType::Q4_K) => wide_k::rows_i16::<kquant::Q4K, R, FETCH>(p, next, xq, out),
            (true, DType::Q5_K) => wide_k::rows_i16::<kquant::Q5K, R, FETCH>(p, next, xq, out),
            (true, DType::Q6_K) => wide_k::rows_i16::<kquant::Q6K, R, FETCH>(p, next, xq, out),
            (_, dtype) => int16_rows_avx2::<R, FETCH>(dtype, p, next, xq, out),
        }
    }
}

/// The AVX2 int16 kernel of `dtype` on `R` rows.
///
/// # Safety
/// As for [`int16_rows`].
#[inline]
unsafe fn int16_rows_avx2<const R: usize, const FETCH: bool>(
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
            DType::Q5_0 => int16::quant_rows_i16::<Q5_0, R, FETCH>(p, next, xq, out),
            DType::Q5_1 => int16::quant_rows_i16::<Q5_1, R, FETCH>(p, next, xq, out),
            DType::Q2_K => kquant::rows_i16::<kquant::Q2K, R, FETCH>(p, next, xq, out),
            DType::Q3_K => kquant::rows_i16::<kquant::Q3K, R, FETCH>(p, next, xq, out),
            DType::Q4_K => kquant::rows_i16::<kquant::Q4K, R, FETCH>(p, next, xq, out),
            DType::Q5_K => kquant::rows_i16::<kquant::Q5K, R, FETCH>(p, next, xq, out),
            DType::Q6_K => kquant::rows_i16::<kquant::Q6K, R, FETCH>(p, next, xq, out),
            DType::IQ4_NL => int16::quant_rows_i16::<table::IQ4NL, R, FETCH>(p, next, xq, out),
            DType::MXFP4 => int16::quant_rows_i16::<table::MXFP4, R, FETCH>(p, next, xq, out),
            DType::IQ4_XS => kquant::rows_i16::<table::IQ4XS, R, FETCH>(p, next, xq, out),
            DType::TQ1_0 => kquant::rows_i16::<ternary::TQ1, R, FETCH>(p, next, xq, out),
            DType::TQ2_0 => kquant::rows_i16::<ternary::TQ2, R, FETCH>(p, next, xq, out),
            DType::NVFP4 => lowbit::rows_i16::<lowbit::NVFP4, R>(p, next, xq, out),
            DType::Q1_0 => lowbit::rows_i16::<lowbit::Q1, R>(p, next, xq, out),
            DType::Q2_0 => lowbit::rows_i16::<lowbit::Q2, R>(p, next, xq, out),
            DType::IQ2_XXS => kquant::rows_i16::<iq2::IQ2XXS, R, FETCH>(p, next, xq, out),
            DType::IQ2_XS => kquant::rows_i16::<iq2::IQ2XS, R, FETCH>(p, next, xq, out),
            DType::IQ2_S => kquant::rows_i16::<iq2::IQ2S, R, FETCH>(p, next, xq, out),
            DType::IQ3_XXS => kquant::rows_i16::<iq3::IQ3XXS, R, FETCH>(p, next, xq, out),
            DType::IQ3_S => kquant::rows_i16::<iq3::IQ3S, R, FETCH>(p, next, xq, out),
            DType::IQ1_S => kquant::rows_i16::<iq1::IQ1S, R, FETCH>(p, next, xq, out),
            DType::IQ1_M => kquant::rows_i16::<iq1::IQ1M, R, FETCH>(p, next, xq, out),
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
    unsafe { with_format!(dtype, F => F::dequant(p, out)) }
}

/// Matmul tile product (see [`tile::tile_dot`]); `wide`: its 512-bit form
/// ([`wide_tile::tile_dot`], only on the AVX-512 level).
pub(crate) fn tile_dot(w: &[f32], cols: usize, x: &[f32], out: &mut [f32], wide: bool) {
    debug_check_level();
    debug_check_wide(wide);
    // SAFETY: features detected by the dispatcher (the AVX-512 level where `wide`); tile_dot
    // checks its slice sizes.
    unsafe {
        match wide {
            true => wide_tile::tile_dot(w, cols, x, out),
            false => tile::tile_dot(w, cols, x, out),
        }
    }
}

/// The scores of a query sub-block (see `crate::ops::attend_block`); AVX-512 level only.
pub(crate) fn block_scores(sb: &ScoreBlock<'_>, s: &mut [f32]) {
    debug_check_wide(true);
    let (w, hd) = (sb.width, sb.hd);
    assert!(w.is_multiple_of(16) && s.len() >= sb.n_q * w);
    assert!(hd == 0 || sb.kt.len() >= (hd - 1) * sb.kt_stride + w);
    assert!(sb.n_q == 0 || sb.q.len() >= (sb.n_q - 1) * sb.q_stride + hd);
    // SAFETY: the AVX-512 level per the dispatcher; the asserts are the kernel's size contract.
    unsafe { attend_block::scores(sb, s) }
}

/// The masked softmax of one score row (see `crate::ops::attend_block`); AVX-512 level only.
pub(crate) fn block_softmax_row(row: &mut [f32], lo: usize, hi: usize) -> f32 {
    debug_check_wide(true);
    assert!(row.len().is_multiple_of(16) && lo < hi && hi <= row.len());
    // SAFETY: the AVX-512 level per the dispatcher; the assert is the kernel's size contract.
    unsafe { attend_block::softmax_row(row, lo, hi) }
}

/// The weighted value sums of a query sub-block (see `crate::ops::attend_block`); AVX-512
/// level only.
pub(crate) fn block_values(vb: &ValueBlock<'_>, out: &mut [f32], out_stride: usize) {
    debug_check_wide(true);
    let (n_q, hd) = (vb.inv.len(), vb.hd);
    assert!(vb.np <= vb.width && vb.s.len() >= n_q * vb.width);
    assert!(vb.np == 0 || vb.values.len() >= (vb.np - 1) * vb.stride + hd);
    assert!(n_q == 0 || out.len() >= (n_q - 1) * out_stride + hd);
    // SAFETY: the AVX-512 level per the dispatcher; the asserts are the kernel's size contract.
    unsafe { attend_block::values(vb, out, out_stride) }
}

/// One head over a cache with block-format keys or values: the body of
/// [`crate::kernels::kv_blocks`] compiled for AVX2/FMA/F16C, with its block loops in
/// intrinsics (`kv_passes`).
pub(crate) fn attend_head_kv(head: &KvHead<'_>, scratch: &mut KvScratch, out: &mut [f32]) {
    debug_check_level();
    // SAFETY: features detected by the dispatcher; the body is safe Rust (bounds-checked
    // slices), only compiled with those features enabled.
    unsafe { attend_head_kv_avx2(head, scratch, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_head_kv_avx2(head: &KvHead<'_>, scratch: &mut KvScratch, out: &mut [f32]) {
    crate::kernels::kv_blocks::attend_head_kv::<kv_passes::Avx2>(head, scratch, out)
}

/// One attention head (see [`attend::attend_head`]).
pub(crate) fn attend_head(head: &Head<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    debug_check_level();
    head.check(out);
    // SAFETY: features detected by the dispatcher; the check above keeps every position of
    // the cache and `out` in bounds.
    unsafe { attend::attend_head(head, scores, out) }
}
