//! Scalar references for the sparse kernels: one neuron at a time, every sum in f64, rows
//! decoded by [`crate::reference`]. Same shape checks and the same zero-coefficient rule as the
//! fast paths (a neuron whose coefficient is exactly 0 contributes nothing). The FFN reference
//! is what a predictor-mode FFN computes from the sparse ops (and what the GPU's fused kernel
//! is tested against).

use crate::check::{self, Rows};
use crate::reference::{dequantize_row, dot_row_f64};
use powerinfer_core::{ensure, Activation, Result, Weight};

/// Reference [`crate::matvec_rows`]: y[k] = dot(W[idx[k]], x).
pub fn matvec_rows(w: &Weight, x: &[f32], idx: &[u32], y: &mut [f32]) -> Result<()> {
    check::len("matvec_rows", "x", x.len(), w.cols, "the weight's cols")?;
    check::len("matvec_rows", "y", y.len(), idx.len(), "one per index")?;
    let rows = Rows::new(w, idx, "matvec_rows")?;
    for (out, &i) in y.iter_mut().zip(idx) {
        *out = dot_row_f64(w.dtype, rows.get(i), x) as f32;
    }
    Ok(())
}

/// Reference [`crate::axpy_rows`]: y += Σ_k a[k] · W[idx[k]], summed in f64 per column.
pub fn axpy_rows(w: &Weight, idx: &[u32], a: &[f32], y: &mut [f32]) -> Result<()> {
    check::len("axpy_rows", "y", y.len(), w.cols, "the weight's cols")?;
    check::len("axpy_rows", "a", a.len(), idx.len(), "one per index")?;
    let rows = Rows::new(w, idx, "axpy_rows")?;
    let mut acc: Vec<f64> = y.iter().map(|&v| v as f64).collect();
    for (&i, &ak) in idx.iter().zip(a) {
        add_row(w, &rows, i, ak as f64, &mut acc)?;
    }
    store(&acc, y);
    Ok(())
}

/// Reference sparse FFN (predictor mode: [`crate::matvec_rows`] over gate and up, then
/// [`crate::axpy_rows`] over down_t; the GPU's fused kernel):
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
    let [gates, ups, downs] = check_ffn([gate, up, down_t], x, y, idx)?;
    let mut acc = vec![0f64; y.len()];
    for &i in idx {
        let gk = act.apply(dot_row_f64(gate.dtype, gates.get(i), x) as f32);
        if gk == 0.0 {
            continue;
        }
        let h = gk as f64 * dot_row_f64(up.dtype, ups.get(i), x);
        add_row(down_t, &downs, i, h, &mut acc)?;
    }
    store(&acc, y);
    Ok(())
}

/// acc += a · W[i] in f64 (`rows`: W's rows).
fn add_row(w: &Weight, rows: &Rows<'_>, i: u32, a: f64, acc: &mut [f64]) -> Result<()> {
    if a == 0.0 {
        return Ok(());
    }
    let mut wr = vec![0f32; w.cols];
    dequantize_row(w.dtype, rows.get(i), &mut wr)?;
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

/// All weights `[ffn, dim]` with one ffn; x and y of dim; indices in range: their rows.
fn check_ffn<'a>(ws: [&'a Weight; 3], x: &[f32], y: &[f32], idx: &[u32]) -> Result<[Rows<'a>; 3]> {
    let ffn = "ffn_gate_up_down_sparse";
    check::len(ffn, "y", y.len(), x.len(), "one per value of x")?;
    for w in ws {
        ensure!(
            w.rows == ws[0].rows && w.cols == x.len(),
            Shape,
            "{ffn}: weight of {} x {} does not fit ffn {} and x of {}",
            w.rows,
            w.cols,
            ws[0].rows,
            x.len()
        );
    }
    let [g, u, d] = ws.map(|w| Rows::new(w, idx, ffn));
    Ok([g?, u?, d?])
}
