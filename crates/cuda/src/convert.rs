//! The formats the GPU takes by conversion at upload: the decoded formats (the table formats
//! IQ4_NL, IQ4_XS, MXFP4, the ternary TQ1_0, TQ2_0 and the lattice IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the low-bit ones (NVFP4, Q1_0, Q2_0) have no GPU kernels
//! of their own; their rows are re-encoded on the way to the device ([`device_dtype`],
//! [`device_rows`]) as Q8_0 (NVFP4: F16), and the device kernels, the slabs and the plan's
//! accounting see those rows (34 bytes per 32 weights where the host holds 18, 17, 17, 6.75,
//! 8.25, 8.25, 9.25, 10.25, 12.25, 13.75, 6.25, 7, 4.5 or 9; NVFP4's 2 bytes a weight where the
//! host holds 0.5625).
//!
//! The conversion, per 32 weights (w = scale·value, the value an int8 of the format's table):
//! - IQ4_NL: d and the values as they are: exact (the same f32 products).
//! - MXFP4: w = 2^s·v with v in ±{0..12} (s = e − 128): d = 2^(s − k), q = v·2^k with the
//!   smallest k in 0..=3 that brings d under f16's largest power 2^15; exact for s in −24..=18
//!   (every scale a real tensor holds), else the nearest Q8_0 (d clamped to f16's range).
//! - IQ4_XS: each 32-weight sub-block's d·(scale − 32), computed in f32 as the CPU does, rounded
//!   to f16 as the Q8_0 scale, the values as they are: one f16 rounding of the sub-block scale
//!   (relative 2^−11 at most).
//! - TQ1_0, TQ2_0: the block's f16 d as every sub-block's scale, the trits as the values: exact.
//! - IQ2_XXS: each sub-block's d·(0.5 + ls)·0.25 (in f32 as the CPU computes it) rounded to f16
//!   as the Q8_0 scale, the signed grid values (|q| ≤ 43) as the values: one f16 rounding of the
//!   sub-block scale (relative 2^−11 at most). IQ2_XS and IQ2_S the same where a sub-block's two
//!   16-weight halves have one scale; where they differ, one Q8_0 scale cannot hold both, and the
//!   sub-block's 32 dequantized weights are re-encoded by ggml's Q8_0 rule (d = max|w| / 127,
//!   q = round(w / d)): each weight within half a step, max|w| / 254, plus the f16 rounding of d
//!   (relative 2^−11 of |w|).
//! - Q1_0, Q2_0: the block's f16 d as every 32-weight sub-block's scale, the values ±1 or
//!   −1..=2 as they are: exact.
//! - NVFP4: each weight as an f16: exact. A weight is a UE4M3 scale (4 significant bits, 2^−10
//!   .. 240) times a doubled E2M1 value (at most 2 significant bits, up to 12), so at most 6
//!   significant bits between 2^−10 and 2,880: inside f16's normal range. (Q8_0 cannot hold it
//!   exactly: a 32-weight Q8_0 block has one scale where NVFP4 has two, of any ratio.)
//! - IQ3_XXS, IQ3_S, IQ1_S: each 32-weight sub-block's scale (d·(0.5 + ls)·0.5, d·(1 + 2·sc),
//!   d·(2k + 1) / 8; f32 as the CPU computes it) rounded to f16, the signed codebook values
//!   (at most 62, 15 and 9 in magnitude) as they are: one f16 rounding of the sub-block scale,
//!   relative 2^−11 at most (while the scale stays in f16's normal range: |d| below 2^15 for
//!   IQ3_XXS and IQ3_S, below 2^15·8/15 for IQ1_S; larger scales saturate at f16's
//!   largest).
//! - IQ1_M: its scales are per 16 weights, Q8_0's per 32: the weights are decoded (the CPU's
//!   values) and encoded as Q8_0 (d = max|w| / 127 rounded to f16, q = round(w / d)): each
//!   weight within half a step, max|w| / 254 of its 32-block, plus the f16 rounding of d
//!   (relative 2^−11 of the weight).

use std::borrow::Cow;

use half::f16;
use powerinfer_core::dequantize::unpack_table;
use powerinfer_core::dequantize_iq2::unpack_iq2;
use powerinfer_core::{dequantize_row, ensure, quantize_row, DType, Result};

