//! Matvecs of a few tokens over shared weight reads (speculative verification): each token's
//! outputs are bit-identical to [`matvec_many`](super::matvec::matvec_many) of that token
//! alone, so a model decoding several drafted tokens in one pass gives exactly the logits of
//! one-token decode steps. The rows are split as the matvec splits them, and each task walks its
//! rows in slices small enough to stay in the core's cache while every token is dotted with
//! them: the weights come from memory once, the tokens' products from cache.
//!
//! Exactness rests on the row kernels' arithmetic being per row (a row's dot does not depend on
//! which rows share its call), which the matvec already relies on for its chunking and which
//! the tests below check on every format and level.

use crate::check;
use crate::dispatch::Tokens;
use crate::ops::matvec::RowSplit;
use crate::simd::{self, Level};
use powerinfer_core::{DType, Result, Weight};
use rayon::prelude::*;

/// Weight bytes of one slice a task dots with every token before moving on (well inside a
/// core's L2 with the tokens' prepared activations beside it).
const SLICE_BYTES: usize = 48 * 1024;
/// Slices are whole groups of this many rows (the kernels' row groups).
const SLICE_ALIGN: usize = 8;

/// `ys[i][t·rows_i + r] = dot(ws[i] row r, x token t)` for `n` tokens (x is n rows of the
/// weights' common column count), each token's values bit-identical to
/// [`matvec_many`](super::matvec::matvec_many) over that token alone.
pub fn matvec_tokens(ws: &[&Weight], x: &[f32], n: usize, ys: &mut [&mut [f32]]) -> Result<()> {
    matvec_tokens_at(simd::level(), ws, x, n, ys)
}

/// One unit of parallel work: some consecutive rows of one weight and those rows' outputs of
/// every token.
struct Task<'a> {
    dtype: DType,
    row_bytes: usize,
    rows: &'a [u8],
    outs: Vec<&'a mut [f32]>,
}

/// [`matvec_tokens`] on a given SIMD level.
pub(crate) fn matvec_tokens_at(
    level: Level,
    ws: &[&Weight],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    check::len("matvec_tokens", "ys", ys.len(), ws.len(), "one per weight")?;
    if n == 0 || ws.is_empty() {
        return Ok(());
    }
    let cols = ws[0].cols;
    check::len("matvec_tokens", "x", x.len(), n * cols, "tokens x cols")?;
    for (w, y) in ws.iter().zip(ys.iter()) {
        check::len(
            "matvec_tokens",
            "cols",
            w.cols,
            cols,
            "the first weight's cols",
        )?;
        check::len("matvec_tokens", "y", y.len(), n * w.rows, "tokens x rows")?;
        check::weight_bytes(w)?;
    }
    // The matvec's split (the same rows per task): not needed for exactness, kept for the
    // same cache behaviour per token.
    let split = RowSplit::new(ws);
    let mut tasks = Vec::new();
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let row_bytes = w.dtype.row_bytes(w.cols)?;
        let per = split.rows_per_task(w, row_bytes);
        let mut per_token: Vec<_> = y
            .chunks_mut(w.rows.max(1))
            .map(|t| t.chunks_mut(per))
            .collect();
        for i in 0..w.rows.div_ceil(per) {
            let outs: Vec<&mut [f32]> = per_token.iter_mut().filter_map(|c| c.next()).collect();
            let start = i * per * row_bytes;
            let len = outs[0].len();
            tasks.push(Task {
                dtype: w.dtype,
                row_bytes,
                rows: &w.bytes()[start..start + len * row_bytes],
                outs,
            });
        }
    }
    let quantized = ws.iter().any(|w| w.dtype.is_quantized());
    let tokens = Tokens::new(level, x, cols, quantized);
    let run = |t: Task<'_>| {
        let slice = (SLICE_BYTES / t.row_bytes.max(1)).next_multiple_of(SLICE_ALIGN);
        let mut outs = t.outs;
        for (s, rows) in t.rows.chunks(slice * t.row_bytes).enumerate() {
            let (r0, len) = (s * slice, rows.len() / t.row_bytes.max(1));
            let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|o| &mut o[r0..r0 + len]).collect();
            tokens.rows_dot(t.dtype, rows, t.row_bytes, &mut o);
        }
    };
    if tasks.len() <= 1 {
        tasks.into_iter().for_each(run);
    } else {
        tasks.into_par_iter().for_each(run);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matvec::matvec_many_at;
    use crate::simd::available;
    use crate::testutil::{qcols, random_weight, Rng};

    /// Every format, every level, odd shapes, one to seven tokens, several pool sizes: each
    /// token's outputs equal the one-token matvec's bit for bit (and zero rows, zero tokens).
    #[test]
    fn every_token_equals_its_own_matvec_bit_for_bit() {
        let mut rng = Rng::new(61);
        for threads in [1, 3] {
            let pool = crate::testutil::pool(threads);
            for level in available() {
                for dtype in DType::ALL {
                    for &(rows, cols, n) in &[(1, 64, 1), (37, 96, 3), (301, 32 * 7, 7), (9, 32, 2)]
                    {
                        let cols = match dtype.is_quantized() {
                            true => qcols(dtype, cols),
                            false => cols - 1,
                        };
                        // A second weight of another format shares the parallel region.
                        let mut ws = vec![random_weight(&mut rng, dtype, rows, cols)];
                        if dtype.is_quantized() {
                            ws.push(random_weight(&mut rng, DType::Q8_0, 2 * rows + 5, cols));
                        }
                        let mut x = rng.vec(n * cols);
                        x[cols / 2] *= 100.0; // an outlier, as real activations have
                        let refs: Vec<&Weight> = ws.iter().collect();
                        let mut got: Vec<Vec<f32>> =
                            refs.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                        let mut ys: Vec<&mut [f32]> =
                            got.iter_mut().map(|v| v.as_mut_slice()).collect();
                        pool.install(|| matvec_tokens_at(level, &refs, &x, n, &mut ys))
                            .unwrap();
                        for (t, xt) in x.chunks_exact(cols).enumerate() {
                            let mut one: Vec<Vec<f32>> =
                                refs.iter().map(|w| vec![0.0; w.rows]).collect();
                            let mut ys: Vec<&mut [f32]> =
                                one.iter_mut().map(|v| v.as_mut_slice()).collect();
                            pool.install(|| matvec_many_at(level, &refs, xt, &mut ys))
                                .unwrap();
                            for ((w, g), o) in refs.iter().zip(&got).zip(&one) {
                                let g = &g[t * w.rows..(t + 1) * w.rows];
                                let same = g.iter().zip(o).all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(same, "{dtype:?} {level:?} {rows}x{cols} token {t}/{n}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn shapes_are_checked() {
        let mut rng = Rng::new(62);
        let w = random_weight(&mut rng, DType::Q4_0, 8, 64);
        let x = rng.vec(2 * 64);
        let mut y = [0.0; 15];
        let err = matvec_tokens(&[&w], &x, 2, &mut [&mut y[..]]).unwrap_err();
        assert!(matches!(err, powerinfer_core::Error::Shape(_)));
        let mut y = [0.0; 16];
        assert!(matvec_tokens(&[&w], &x[..100], 2, &mut [&mut y[..]]).is_err());
        assert!(matvec_tokens(&[&w], &x, 2, &mut []).is_err());
        assert!(matvec_tokens(&[&w], &x, 0, &mut [&mut y[..]]).is_ok());
    }
}
