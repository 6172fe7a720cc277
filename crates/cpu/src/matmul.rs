//! Batched product for prompt prefill: each parallel chunk of weight rows is dequantised a few
//! rows at a time into an f32 tile, and every token is multiplied against that tile, so each
//! weight row is decoded once per call rather than once per token.

use crate::dispatch;
use crate::simd::{self, Level};
use powerinfer_core::{ensure, Result, Weight};
use rayon::prelude::*;

/// Weight rows dequantised together into one f32 tile.
pub(crate) const TILE_ROWS: usize = 8;
/// Smallest number of multiply-adds worth a rayon task.
const MIN_TASK_FLOPS: usize = 1 << 20;

/// y[t·rows + r] = dot(W[r], x[t]) for n tokens; x is n rows of `w.cols`, y n rows of `w.rows`.
pub fn matmul(w: &Weight, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    matmul_at(simd::level(), w, x, n, y)
}

/// [`matmul`] on a given SIMD level.
pub(crate) fn matmul_at(
    level: Level,
    w: &Weight,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
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
    crate::check_weight_bytes(w)?;
    if n == 0 || w.rows == 0 {
        return Ok(());
    }
    if n == 1 {
        return crate::matvec::matvec_at(level, w, x, y);
    }
    let row_bytes = w.dtype.row_bytes(w.cols)?;
    let threads = rayon::current_num_threads();
    let flops_per_row = (n * w.cols).max(1);
    let max_tasks = (w.rows * flops_per_row / MIN_TASK_FLOPS).clamp(1, threads * 4);
    let per_task = w.rows.div_ceil(max_tasks).next_multiple_of(TILE_ROWS);
    let starts: Vec<usize> = (0..w.rows).step_by(per_task).collect();
    let run = |&start: &usize| {
        let end = (start + per_task).min(w.rows);
        let mut out = vec![0f32; n * (end - start)];
        rows_times_tokens(level, w, row_bytes, start..end, x, n, &mut out);
        (start, end, out)
    };
    let parts: Vec<(usize, usize, Vec<f32>)> = if starts.len() == 1 {
        starts.iter().map(run).collect()
    } else {
        starts.par_iter().map(run).collect()
    };
    for (start, end, out) in parts {
        let width = end - start;
        for (t, chunk) in out.chunks_exact(width).enumerate() {
            y[t * w.rows + start..t * w.rows + end].copy_from_slice(chunk);
        }
    }
    Ok(())
}

/// out[t·len + i] = dot(W[rows.start + i], x[t]) for the rows in `rows`, tile by tile.
fn rows_times_tokens(
    level: Level,
    w: &Weight,
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let len = rows.len();
    let mut tile = vec![0f32; TILE_ROWS * cols];
    let mut tile_out = vec![0f32; TILE_ROWS * n];
    for t0 in (0..len).step_by(TILE_ROWS) {
        let r = TILE_ROWS.min(len - t0);
        for i in 0..r {
            let row = rows.start + t0 + i;
            let bytes = &w.bytes()[row * row_bytes..(row + 1) * row_bytes];
            dispatch::dequantize_row(level, w.dtype, bytes, &mut tile[i * cols..(i + 1) * cols]);
        }
        dispatch::tile_dot(level, &tile[..r * cols], cols, x, &mut tile_out[..r * n]);
        for t in 0..n {
            out[t * len + t0..t * len + t0 + r].copy_from_slice(&tile_out[t * r..(t + 1) * r]);
        }
    }
}