/// The format `dtype`'s rows take on a device: F16 for NVFP4, Q8_0 for the other converted
/// formats, else `dtype`.
pub const fn device_dtype(dtype: DType) -> DType {
    match (dtype, is_converted(dtype)) {
        (DType::NVFP4, _) => DType::F16,
        (_, true) => DType::Q8_0,
        (_, false) => dtype,
    }
}

/// Whether `dtype`'s rows are converted at upload (the decoded and low-bit formats).
pub const fn is_converted(dtype: DType) -> bool {
    dtype.is_decoded() || dtype.is_lowbit()
}

/// Rows of `cols` weights in `dtype` (whole rows, GGUF layout) as [`device_dtype`] rows, GGUF
/// layout (the repack comes after); `rows` itself when `dtype` is not converted.
pub fn device_rows(dtype: DType, cols: usize, rows: &[u8]) -> Result<Cow<'_, [u8]>> {
    if !is_converted(dtype) {
        return Ok(Cow::Borrowed(rows));
    }
    let rb = dtype.row_bytes(cols)?;
    ensure!(
        rb > 0 && rows.len().is_multiple_of(rb),
        Shape,
        "{} bytes are no whole number of {dtype} rows of {cols} weights",
        rows.len()
    );
    if dtype.is_lowbit() {
        return Ok(Cow::Owned(lowbit_rows(dtype, rows)));
    }
    if dtype == DType::IQ1_M {
        return Ok(Cow::Owned(requantized_q8_0(dtype, cols, rows)?));
    }
    let n_blocks = rows.len() / dtype.block_bytes();
    let sub = dtype.block_size() / 32;
    let mut out = vec![0u8; n_blocks * sub * 34];
    let (mut d, mut q) = ([0f32; 16], [0i8; 256]);
    for (b, o) in rows
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(34 * sub))
    {
        let per16 = unpack_any(dtype, b, &mut d, &mut q);
        for (s, blk) in o.chunks_exact_mut(34).enumerate() {
            let vals = &q[32 * s..32 * s + 32];
            if per16 && d[2 * s] != d[2 * s + 1] {
                requantize(&d[2 * s..2 * s + 2], vals, blk);
                continue;
            }
            let ds = if per16 { d[2 * s] } else { d[s] };
            let (scale, shift) = match dtype {
                DType::MXFP4 => mxfp4_scale(d[0]),
                _ => (f16::from_f32(ds.clamp(-F16_MAX, F16_MAX)), 0),
            };
            blk[..2].copy_from_slice(&scale.to_le_bytes());
            for (qo, &v) in blk[2..].iter_mut().zip(vals) {
                *qo = (((v as i32) << shift).clamp(-127, 127) as i8) as u8;
            }
        }
    }
    Ok(Cow::Owned(out))
}

/// The block `b` as int8 values `q` and scales `d`: per 32 weights in `d[..8]` (false), or per
/// 16 in `d` (true: IQ2_XS, IQ2_S; IQ2_XXS's are per 32 as well, read from its halves).
fn unpack_any(dtype: DType, b: &[u8], d: &mut [f32; 16], q: &mut [i8; 256]) -> bool {
    if !DType::LATTICE_IQ2.contains(&dtype) {
        let mut d8 = [0f32; 8];
        unpack_table(dtype, b, &mut d8, q);
        d[..8].copy_from_slice(&d8);
        return false;
    }
    unpack_iq2(dtype, b, d, q);
    if dtype == DType::IQ2_XXS {
        for s in 0..8 {
            d[s] = d[2 * s];
        }
        return false;
    }
    true
}

/// A 32-weight sub-block of two half scales `d` and values `q` as the Q8_0 block `blk`, by
/// ggml's Q8_0 rule on its dequantized weights (see the module docs).
fn requantize(d: &[f32], q: &[i8], blk: &mut [u8]) {
    let w: Vec<f32> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| d[i / 16] * v as f32)
        .collect();
    quantize_row(DType::Q8_0, &w, blk).expect("32 weights make one Q8_0 block");
}

