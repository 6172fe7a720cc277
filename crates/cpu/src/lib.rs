//! CPU kernels of powerinfer-rs: matrix-vector and matrix-matrix products over every weight
//! format in [`DType`], parallel on the caller's rayon pool, with runtime-dispatched
//! AVX2/FMA/F16C paths and a portable scalar fallback.
//!
//! Activations stay in f32 (they are never quantized); products accumulate in f32. The
//! [`reference`] module holds plain f64 loops every fast path is tested against.
//!
//! SIMD selection happens once per process; `POWERINFER_SIMD=scalar` forces the scalar path.

mod attend;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod bandwidth;
mod dispatch;
mod matmul;
mod matvec;
pub mod reference;
mod scalar;
mod simd;
mod sparse;
#[cfg(test)]
mod testutil;

pub use attend::{attend_head, HeadCache};
pub use bandwidth::measure_read_bandwidth;
pub use matmul::matmul;
pub use matvec::{matvec, matvec_many};
pub use simd::SIMD_ENV;
pub use sparse::reference as sparse_reference;
pub use sparse::{axpy_rows, ffn_gate_up_down_sparse, ffn_up_down_sparse, matvec_rows};

use powerinfer_core::{ensure, DType, Result, Weight};

/// Dequantise one row's bytes (any [`DType`]) to f32; `out.len()` is the number of weights.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) -> Result<()> {
    check_row(dtype, row, out.len())?;
    dispatch::dequantize_row(simd::level(), dtype, row, out);
    Ok(())
}

/// Dot product of one row's bytes with `x`, on the dispatched fast path.
/// `row` must hold exactly `x.len()` weights (checked in debug builds).
pub fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(check_row(dtype, row, x.len()).is_ok());
    let mut out = [0f32];
    dispatch::rows_dot(simd::level(), dtype, row, row.len(), x, &mut out);
    out[0]
}

/// [`dot_row`] on the portable scalar path whatever the CPU (f32 accumulation), for tests.
pub fn dot_row_scalar(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    debug_assert!(check_row(dtype, row, x.len()).is_ok());
    scalar::dot_row(dtype, row, x)
}

/// The active SIMD path: `"avx2+fma+f16c"` or `"scalar"`.
pub fn simd_level() -> &'static str {
    simd::level().name()
}

/// Error unless `row` holds exactly `n` weights of `dtype`.
fn check_row(dtype: DType, row: &[u8], n: usize) -> Result<()> {
    let want = dtype.row_bytes(n)?;
    ensure!(
        row.len() == want,
        Shape,
        "{dtype} row of {n} weights needs {want} bytes, got {}",
        row.len()
    );
    Ok(())
}

/// Error unless the weight's buffer holds exactly `rows` rows of `cols` weights.
fn check_weight_bytes(w: &Weight) -> Result<()> {
    let want = w.dtype.row_bytes(w.cols)?.checked_mul(w.rows);
    ensure!(
        want == Some(w.n_bytes()),
        Shape,
        "{} weight of {} x {} needs {:?} bytes, has {}",
        w.dtype,
        w.rows,
        w.cols,
        want,
        w.n_bytes()
    );
    Ok(())
}

