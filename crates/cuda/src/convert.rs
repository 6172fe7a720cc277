//! The formats the GPU takes by conversion at upload: the decoded formats (the table formats
//! IQ4_NL, IQ4_XS, MXFP4, the ternary TQ1_0, TQ2_0 and the lattice IQ3_XXS, IQ3_S, IQ1_S,
//! IQ1_M) have no GPU kernels of their own; their rows are re-encoded as Q8_0 on the way to the device
//! ([`device_dtype`], [`device_rows`]), and the device kernels, the slabs and the plan's
//! accounting see Q8_0 rows (34 bytes per 32 weights where the host holds 18, 17, 17, 6.75,
//! 8.25, 12.25, 13.75, 6.25 or 7).
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
use powerinfer_core::{dequantize_row, ensure, quantize_row, DType, Result};

/// The format `dtype`'s rows take on a device: Q8_0 for the decoded formats, else `dtype`.
pub const fn device_dtype(dtype: DType) -> DType {
    match is_converted(dtype) {
        true => DType::Q8_0,
        false => dtype,
    }
}

/// Whether `dtype`'s rows are converted at upload (the decoded formats).
pub const fn is_converted(dtype: DType) -> bool {
    dtype.is_decoded()
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
    if dtype == DType::IQ1_M {
        return Ok(Cow::Owned(requantized_q8_0(dtype, cols, rows)?));
    }
    let n_blocks = rows.len() / dtype.block_bytes();
    let sub = dtype.block_size() / 32;
    let mut out = vec![0u8; n_blocks * sub * 34];
    let (mut d, mut q) = ([0f32; 8], [0i8; 256]);
    for (b, o) in rows
        .chunks_exact(dtype.block_bytes())
        .zip(out.chunks_exact_mut(34 * sub))
    {
        unpack_table(dtype, b, &mut d, &mut q);
        for (s, blk) in o.chunks_exact_mut(34).enumerate() {
            let vals = &q[32 * s..32 * s + 32];
            let (scale, shift) = match dtype {
                DType::MXFP4 => mxfp4_scale(d[0]),
                _ => (f16::from_f32(d[s].clamp(-F16_MAX, F16_MAX)), 0),
            };
            blk[..2].copy_from_slice(&scale.to_le_bytes());
            for (qo, &v) in blk[2..].iter_mut().zip(vals) {
                *qo = (((v as i32) << shift).clamp(-127, 127) as i8) as u8;
            }
        }
    }
    Ok(Cow::Owned(out))
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
        for dtype in [&DType::TABLE[..], &DType::TERNARY, &DType::LATTICE].concat() {
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