/// Whole rows of a low-bit format as [`device_dtype`] rows (see the module docs): NVFP4's
/// weights decoded and stored as f16, Q1_0's and Q2_0's 32-weight sub-blocks as Q8_0 blocks
/// of the block's d.
fn lowbit_rows(dtype: DType, rows: &[u8]) -> Vec<u8> {
    use powerinfer_core::lowbit::unpack_lowbit;
    let n = dtype.block_size();
    let mut out = Vec::with_capacity(rows.len() / dtype.block_bytes() * n * 2);
    let (mut d, mut q) = ([0f32; 8], [0i8; 128]);
    for b in rows.chunks_exact(dtype.block_bytes()) {
        unpack_lowbit(dtype, b, &mut d, &mut q);
        if dtype == DType::NVFP4 {
            let w = (0..n).map(|i| f16::from_f32(d[i / 16] * q[i] as f32));
            out.extend(w.flat_map(f16::to_le_bytes));
            continue;
        }
        for vals in q[..n].chunks_exact(32) {
            out.extend(f16::from_f32(d[0]).to_le_bytes());
            out.extend(vals.iter().map(|&v| v as u8));
        }
    }
    out
}
/// `rows` (whole rows of `cols` in `dtype`) decoded and encoded again as Q8_0 (IQ1_M: its
/// scales per 16 weights have no per-32 Q8_0 form; see the module docs).
fn requantized_q8_0(dtype: DType, cols: usize, rows: &[u8]) -> Result<Vec<u8>> {
    let (rb, qb) = (dtype.row_bytes(cols)?, DType::Q8_0.row_bytes(cols)?);
    let mut out = vec![0u8; rows.len() / rb * qb];
    let mut w = vec![0f32; cols];
    for (r, o) in rows.chunks_exact(rb).zip(out.chunks_exact_mut(qb)) {
        dequantize_row(dtype, r, &mut w)?;
        quantize_row(DType::Q8_0, &w, o)?;
    }
    Ok(out)
}

/// f16's largest finite value: sub-block scales past it saturate there.
const F16_MAX: f32 = 65504.0;

