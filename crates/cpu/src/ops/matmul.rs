//! Batched product for prompt prefill: each parallel chunk of weight rows is dequantised a few
//! rows at a time into an f32 tile, and every token is multiplied against that tile, so each
//! weight row is decoded once per call rather than once per token.

use crate::check;
use crate::dispatch;
use crate::operands::matrix::MatrixRef;
use crate::simd::{self, Level};
use powerinfer_core::{ensure, Result};
use rayon::prelude::*;

/// Weight rows dequantised together into one f32 tile.
pub(crate) const TILE_ROWS: usize = 8;
/// Smallest number of multiply-adds worth a rayon task.
const MIN_TASK_FLOPS: usize = 1 << 20;

/// y[t·rows + r] = dot(W[r], x[t]) for n tokens; x is n rows of `w.cols`, y n rows of `w.rows`.
/// `w` in either layout: an interleaved matrix's rows are gathered back task by task, so its
/// values are those of the row-major weight's.
pub fn matmul<'a>(w: impl Into<MatrixRef<'a>>, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    matmul_at(simd::level(), w.into(), x, n, y)
}

/// [`matmul`] on a given SIMD level.
pub(crate) fn matmul_at(
    level: Level,
    m: MatrixRef<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    let w = Rows::of(m);
    ensure!(
        Some(x.len()) == n.checked_mul(w.cols),
        Shape,
        "matmul: x has {} values, want {n} tokens x {} cols",
        x.len(),
        w.cols
    );
    ensure!(
        Some(y.len()) == n.checked_mul(w.rows),
        Shape,
        "matmul: y has {} values, want {n} tokens x {} rows",
        y.len(),
        w.rows
    );
    if let MatrixRef::Rows(w) = m {
        check::weight_bytes(w)?;
    }
    if n == 0 || w.rows == 0 {
        return Ok(());
    }
    if n == 1 {
        return super::matrix::matvec_matrices_at(level, &[m], x, &mut [y]);
    }
    let w = &w;
    let row_bytes = w.dtype.row_bytes(w.cols)?;
    // Quantized rows on the AVX-512 level: the integer tile for the tokens it fits (each
    // token decided on its own x), the f32 tile for the rest.
    let fits: Vec<bool> = x
        .par_chunks_exact(w.cols)
        .with_min_len(16)
        .map(|t| dispatch::TileTokens::fits(level, w.dtype, t))
        .collect();
    let int_tokens = fits.iter().filter(|&&f| f).count();
    if int_tokens == n {
        return integer(level, w, row_bytes, x, n, y);
    }
    if int_tokens == 0 {
        by_tasks(w, n, TILE_ROWS, y, |rows, out| {
            rows_times_tokens(level, w, row_bytes, rows, x, n, out)
        });
        return Ok(());
    }
    // Both kinds: each set gathered, multiplied on its own, and scattered back.
    for want in [true, false] {
        let which: Vec<usize> = (0..n).filter(|&t| fits[t] == want).collect();
        let xs: Vec<f32> = which
            .iter()
            .flat_map(|&t| &x[t * w.cols..(t + 1) * w.cols])
            .copied()
            .collect();
        let (m, mut ys) = (which.len(), vec![0f32; which.len() * w.rows]);
        // Not matmul_at: one token must not take the matvec path here.
        match want {
            true => integer(level, w, row_bytes, &xs, m, &mut ys)?,
            false => by_tasks(w, m, TILE_ROWS, &mut ys, |rows, out| {
                rows_times_tokens(level, w, row_bytes, rows, &xs, m, out)
            }),
        }
        for (&t, row) in which.iter().zip(ys.chunks_exact(w.rows)) {
            y[t * w.rows..(t + 1) * w.rows].copy_from_slice(row);
        }
    }
    Ok(())
}

/// A matrix's shape and the source of its rows.
struct Rows<'a> {
    m: MatrixRef<'a>,
    dtype: powerinfer_core::DType,
    rows: usize,
    cols: usize,
}

