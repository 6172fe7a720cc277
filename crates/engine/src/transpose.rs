//! The transposed down projection (`down_t`, one contiguous row of `dim` weights per FFN neuron)
//! that the sparse FFN reads, built once from `ffn_down` (and the reverse for files that ship
//! only `ffn_down_t`, like PowerInfer's).
//!
//! Float formats transpose exactly. Block formats are decoded, transposed and re-encoded in the
//! same format (as PowerInfer's converter does), so `down_t` is a new quantization of the same
//! weights: the sparse modes of a quantized model differ from its dense mode by that rounding.
//! The ternary, low-bit and 2-bit lattice formats are the exception ([`transposed_format`]):
//! their transposes take Q8_0.
//! When the new row length is not a whole number of blocks, a K-quant's rows take the 32-weight
//! format llama.cpp substitutes in the same case (Q2_K, Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1;
//! Q6_K -> Q8_0; IQ4_XS -> IQ4_NL) where the length is a multiple of 32, and F16 otherwise.

use powerinfer_core::{quantize_row, Buffer, DType, MatrixShape, Result, Weight};
use rayon::prelude::*;

/// Rows decoded per parallel task while transposing.
const TILE: usize = 64;

/// The format [`transpose`] stores `w`'s transpose in: `w`'s own when a row of `w.rows`
/// weights is a whole number of its blocks, else the K-quant's 32-weight fallback
/// ([`k_fallback`]) when that fits, else F16.
pub fn transposed_dtype(w: impl Into<MatrixShape>) -> DType {
    let w = w.into();
    [transposed_format(w.dtype), k_fallback(w.dtype)]
        .into_iter()
        .find(|d| d.row_bytes(w.rows).is_ok())
        .unwrap_or(DType::F16)
}

/// The format a transpose of `dtype` is re-encoded in where its rows are whole blocks of it:
/// `dtype` itself, but Q8_0 for the ternary and the lattice formats. A transposed block gathers one weight from
/// each of 256 source rows, each row's block with its own scale; one ternary scale and three
/// levels cannot hold them (re-encoded ternary, exact-relu decoding of a synthetic ReLU model
/// left dense by 7% of the logits, where the other formats stay within the test's 5%); Q8_0
/// can, at 4 to 5 times the bytes. The 2-bit lattice formats (IQ2_XXS, IQ2_XS, IQ2_S) have
/// no encoder here (a lattice search under an importance matrix): Q8_0 as well.
///
/// The low-bit formats take Q8_0 too: Q1_0's and Q2_0's one scale per 128 or 64 weights as the
/// ternary ones; NVFP4 and MXFP4 re-encoded would round every weight a second time to E2M1 (a
/// further error of its own size: gpt-oss's MXFP4 experts decoded through an MXFP4 down_t
/// were 2.7e-2 of the largest logit from their dense decode on the synthetic file), where Q8_0
/// rounds it to 1/254 of its block's largest at most.
pub const fn transposed_format(dtype: DType) -> DType {
    match dtype {
        DType::TQ1_0 | DType::TQ2_0 => DType::Q8_0,
        DType::NVFP4 | DType::MXFP4 | DType::Q1_0 | DType::Q2_0 => DType::Q8_0,
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => DType::Q8_0,
        // No encoder of ours (`DType::has_encoder`); Q8_0 holds the gathered scales too.
        DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S | DType::IQ1_M => DType::Q8_0,
        other => other,
    }
}

/// The 32-weight format llama.cpp's quantizer falls back to for a K-quant tensor whose rows are
/// not whole super-blocks (the same bits or a little more); other formats map to themselves.
pub const fn k_fallback(dtype: DType) -> DType {
    match dtype {
        DType::Q2_K | DType::Q3_K => DType::Q4_0,
        DType::Q4_K => DType::Q5_0,
        DType::Q5_K => DType::Q5_1,
        DType::Q6_K => DType::Q8_0,
        DType::IQ4_XS => DType::IQ4_NL,
        other => other,
    }
}

/// Bytes of `w`'s transpose as [`transpose`] stores it.
pub fn transposed_bytes(w: impl Into<MatrixShape>) -> Result<usize> {
    let w = w.into();
    Ok(transposed_dtype(w).row_bytes(w.rows)? * w.cols)
}

/// `w` transposed: `w.cols` rows of `w.rows` weights.
pub fn transpose(w: &Weight) -> Result<Weight> {
    let mut bytes = vec![0u8; transposed_bytes(w)?];
    let dtype = transpose_into(w, &mut bytes)?;
    Weight::new(dtype, w.cols, w.rows, Buffer::from_bytes(&bytes))
}

