//! The row kernels of `sparse_matvec.cu`: a matvec over chosen rows of a matrix, and the hot
//! neurons' fused gate/up pass over their slabs.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight, HotFfn, Launch};
use crate::layout::Act;

/// Error unless the rows a launch reads exist: `n` indices when `idx` is given (their values
/// are the caller's to keep in range), else rows 0..n of `rows`.
pub(crate) fn check_rows<B: Backend>(
    rows: usize,
    idx: Option<&B::Buf<i32>>,
    n: usize,
    what: &str,
) -> Result<()> {
    match idx {
        Some(i) => ensure!(
            i.len() >= n,
            Shape,
            "{what}: {} indices for {n} rows",
            i.len()
        ),
        None => ensure!(n <= rows, Shape, "{what}: {n} of {rows} rows"),
    }
    Ok(())
}

/// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k. The indices must be
/// rows of `w` (the kernel does not check them). A dense matvec is `idx = None, n = rows`.
pub(crate) fn matvec_rows<B: Backend>(
    dev: &B,
    w: &DeviceWeight<B>,
    x: &B::Buf<f32>,
    idx: Option<&B::Buf<i32>>,
    n: usize,
    act: Act,
    y: &mut B::Buf<f32>,
) -> Result<()> {
    ensure!(
        x.len() == w.cols,
        Shape,
        "matvec_rows: x {} for {} cols",
        x.len(),
        w.cols
    );
    ensure!(
        y.len() >= n,
        Shape,
        "matvec_rows: y {} for {n} rows",
        y.len()
    );
    check_rows::<B>(w.rows, idx, n, "matvec_rows")?;
    if n == 0 {
        return Ok(());
    }
    let launch = Launch::SparseMatvec {
        dtype: w.dtype,
        w: &w.data,
        l: w.layout,
        x,
        cols: w.cols,
        idx,
        n,
        ids: None,
        flags: None,
        act,
        y,
    };
    dev.launch(launch, Checked(()))
}

/// The hot neurons' gate/up pass: `h[r] = act(dot(gate[r], x)) · dot(up[r], x)` for every hot
/// slot r in 0..n_hot; with `flags` (one i32 per FFN neuron, nonzero = active) an inactive
/// neuron's rows are not read and h[r] = 0.
pub(crate) fn hot_gate_up<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    x: &B::Buf<f32>,
    flags: Option<&B::Buf<i32>>,
    act: Act,
    h: &mut B::Buf<f32>,
) -> Result<()> {
    let l = &ffn.layout;
    ensure!(
        x.len() == l.dim,
        Shape,
        "hot_gate_up: x {} for dim {}",
        x.len(),
        l.dim
    );
    ensure!(
        h.len() >= l.n_hot,
        Shape,
        "hot_gate_up: h {} for {} hot",
        h.len(),
        l.n_hot
    );
    ensure!(
        l.gate_dtype == l.up_dtype,
        Unsupported,
        "hot_gate_up: gate {} and up {} differ",
        l.gate_dtype,
        l.up_dtype
    );
    if l.n_hot == 0 {
        return Ok(());
    }
    let launch = Launch::GateUp {
        dtype: l.gate_dtype,
        w: &ffn.data,
        gate_l: l.gate,
        up_l: l.up,
        x,
        cols: l.dim,
        idx: None,
        n: l.n_hot,
        ids_l: l.ids,
        flags,
        act,
        h,
    };
    dev.launch(launch, Checked(()))
}