/// Error unless `x` has `w.cols` values, `y` has `w.rows` and the weight's bytes fit its shape.
fn check_matvec_shapes(w: &Weight, x: &[f32], y: &[f32]) -> Result<()> {
    ensure!(
        x.len() == w.cols,
        Shape,
        "matvec: x has {} values, weight has {} cols",
        x.len(),
        w.cols
    );
    ensure!(
        y.len() == w.rows,
        Shape,
        "matvec: y has {} values, weight has {} rows",
        y.len(),
        w.rows
    );
    check_weight_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::matmul_at;
    use crate::matvec::matvec_at;
    use crate::simd::{available, Level};
    use crate::testutil::{assert_dot_close, random_row, random_weight, test_cols, Rng};
    use powerinfer_core::{Buffer, Error};

    /// Dot product of one row on a given level.
    fn dot_at(level: Level, dtype: DType, row: &[u8], x: &[f32]) -> f32 {
        let mut out = [0f32];
        dispatch::rows_dot(level, dtype, row, row.len(), x, &mut out);
        out[0]
    }

    #[test]
    fn dot_row_paths_match_reference_on_every_dtype() {
        let mut rng = Rng::new(1);
        for dtype in DType::ALL {
            for &cols in test_cols(dtype) {
                let row = random_row(&mut rng, dtype, cols);
                let x = rng.vec(cols);
                assert_dot_close(dot_row(dtype, &row, &x), dtype, &row, &x, "dispatched");
                assert_dot_close(dot_row_scalar(dtype, &row, &x), dtype, &row, &x, "scalar");
                assert_dot_close(reference::dot_row(dtype, &row, &x), dtype, &row, &x, "ref");
                for level in available() {
                    let got = dot_at(level, dtype, &row, &x);
                    assert_dot_close(got, dtype, &row, &x, level.name());
                }
            }
        }
    }

    #[test]
    fn unaligned_rows_give_the_same_dot() {
        let mut rng = Rng::new(2);
        for level in available() {
            for dtype in DType::ALL {
                let cols = if dtype.is_quantized() { 96 } else { 45 };
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
        let mut rng = Rng::new(3);
        for dtype in DType::ALL {
            for &cols in test_cols(dtype) {
                let row = random_row(&mut rng, dtype, cols);
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
            }
        }
    }

    #[test]
    fn matvec_matches_reference_on_odd_shapes() {
        let mut rng = Rng::new(4);
        for level in available() {
            for dtype in DType::ALL {
                for &(rows, cols) in &[(1, 64), (3, 32), (13, 96), (37, 32 * 37), (259, 64)] {
                    let cols = if dtype.is_quantized() { cols } else { cols - 1 };
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let x = rng.vec(cols);
                    let mut y = vec![f32::NAN; rows];
                    matvec_at(level, &w, &x, &mut y).unwrap();
                    for (r, &got) in y.iter().enumerate() {
                        assert_dot_close(got, dtype, w.row(r), &x, level.name());
                    }
                }
            }
        }
    }

    #[test]
    fn matvec_meets_the_bound_with_activation_outliers() {
        // LLM activations have a few channels 100x larger than the rest; the int16 path scales x
        // per 32-block, so those blocks lose the most precision.
        let mut rng = Rng::new(7);
        for level in available() {
            for dtype in DType::ALL {
                let (rows, cols) = (67, 32 * 24);
                let w = random_weight(&mut rng, dtype, rows, cols);
                let mut x = rng.vec(cols);
                for c in (5..cols).step_by(97) {
                    x[c] *= 100.0;
                }
                x[cols - 1] = 0.0;
                let mut y = vec![0f32; rows];
                matvec_at(level, &w, &x, &mut y).unwrap();
                for (r, &got) in y.iter().enumerate() {
                    assert_dot_close(got, dtype, w.row(r), &x, "outliers");
                }
            }
        }
    }

    #[test]
    fn non_finite_activations_propagate() {
        let mut rng = Rng::new(8);
        for dtype in DType::ALL {
            let w = random_weight(&mut rng, dtype, 9, 64);
            let mut x = rng.vec(64);
            x[3] = f32::INFINITY;
            x[40] = f32::NAN;
            let mut y = vec![0f32; 9];
            matvec(&w, &x, &mut y).unwrap();
            assert!(y.iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
        }
    }

    #[test]
    fn matvec_on_many_threads_matches_reference() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(7)
            .build()
            .unwrap();
        let mut rng = Rng::new(5);
        for dtype in DType::ALL {
            // Big enough to be split into many chunks.
            let w = random_weight(&mut rng, dtype, 1001, 512);
            let x = rng.vec(512);
            let mut y = vec![0f32; 1001];
            pool.install(|| matvec(&w, &x, &mut y)).unwrap();
            for (r, &got) in y.iter().enumerate() {
                assert_dot_close(got, dtype, w.row(r), &x, "7-thread matvec");
            }
            // Chunking never changes a row's arithmetic: one thread gives identical bits.
            let mut single = vec![0f32; 1001];
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            one.install(|| matvec(&w, &x, &mut single)).unwrap();
            assert_eq!(y, single, "{dtype}");
        }
    }

    #[test]
    fn matmul_matches_per_token_matvec() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let mut rng = Rng::new(6);
        let shapes = [
            (5, 64, 2),
            (67, 96, 7),
            (130, 32 * 37, 13),
            (17, 32, 1),
            (9, 1024, 4),
        ];
        for level in available() {
            for dtype in DType::ALL {
                for &(rows, cols, n) in &shapes {
                    let cols = if dtype.is_quantized() { cols } else { cols + 3 };
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let x = rng.vec(n * cols);
                    let mut y = vec![f32::NAN; n * rows];
                    pool.install(|| matmul_at(level, &w, &x, n, &mut y))
                        .unwrap();
                    for (t, xt) in x.chunks_exact(cols).enumerate() {
                        let mut yt = vec![0f32; rows];
                        matvec_at(level, &w, xt, &mut yt).unwrap();
                        for r in 0..rows {
                            let got = y[t * rows + r];
                            assert_dot_close(got, dtype, w.row(r), xt, "matmul");
                            let scale = reference::abs_dot_row(dtype, w.row(r), xt) as f32;
                            let tol = 2.0 * crate::testutil::DOT_REL_TOL as f32 * scale + 1e-6;
                            assert!((got - yt[r]).abs() <= tol, "{dtype} t{t} r{r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn shape_errors_are_errors_not_panics() {
        let w = Weight::from_f32(3, 4, &[0.0; 12]).unwrap();
        let is_shape = |r: Result<()>| matches!(r, Err(Error::Shape(_)));
        assert!(is_shape(matvec(&w, &[0.0; 3], &mut [0.0; 3])));
        assert!(is_shape(matvec(&w, &[0.0; 4], &mut [0.0; 2])));
        assert!(is_shape(matmul(&w, &[0.0; 8], 3, &mut [0.0; 9])));
        assert!(is_shape(matmul(&w, &[0.0; 8], 2, &mut [0.0; 5])));
        assert!(is_shape(matmul(&w, &[0.0; 8], usize::MAX, &mut [0.0; 5])));
        assert!(is_shape(dequantize_row(
            DType::Q8_0,
            &[0u8; 34],
            &mut [0.0; 31]
        )));
        assert!(is_shape(dequantize_row(
            DType::F16,
            &[0u8; 5],
            &mut [0.0; 3]
        )));
        assert!(is_shape(reference::matvec(&w, &[0.0; 5], &mut [0.0; 3])));
        // A weight whose public fields were edited to lie about its size.
        let mut bad = w.clone();
        bad.rows = 4;
        assert!(is_shape(matvec(&bad, &[0.0; 4], &mut [0.0; 4])));
        bad.data = Buffer::from_bytes(&[0u8; 3]);
        assert!(is_shape(matmul(&bad, &[0.0; 4], 1, &mut [0.0; 4])));
        // Empty shapes are fine.
        let empty = Weight::from_f32(0, 4, &[]).unwrap();
        matvec(&empty, &[0.0; 4], &mut []).unwrap();
        matmul(&empty, &[0.0; 8], 2, &mut []).unwrap();
        let mut y = [1.0f32; 3];
        matmul(&w, &[], 0, &mut []).unwrap();
        matvec(&Weight::from_f32(3, 0, &[]).unwrap(), &[], &mut y).unwrap();
        assert_eq!(y, [0.0; 3]);
    }

    #[test]
    fn simd_level_is_named() {
        assert!(["avx2+fma+f16c", "scalar"].contains(&simd_level()));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Any dtype, any valid shape, any seed: every level's matvec and matmul meet the bound.
        #[test]
        fn prop_matvec_and_matmul_match_reference(
            dtype_index in 0usize..6,
            rows in 1usize..40,
            units in 1usize..48,
            n in 1usize..6,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let dtype = DType::ALL[dtype_index];
            // Quantized: multiples of 32 columns; float formats: any count, odd ones included.
            let cols = if dtype.is_quantized() { 32 * units } else { 3 * units + 2 };
            let mut rng = Rng::new(seed);
            let w = random_weight(&mut rng, dtype, rows, cols);
            let x = rng.vec(n * cols);
            for level in available() {
                let mut y = vec![0f32; rows];
                matvec_at(level, &w, &x[..cols], &mut y).unwrap();
                for (r, &got) in y.iter().enumerate() {
                    assert_dot_close(got, dtype, w.row(r), &x[..cols], "prop matvec");
                }
                let mut ym = vec![0f32; n * rows];
                matmul_at(level, &w, &x, n, &mut ym).unwrap();
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    for r in 0..rows {
                        assert_dot_close(ym[t * rows + r], dtype, w.row(r), xt, "prop matmul");
                    }
                }
            }
        }
    }
}