impl<'a> Rows<'a> {
    fn of(m: MatrixRef<'a>) -> Rows<'a> {
        Rows {
            m,
            dtype: m.dtype(),
            rows: m.rows(),
            cols: m.cols(),
        }
    }
}

/// [`matmul_at`] on the integer tile (every token fits it).
fn integer(
    level: Level,
    w: &Rows<'_>,
    row_bytes: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    let xt = dispatch::TileTokens::new(level, w.dtype, x, n, w.cols);
    let xt = xt.ok_or_else(|| powerinfer_core::Error::Other("integer tile refused x".into()))?;
    let run = |rows: std::ops::Range<usize>, out: &mut [f32]| {
        let len = rows.len();
        w.m.with_rows(rows, |bytes| {
            xt.rows_times_tokens(bytes, row_bytes, len, out)
        });
    };
    by_tasks(w, n, dispatch::INT_TILE_ROWS, y, run);
    Ok(())
}

/// Split the rows into rayon tasks of whole `tile`s of rows; `run(rows, out)` fills
/// out[t·rows.len() + i] for the rows of one task, copied into y.
fn by_tasks(
    w: &Rows<'_>,
    n: usize,
    tile: usize,
    y: &mut [f32],
    run: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
) {
    let threads = rayon::current_num_threads();
    let flops_per_row = (n * w.cols).max(1);
    let max_tasks = (w.rows * flops_per_row / MIN_TASK_FLOPS).clamp(1, threads * 4);
    let per_task = w.rows.div_ceil(max_tasks).next_multiple_of(tile);
    let starts: Vec<usize> = (0..w.rows).step_by(per_task).collect();
    let task = |&start: &usize| {
        let end = (start + per_task).min(w.rows);
        let mut out = vec![0f32; n * (end - start)];
        run(start..end, &mut out);
        (start, end, out)
    };
    let parts: Vec<(usize, usize, Vec<f32>)> = if starts.len() == 1 {
        starts.iter().map(task).collect()
    } else {
        starts.par_iter().map(task).collect()
    };
    for (start, end, out) in parts {
        let width = end - start;
        for (t, chunk) in out.chunks_exact(width).enumerate() {
            y[t * w.rows + start..t * w.rows + end].copy_from_slice(chunk);
        }
    }
}

/// out[t·len + i] = dot(W[rows.start + i], x[t]) for the rows in `rows`, tile by tile.
fn rows_times_tokens(
    level: Level,
    w: &Rows<'_>,
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    w.m.with_rows(rows, |bytes| {
        tiles_times_tokens(level, w, row_bytes, bytes, x, n, out)
    })
}

/// [`rows_times_tokens`] over the rows' bytes.
fn tiles_times_tokens(
    level: Level,
    w: &Rows<'_>,
    row_bytes: usize,
    bytes: &[u8],
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let len = bytes.len() / row_bytes.max(1);
    let mut tile = vec![0f32; TILE_ROWS * cols];
    let mut tile_out = vec![0f32; TILE_ROWS * n];
    for t0 in (0..len).step_by(TILE_ROWS) {
        let r = TILE_ROWS.min(len - t0);
        for i in 0..r {
            let row = &bytes[(t0 + i) * row_bytes..(t0 + i + 1) * row_bytes];
            dispatch::dequantize_row(level, w.dtype, row, &mut tile[i * cols..(i + 1) * cols]);
        }
        dispatch::tile_dot(level, &tile[..r * cols], cols, x, &mut tile_out[..r * n]);
        for t in 0..n {
            out[t * len + t0..t * len + t0 + r].copy_from_slice(&tile_out[t * r..(t + 1) * r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matvec::matvec_at;
    use crate::reference;
    use crate::simd::available;
    use crate::testutil::{
        assert_dot_close, assert_dot_seen, is_shape, qcols, random_weight, x8_gap, Rng,
    };
    use powerinfer_core::{Buffer, DType, Weight};

    #[test]
    fn matmul_matches_per_token_matvec() {
        let pool = crate::testutil::pool(3);
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
                    let cols = if dtype.is_quantized() {
                        qcols(dtype, cols)
                    } else {
                        cols + 3
                    };
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let x = rng.vec(n * cols);
                    let mut y = vec![f32::NAN; n * rows];
                    pool.install(|| matmul_at(level, (&w).into(), &x, n, &mut y))
                        .unwrap();
                    for (t, xt) in x.chunks_exact(cols).enumerate() {
                        let mut yt = vec![0f32; rows];
                        matvec_at(level, &w, xt, &mut yt).unwrap();
                        for r in 0..rows {
                            let got = y[t * rows + r];
                            // One token is the matvec (int8 x on the x86 levels); more take
                            // the tiles, on x itself.
                            match n {
                                1 => assert_dot_seen(got, level, dtype, w.row(r), xt, "matmul"),
                                _ => assert_dot_close(got, dtype, w.row(r), xt, "matmul"),
                            }
                            let scale = reference::abs_dot_row(dtype, w.row(r), xt);
                            let gap = x8_gap(level, dtype, w.row(r), xt);
                            let tol = 2.0 * crate::testutil::DOT_REL_TOL * scale + 1e-6 + gap;
                            let diff = (got as f64 - yt[r] as f64).abs();
                            assert!(diff <= tol, "{dtype} t{t} r{r}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_tokens_products_do_not_depend_on_the_tokens_beside_it() {
        // Tokens 3 and 4 carry outliers (the integer tile refuses them on AVX-512): however
        // the five are grouped into calls of two or more, each gets the same bits.
        let mut rng = Rng::new(12);
        for dtype in [DType::Q4_K, DType::Q8_0, DType::F16] {
            let cols = qcols(dtype, 64);
            let w = random_weight(&mut rng, dtype, 37, cols);
            let mut x = rng.vec(5 * cols);
            for t in [3, 4] {
                for b in 0..cols / 32 {
                    x[t * cols + 32 * b + 5] = 900.0;
                }
            }
            for level in available() {
                let mut whole = vec![0f32; 5 * 37];
                matmul_at(level, (&w).into(), &x, 5, &mut whole).unwrap();
                for split in [2, 3] {
                    let mut parts = vec![0f32; 5 * 37];
                    let (a, b) = parts.split_at_mut(split * 37);
                    matmul_at(level, (&w).into(), &x[..split * cols], split, a).unwrap();
                    matmul_at(level, (&w).into(), &x[split * cols..], 5 - split, b).unwrap();
                    assert_eq!(whole, parts, "{level:?} {dtype} split at {split}");
                }
            }
        }
    }

    #[test]
    fn shape_errors_are_errors_not_panics() {
        let w = Weight::from_f32(3, 4, &[0.0; 12]).unwrap();
        assert!(is_shape(matmul(&w, &[0.0; 8], 3, &mut [0.0; 9])));
        assert!(is_shape(matmul(&w, &[0.0; 8], 2, &mut [0.0; 5])));
        assert!(is_shape(matmul(&w, &[0.0; 8], usize::MAX, &mut [0.0; 5])));
        // A weight whose public fields were edited to lie about its size.
        let mut bad = w.clone();
        bad.rows = 4;
        bad.data = Buffer::from_bytes(&[0u8; 3]);
        assert!(is_shape(matmul(&bad, &[0.0; 4], 1, &mut [0.0; 4])));
        // Empty shapes are fine.
        let empty = Weight::from_f32(0, 4, &[]).unwrap();
        matmul(&empty, &[0.0; 8], 2, &mut []).unwrap();
        matmul(&w, &[], 0, &mut []).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Any dtype, any valid shape, any seed: every level's matvec and matmul meet the bound.
        #[test]
        fn prop_matvec_and_matmul_match_reference(
            dtype_index in 0usize..DType::ALL.len(),
            rows in 1usize..40,
            units in 1usize..48,
            n in 1usize..6,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let dtype = DType::ALL[dtype_index];
            // Quantized: multiples of 32 columns; float formats: any count, odd ones included.
            let cols = if dtype.is_quantized() { qcols(dtype, 32 * units) } else { 3 * units + 2 };
            let mut rng = Rng::new(seed);
            let w = random_weight(&mut rng, dtype, rows, cols);
            let x = rng.vec(n * cols);
            for level in available() {
                let mut y = vec![0f32; rows];
                matvec_at(level, &w, &x[..cols], &mut y).unwrap();
                for (r, &got) in y.iter().enumerate() {
                    assert_dot_seen(got, level, dtype, w.row(r), &x[..cols], "prop matvec");
                }
                let mut ym = vec![0f32; n * rows];
                matmul_at(level, (&w).into(), &x, n, &mut ym).unwrap();
                for (t, xt) in x.chunks_exact(cols).enumerate() {
                    for r in 0..rows {
                        let got = ym[t * rows + r];
                        match n {
                            1 => assert_dot_seen(got, level, dtype, w.row(r), xt, "prop matmul"),
                            _ => assert_dot_close(got, dtype, w.row(r), xt, "prop matmul"),
                        }
                    }
                }
            }
        }
    }
}
