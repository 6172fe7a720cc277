//! One-row ops: a row of any format decoded to f32, and a row's dot product with x.

use crate::check;
use crate::dispatch;
use crate::simd::{self, Level};
use powerinfer_core::{DType, Result};

/// Dequantise one row's bytes (any [`DType`]) to f32; `out.len()` is the number of weights.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) -> Result<()> {
    check::row(dtype, row, out.len())?;
    dispatch::dequantize_row(simd::level(), dtype, row, out);
    Ok(())
}

/// Dot product of one row's bytes with `x`, on the dispatched fast path.
/// `row` must hold exactly `x.len()` weights (checked in debug builds).
pub fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    dot_at(simd::level(), dtype, row, x)
}

/// [`dot_row`] on the portable scalar path whatever the CPU (f32 accumulation), for tests.
pub fn dot_row_scalar(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    dot_at(Level::Scalar, dtype, row, x)
}

/// [`dot_row`] on a given SIMD level.
pub(crate) fn dot_at(level: Level, dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(check::row(dtype, row, x.len()).is_ok());
    let mut out = [0f32];
    dispatch::rows_dot(level, dtype, row, row.len(), x, &mut out);
    out[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::simd::available;
    use crate::testutil::{assert_dot_close, each_row, is_shape, qcols, random_row, Rng};

    #[test]
    fn dot_row_paths_match_reference_on_every_dtype() {
        each_row(1, |rng, dtype, cols, row| {
            let x = rng.vec(cols);
            assert_dot_close(dot_row(dtype, &row, &x), dtype, &row, &x, "dispatched");
            assert_dot_close(dot_row_scalar(dtype, &row, &x), dtype, &row, &x, "scalar");
            assert_dot_close(reference::dot_row(dtype, &row, &x), dtype, &row, &x, "ref");
            for level in available() {
                let got = dot_at(level, dtype, &row, &x);
                assert_dot_close(got, dtype, &row, &x, level.name());
            }
        });
    }

    #[test]
    fn unaligned_rows_give_the_same_dot() {
        let mut rng = Rng::new(2);
        for level in available() {
            for dtype in DType::ALL {
                let cols = if dtype.is_quantized() {
                    qcols(dtype, 96)
                } else {
                    45
                };
                let row = random_row(&mut rng, dtype, cols);
                let x = rng.vec(cols);
                let want = dot_at(level, dtype, &row, &x);
                for shift in 1..8 {
                    let mut shifted = vec![0u8; shift];
                    shifted.extend(&row);
                    let got = dot_at(level, dtype, &shifted[shift..], &x);
                    assert_eq!(got, want, "{dtype} +{shift}");
                }
            }
        }
    }

    #[test]
    fn dequantize_matches_reference() {
        each_row(3, |_, dtype, cols, row| {
            let mut want = vec![0f32; cols];
            reference::dequantize_row(dtype, &row, &mut want).unwrap();
            let mut got = vec![0f32; cols];
            dequantize_row(dtype, &row, &mut got).unwrap();
            for level in available() {
                dispatch::dequantize_row(level, dtype, &row, &mut got);
                for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                    // d·q + m may be rounded once (fma) or twice: allow a few ulps.
                    let tol = 4.0 * f32::EPSILON * w.abs().max(1e-6);
                    assert!(
                        (g - w).abs() <= tol,
                        "{level:?} {dtype} col {c}: {g} vs {w}"
                    );
                }
            }
        });
    }

    #[test]
    fn table_formats_dequantize_bit_exact_on_every_level() {
        // w = d·value is one rounding, so every level gives the core decoder's bits (the table,
        // ternary and low-bit formats).
        each_row(4, |_, dtype, cols, row| {
            if !dtype.is_decoded() && !dtype.is_lowbit() {
                return;
            }
            let mut want = vec![0f32; cols];
            powerinfer_core::dequantize_row(dtype, &row, &mut want).unwrap();
            for level in available() {
                let mut got = vec![1f32; cols];
                dispatch::dequantize_row(level, dtype, &row, &mut got);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{level:?} {dtype} cols {cols}");
            }
        });
    }

    #[test]
    fn shape_errors_are_errors_not_panics() {
        // A Q8_0 block is 32 weights; 5 bytes hold no whole number of f16s.
        assert!(is_shape(dequantize_row(
            DType::Q8_0,
            &[0; 34],
            &mut [0.0; 31]
        )));
        assert!(is_shape(dequantize_row(DType::F16, &[0; 5], &mut [0.0; 3])));
    }
}
