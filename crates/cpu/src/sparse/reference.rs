//! Scalar references for the sparse kernels: one neuron at a time, every sum in f64, rows
//! decoded by [`crate::reference`]. Same shape checks and the same zero-coefficient rule as the
//! fast paths (a neuron whose coefficient is exactly 0 contributes nothing).

use crate::reference::{dequantize_row, dot_row_f64};
use powerinfer_core::{ensure, Activation, Result, Weight};

/// Reference [`crate::matvec_rows`]: y[k] = dot(W[idx[k]], x).
pub fn matvec_rows(w: &Weight, x: &[f32], idx: &[u32], y: &mut [f32]) -> Result<()> {
    ensure!(
        x.len() == w.cols && y.len() == idx.len(),
        Shape,
        "matvec_rows: x {} / cols {}, y {} / idx {}",
        x.len(),
        w.cols,
        y.len(),
        idx.len()
    );
    check(w, idx)?;
    for (out, &i) in y.iter_mut().zip(idx) {
        *out = dot_row_f64(w.dtype, row(w, i), x) as f32;
    }
    Ok(())
}

/// Reference [`crate::axpy_rows`]: y += Σ_k a[k] · W[idx[k]], summed in f64 per column.
pub fn axpy_rows(w: &Weight, idx: &[u32], a: &[f32], y: &mut [f32]) -> Result<()> {
    ensure!(
        y.len() == w.cols && a.len() == idx.len(),
        Shape,
        "axpy_rows: y {} / cols {}, a {} / idx {}",
        y.len(),
        w.cols,
        a.len(),
        idx.len()
    );
    check(w, idx)?;
    let mut acc: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    for (&i, &ak) in idx.iter().zip(a) {
        add_row(w, i, ak as f64, &mut acc)?;
    }
    store(&acc, y);
    Ok(())
}

/// Reference [`crate::ffn_up_down_sparse`]: y = Σ_k g[k]·dot(up[i], x) · down_t[i], i = idx[k].
pub fn ffn_up_down_sparse(
    up: &Weight,
    down_t: &Weight,
    x: &[f32],
    idx: &[u32],
    g: &[f32],
    y: &mut [f32],
) -> Result<()> {
    check_ffn(&[up, down_t], x, y, idx)?;
    ensure!(
        g.len() == idx.len(),
        Shape,
        "ffn: g {} / idx {}",
        g.len(),
        idx.len()
    );
    let mut acc = vec![0f64; y.len()];
    for (&i, &gk) in idx.iter().zip(g) {
        if gk == 0.0 {
            continue;
        }
        let h = gk as f64 * dot_row_f64(up.dtype, row(up, i), x);
        add_row(down_t, i, h, &mut acc)?;
    }
    store(&acc, y);
    Ok(())
}

/// Reference [`crate::ffn_gate_up_down_sparse`]:
/// y = Σ_k act(dot(gate[i], x)) · dot(up[i], x) · down_t[i], i = idx[k].
pub fn ffn_gate_up_down_sparse(
    gate: &Weight,
    up: &Weight,
    down_t: &Weight,
    act: Activation,
    x: &[f32],
    idx: &[u32],
    y: &mut [f32],
) -> Result<()> {
    check_ffn(&[gate, up, down_t], x, y, idx)?;
    let mut acc = vec![0f64; y.len()];
    for &i in idx {
        let gk = act.apply(dot_row_f64(gate.dtype, row(gate, i), x) as f32);
        if gk == 0.0 {
            continue;
        }
        let h = gk as f64 * dot_row_f64(up.dtype, row(up, i), x);
        add_row(down_t, i, h, &mut acc)?;
    }
    store(&acc, y);
    Ok(())
}

/// acc += a · W[i] in f64.
fn add_row(w: &Weight, i: u32, a: f64, acc: &mut [f64]) -> Result<()> {
    if a == 0.0 {
        return Ok(());
    }
    let mut wr = vec![0f32; w.cols];
    dequantize_row(w.dtype, row(w, i), &mut wr)?;
    for (s, &v) in acc.iter_mut().zip(&wr) {
        *s += a * v as f64;
    }
    Ok(())
}

/// y = acc rounded to f32.
fn store(acc: &[f64], y: &mut [f32]) {
    for (o, &s) in y.iter_mut().zip(acc) {
        *o = s as f32;
    }
}

/// Row `i` of `w` (in range per [`check`]).
fn row(w: &Weight, i: u32) -> &[u8] {
    let rb = w.dtype.row_bytes(w.cols).unwrap_or(0);
    &w.bytes()[i as usize * rb..][..rb]
}

/// Error unless the weight's bytes fit its shape and every index is one of its rows.
fn check(w: &Weight, idx: &[u32]) -> Result<()> {
    crate::check_weight_bytes(w)?;
    ensure!(
        idx.iter().all(|&i| (i as usize) < w.rows),
        Shape,
        "index out of range for {} rows",
        w.rows
    );
    Ok(())
}

/// All weights `[ffn, dim]` with one ffn; x and y of dim; indices in range.
fn check_ffn(ws: &[&Weight], x: &[f32], y: &[f32], idx: &[u32]) -> Result<()> {
    for w in ws {
        check(w, idx)?;
        ensure!(
            w.rows == ws[0].rows && w.cols == x.len() && y.len() == x.len(),
            Shape,
            "ffn: weight {} x {}, ffn {}, x {}, y {}",
            w.rows,
            w.cols,
            ws[0].rows,
            x.len(),
            y.len()
        );
    }
    Ok(())
}