/// An MXFP4 block scale 2^s (f32, exact) as a Q8_0 f16 scale and the shift of the values
/// (see the module docs): exact in f16 where s − shift lies in −24..=15.
fn mxfp4_scale(d: f32) -> (f16, u32) {
    let s = d.log2().round() as i32;
    let shift = (s - 15).clamp(0, 3);
    (f16::from_f32(2f32.powi(s - shift)), shift as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut out: Vec<u8> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect();
        for b in out.chunks_exact_mut(dtype.block_bytes()) {
            match dtype {
                DType::MXFP4 => b[0] = 104 + b[0] % 43, // s = −24..=18
                DType::IQ1_M => {
                    // d in the top nibbles of the four scale words.
                    let d = f16::from_f32(0.001 * (b[0] as f32 - 128.0)).to_bits();
                    for i in 0..4 {
                        let w = 49 + 2 * i;
                        b[w] = (b[w] & 0x0f) | (((d >> (4 * i)) & 15) as u8) << 4;
                    }
                }
                _ => {
                    let at = dtype.f16_fields()[0];
                    let d = f16::from_f32(0.001 * (b[0] as f32 - 128.0));
                    b[at..at + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn iq4_nl_mxfp4_and_ternary_convert_exactly_iq4_xs_and_lattice_within_an_f16_scale() {
        for dtype in [&DType::TABLE[..], &DType::TERNARY, &DType::LATTICE_IQ3_IQ1].concat() {
            let cols = 512;
            let raw = rows(dtype, 3 * dtype.row_bytes(cols).unwrap(), 9);
            let conv = device_rows(dtype, cols, &raw).unwrap();
            assert_eq!(conv.len(), 3 * DType::Q8_0.row_bytes(cols).unwrap());
            let (mut want, mut got) = (vec![0f32; 3 * cols], vec![0f32; 3 * cols]);
            dequantize_row(dtype, &raw, &mut want).unwrap();
            dequantize_row(DType::Q8_0, &conv, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                match dtype {
                    DType::IQ4_XS | DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S => {
                        let tol = w.abs() * (2f32.powi(-11) + 2f32.powi(-22));
                        assert!((g - w).abs() <= tol, "{i}: {g} vs {w}")
                    }
                    DType::IQ1_M => {
                        let blk = &want[i / 32 * 32..i / 32 * 32 + 32];
                        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let tol = amax / 254.0 * 1.001 + w.abs() * 2f32.powi(-10);
                        assert!((g - w).abs() <= tol, "IQ1_M {i}: {g} vs {w}")
                    }
                    _ => assert_eq!(g.to_bits(), w.to_bits(), "{dtype} weight {i}: {g} vs {w}"),
                }
            }
        }
    }

    /// IQ2_XXS converts within an f16 rounding of its sub-block scales; IQ2_XS and IQ2_S within
    /// half a Q8_0 step of their sub-block's largest weight (and that f16 rounding), exactly as
    /// IQ2_XXS where a sub-block's halves share their scale (every scale byte set to 0x77 here,
    /// then random).
    #[test]
    fn lattice_iq2_converts_within_the_stated_bound() {
        for dtype in DType::LATTICE_IQ2 {
            let cols = 512;
            for equal in [true, false] {
                let mut raw = rows(dtype, 3 * dtype.row_bytes(cols).unwrap(), 11);
                if equal && dtype != DType::IQ2_XXS {
                    for b in raw.chunks_exact_mut(dtype.block_bytes()) {
                        let n = b.len();
                        b[n - 8..].fill(0x77);
                    }
                }
                let conv = device_rows(dtype, cols, &raw).unwrap();
                let (mut want, mut got) = (vec![0f32; 3 * cols], vec![0f32; 3 * cols]);
                dequantize_row(dtype, &raw, &mut want).unwrap();
                dequantize_row(DType::Q8_0, &conv, &mut got).unwrap();
                for (s, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
                    let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let step = match equal || dtype == DType::IQ2_XXS {
                        true => 0.0,
                        false => amax / 254.0 * (1.0 + 2f32.powi(-10)),
                    };
                    for (gi, wi) in g.iter().zip(w) {
                        let tol = step + wi.abs() * (2f32.powi(-11) + 2f32.powi(-22));
                        assert!(
                            (gi - wi).abs() <= tol,
                            "{dtype} sub-block {s}: {gi} vs {wi}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn lowbit_formats_convert_exactly() {
        for dtype in DType::LOWBIT {
            let cols = 512;
            let mut raw = rows(DType::Q8_0, 3 * dtype.row_bytes(cols).unwrap(), 5);
            if dtype == DType::NVFP4 {
                // Every scale byte, the largest (0xFF: 240) and subnormal ones among them.
                for (i, b) in raw.chunks_exact_mut(36).enumerate() {
                    b[..4].copy_from_slice(&[(4 * i) as u8, (4 * i + 1) as u8, 0xFF, 1]);
                }
            } else {
                for (i, b) in raw.chunks_exact_mut(18).enumerate() {
                    let d = f16::from_f32(0.01 * (i as f32 - 20.0));
                    b[..2].copy_from_slice(&d.to_le_bytes());
                }
            }
            let conv = device_rows(dtype, cols, &raw).unwrap();
            let dev = device_dtype(dtype);
            assert_eq!(conv.len(), 3 * dev.row_bytes(cols).unwrap(), "{dtype}");
            let (mut want, mut got) = (vec![0f32; 3 * cols], vec![0f32; 3 * cols]);
            dequantize_row(dtype, &raw, &mut want).unwrap();
            dequantize_row(dev, &conv, &mut got).unwrap();
            assert!(want.iter().any(|w| w.abs() > 1000.0) || dtype != DType::NVFP4);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{dtype} weight {i}: {g} vs {w}");
            }
        }
        assert_eq!(
            (device_dtype(DType::NVFP4), device_dtype(DType::Q1_0)),
            (DType::F16, DType::Q8_0)
        );
    }

    #[test]
    fn other_formats_pass_through() {
        assert_eq!(device_dtype(DType::Q4_K), DType::Q4_K);
        assert!(!is_converted(DType::Q8_0) && is_converted(DType::MXFP4));
        let raw = [7u8; 18];
        assert!(matches!(
            device_rows(DType::Q4_0, 32, &raw).unwrap(),
            Cow::Borrowed(_)
        ));
        assert!(device_rows(DType::IQ4_NL, 32, &raw[..17]).is_err());
    }
}
