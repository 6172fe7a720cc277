//! Scalar reference kernels: plain loops written straight from the GGUF layout description in
//! `powerinfer_core::dtype`, accumulating in f64. They are slow and obviously correct; every fast
//! path is tested against them. [`sparse`] holds the sparse kernels' references.

pub mod sparse;
pub mod x8;
pub mod x8k;

use half::f16;
use powerinfer_core::{DType, Result, Weight};

/// Read the little-endian f16 at byte `at`.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// The `i`-th 4-bit quant (0..=15) of a Q4 block's 16 packed bytes: byte j holds q[j] in its low
/// nibble and q[j + 16] in its high nibble.
fn nibble(packed: &[u8], i: usize) -> u8 {
    if i < 16 {
        packed[i] & 0x0F
    } else {
        packed[i - 16] >> 4
    }
}

/// Dequantise one row of `dtype` bytes into `out` (one f32 per weight).
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) -> Result<()> {
    crate::check::row(dtype, row, out.len())?;
    if !DType::BASIC.contains(&dtype) {
        // The Q5 and K-quant layouts: the core's plain-loop decoder (checked against gguf-py's
        // own dequantizer in tests/test_block_formats.py).
        return powerinfer_core::dequantize_row(dtype, row, out);
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = weight_at(dtype, row, i);
    }
    Ok(())
}

/// Weight `i` of a row, decoded on its own.
fn weight_at(dtype: DType, row: &[u8], i: usize) -> f32 {
    let block = &row[i / dtype.block_size() * dtype.block_bytes()..][..dtype.block_bytes()];
    let j = i % dtype.block_size();
    match dtype {
        DType::F32 => f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        DType::F16 => f16_at(block, 0),
        DType::BF16 => f32::from_bits((u16::from_le_bytes([block[0], block[1]]) as u32) << 16),
        DType::Q8_0 => f16_at(block, 0) * (block[2 + j] as i8) as f32,
        DType::Q4_0 => f16_at(block, 0) * (nibble(&block[2..], j) as f32 - 8.0),
        DType::Q4_1 => f16_at(block, 0) * nibble(&block[4..], j) as f32 + f16_at(block, 2),
        _ => unreachable!("{dtype} is decoded by the core"),
    }
}

/// Dot product of one row with `x`, dequantising to f32 and accumulating in f64.
/// Panics when the sizes disagree (it is a test oracle).
pub fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    dot_row_f64(dtype, row, x) as f32
}

/// As [`dot_row`], returning the f64 sum itself.
pub fn dot_row_f64(dtype: DType, row: &[u8], x: &[f32]) -> f64 {
    let mut w = vec![0f32; x.len()];
    dequantize_row(dtype, row, &mut w).expect("reference::dot_row: row and x sizes disagree");
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// Sum of |w·x| over the row: the scale the tests measure rounding error against.
pub fn abs_dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f64 {
    let mut w = vec![0f32; x.len()];
    dequantize_row(dtype, row, &mut w).expect("reference::abs_dot_row: sizes disagree");
    w.iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum()
}

/// y[r] = Σ_c W[r,c]·x[c], one row at a time, in f64.
pub fn matvec(w: &Weight, x: &[f32], y: &mut [f32]) -> Result<()> {
    crate::check::matvec(w, x, y)?;
    let row_bytes = w.dtype.row_bytes(w.cols)?;
    for (r, out) in y.iter_mut().enumerate() {
        *out = dot_row(w.dtype, &w.bytes()[r * row_bytes..(r + 1) * row_bytes], x);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_bits().to_le_bytes()
    }

    #[test]
    fn q4_0_block_layout() {
        // q[j] = j % 16 in the low nibbles, q[j + 16] = 15 - j in the high nibbles.
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        dequantize_row(DType::Q4_0, &block, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], 0.5 * (j as f32 - 8.0));
            assert_eq!(out[j + 16], 0.5 * (7.0 - j as f32));
        }
    }

    #[test]
    fn q4_1_block_layout_adds_min() {
        let mut block = f16_bytes(-0.25).to_vec();
        block.extend(f16_bytes(3.0));
        block.extend((0..16u8).map(|j| 0x0F | (j << 4)));
        let mut out = [0f32; 32];
        dequantize_row(DType::Q4_1, &block, &mut out).unwrap();
        for j in 0..16 {
            assert_eq!(out[j], -0.25 * 15.0 + 3.0);
            assert_eq!(out[j + 16], -0.25 * j as f32 + 3.0);
        }
    }

    #[test]
    fn q8_0_block_is_signed() {
        let mut block = f16_bytes(2.0).to_vec();
        block.extend((0..32i8).map(|j| (j * 4 - 64) as u8));
        let mut out = [0f32; 32];
        dequantize_row(DType::Q8_0, &block, &mut out).unwrap();
        for (j, v) in out.iter().enumerate() {
            assert_eq!(*v, 2.0 * (j as f32 * 4.0 - 64.0));
        }
    }

    #[test]
    fn float_bit_patterns() {
        // BF16 0x3FC0 is 1.5; 0xC0A0 is -5.0. F16 0x3C00 is 1.0.
        let mut out = [0f32; 2];
        dequantize_row(DType::BF16, &[0xC0, 0x3F, 0xA0, 0xC0], &mut out).unwrap();
        assert_eq!(out, [1.5, -5.0]);
        dequantize_row(DType::F16, &[0x00, 0x3C, 0x00, 0xC4], &mut out).unwrap();
        assert_eq!(out, [1.0, -4.0]);
        let bytes: Vec<u8> = [0.1f32, -7.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(DType::F32, &bytes, &mut out).unwrap();
        assert_eq!(out, [0.1, -7.0]);
    }

    #[test]
    fn wrong_sizes_are_shape_errors() {
        let mut out = [0f32; 32];
        let err = dequantize_row(DType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
        assert!(matches!(err, powerinfer_core::Error::Shape(_)));
        let mut odd = [0f32; 31];
        let err = dequantize_row(DType::Q4_0, &[0u8; 18], &mut odd).unwrap_err();
        assert!(matches!(err, powerinfer_core::Error::Shape(_)));
    }
}