/// Write `w`'s transpose into `out` (exactly [`transposed_bytes`] long) and return its format
/// ([`transposed_dtype`]).
pub fn transpose_into(w: &Weight, out: &mut [u8]) -> Result<DType> {
    let (rows, cols) = (w.rows, w.cols);
    let dtype = transposed_dtype(w);
    let out_row_bytes = dtype.row_bytes(rows)?;
    powerinfer_core::ensure!(
        out.len() == out_row_bytes * cols,
        Shape,
        "transpose_into: {} bytes for a {cols} x {rows} {dtype} transpose of {} bytes",
        out.len(),
        out_row_bytes * cols
    );
    // Decode everything to f32 once (column-major reads of block formats would decode each block
    // 32 times).
    let mut dense = vec![0.0f32; rows * cols];
    dense
        .par_chunks_mut(cols * TILE)
        .enumerate()
        .try_for_each(|(t, chunk)| -> Result<()> {
            for (i, row) in chunk.chunks_exact_mut(cols).enumerate() {
                powerinfer_cpu::dequantize_row(w.dtype, w.row(t * TILE + i), row)?;
            }
            Ok(())
        })?;
    out.par_chunks_mut(out_row_bytes)
        .enumerate()
        .try_for_each_init(
            || vec![0.0f32; rows],
            |col, (c, dst)| {
                for (r, v) in col.iter_mut().enumerate() {
                    *v = dense[r * cols + c];
                }
                quantize_row(dtype, col, dst)
            },
        )?;
    Ok(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::testing::quantized_weight;

    fn decoded(w: &Weight) -> Vec<f32> {
        let mut out = vec![0.0; w.rows * w.cols];
        for (r, o) in out.chunks_exact_mut(w.cols).enumerate() {
            powerinfer_cpu::dequantize_row(w.dtype, w.row(r), o).unwrap();
        }
        out
    }

    #[test]
    fn float_formats_transpose_exactly_and_twice_is_identity() {
        let (rows, cols) = (37, 70);
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 211) as f32 / 50.0 - 2.0)
            .collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let w = quantized_weight(dtype, rows, cols, &vals);
            let t = transpose(&w).unwrap();
            assert_eq!((t.rows, t.cols, t.dtype), (cols, rows, dtype));
            let (a, b) = (decoded(&w), decoded(&t));
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(a[r * cols + c], b[c * rows + r]);
                }
            }
            assert_eq!(transpose(&t).unwrap().bytes(), w.bytes());
        }
    }

    /// K-quants keep their format when `rows` (the transpose's row length) is whole
    /// super-blocks, take llama.cpp's 32-weight fallback when it is whole 32-blocks (SmolLM2's
    /// dim 576), F16 otherwise; the re-encoding stays within the formats' rounding error.
    #[test]
    fn k_quants_keep_their_format_or_take_the_fallback() {
        use DType::*;
        let cols = 256;
        let cases = [
            (Q4_K, 512, Q4_K, 0.12),
            (Q6_K, 512, Q6_K, 0.04),
            (Q4_K, 288, Q5_0, 0.12),
            (Q5_K, 288, Q5_1, 0.08),
            (Q6_K, 288, Q8_0, 0.04),
            (Q2_K, 288, Q4_0, 0.5),
            (Q3_K, 40, F16, 0.0),
            // The ternary formats' transposes in Q8_0 (`transposed_format`), rows of 512 or 288.
            (TQ1_0, 512, Q8_0, 0.02),
            (TQ2_0, 288, Q8_0, 0.02),
            (TQ2_0, 40, F16, 0.0),
            // The low-bit formats' transposes in Q8_0, rows of 288 or 512.
            (NVFP4, 288, Q8_0, 0.02),
            (Q1_0, 512, Q8_0, 0.02),
            (Q2_0, 288, Q8_0, 0.02),
        ];
        for (dtype, rows, want, tol) in cases {
            let q = powerinfer_core::testing::random_weight(dtype, rows, cols, 9);
            let t = transpose(&q).unwrap();
            assert_eq!(
                (t.dtype, t.rows, t.cols),
                (want, cols, rows),
                "{dtype} {rows}"
            );
            let (a, b) = (decoded(&q), decoded(&t));
            let (mut err, mut norm) = (0f64, 0f64);
            for r in 0..rows {
                for c in 0..cols {
                    let (x, y) = (a[r * cols + c] as f64, b[c * rows + r] as f64);
                    err += (x - y).powi(2);
                    norm += x * x;
                }
            }
            let rel = (err / norm).sqrt();
            assert!(rel <= tol + 1e-3, "{dtype} -> {want}: relative RMS {rel}");
        }
    }

    #[test]
    fn block_formats_requantize_close_and_fall_back_to_f16() {
        let (rows, cols) = (64, 96);
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 31) % 97) as f32 / 40.0 - 1.2)
            .collect();
        for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
            let q = quantized_weight(dtype, rows, cols, &vals);
            let t = transpose(&q).unwrap();
            assert_eq!(t.dtype, dtype);
            let (a, b) = (decoded(&q), decoded(&t));
            let tol = if dtype == DType::Q8_0 { 0.03 } else { 0.5 };
            for r in 0..rows {
                for c in 0..cols {
                    assert!((a[r * cols + c] - b[c * rows + r]).abs() <= tol);
                }
            }
        }
        // 40 rows are not whole Q8_0 blocks once they become columns: F16 instead.
        let odd = Weight::from_f32(40, 32, &vec![0.5; 40 * 32]).unwrap();
        let q = quantized_weight(DType::Q8_0, 40, 32, &[0.5; 40 * 32]);
        assert_eq!(transpose(&q).unwrap().dtype, DType::F16);
        assert_eq!(transposed_dtype(&q), DType::F16);
        assert_eq!(transpose(&odd).unwrap().dtype, DType::F32);
    }
}
