//! The contracts of `rms_norm`, `layer_norm` and `rope` (norm_rope.cu) on host memory, over
//! f32 rows.

use powerinfer_core::{Result, RopeFreqs};

use crate::host::view::prefix_mut;
use crate::layout::xq_bytes;
use crate::ops::rows::host::quantize_x;

/// `out = x / sqrt(mean(x²) + eps) · w` for every row of `n` values of `x` (the sum of
/// squares in f64, as the CPU engine's RMSNorm).
pub(crate) fn rms_norm(x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in o.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Every row of `w.len()` values of `x` RMS-normed in place with weight `w` (the per-head q/k
/// norm the `rope` kernel applies before rotating).
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for row in x.chunks_exact_mut(n) {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// `out = (x − mean) / sqrt(var + eps) · w + b` for every row of `w.len()` values of `x`, with
/// the biased variance, mean and variance in f64 (the CPU engine's `layer_norm`).
pub(crate) fn layer_norm(x: &[f32], [w, b]: [&[f32]; 2], eps: f32, out: &mut [f32]) {
    let n = w.len();
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let scale = 1.0 / (var + eps as f64).sqrt();
        for (((o, &v), &g), &c) in o.iter_mut().zip(xr).zip(w).zip(b) {
            *o = ((v as f64 - mean) * scale) as f32 * g + c;
        }
    }
}

/// With `xq`, every row of `n` values of a norm's `out` quantized for the integer dots as
/// `quantize_x` quantizes it, row r's blocks after row r − 1's (the norm kernels' `xq`).
pub(crate) fn quantize_rows(out: &[f32], n: usize, xq: Option<&mut [u8]>) -> Result<()> {
    let Some(xq) = xq else {
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    let per_row = xq_bytes(n);
    let need = out.len() / n * per_row;
    let xq = prefix_mut(xq, need, "xq")?;
    for (row, q) in out.chunks_exact(n).zip(xq.chunks_exact_mut(per_row)) {
        quantize_x(row, n, q)?;
    }
    Ok(())
}

/// Rotate the first `2 · freqs.pairs()` values of every head of `x` (heads of `head_dim`,
/// contiguous) in place for position `pos`: pair i turns by `pos · freqs.inv[i]` (in f64), times
/// the magnitude ([`RopeFreqs::cos_sin`]); `neox` pairs (i, i + n), else (2i, 2i + 1); the rest
/// of each head is unchanged.
pub(crate) fn rope(x: &mut [f32], head_dim: usize, pos: usize, freqs: &RopeFreqs, neox: bool) {
    let half = freqs.pairs();
    if half == 0 || head_dim == 0 {
        return;
    }
    let angles: Vec<(f32, f32)> = (0..half).map(|i| freqs.cos_sin(pos, i)).collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in angles.iter().enumerate() {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}
