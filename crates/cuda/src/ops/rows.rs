//! The row kernels of `sparse_matvec.cu`: a matvec over chosen rows of a matrix, and the hot
//! neurons' fused gate/up pass over their slabs.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight, HotFfn, Launch};
use crate::layout::{Act, FfnAct};

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

/// The hot neurons' gate/up pass, for every hot slot r in 0..n_hot: `h[r] = g · u'` with
/// `g = act(dot(gate[r], x) + gate_bias[id])` and `u' = dot(up[r], x)` (`act(u)` with
/// `act.up_act`, 1 for slabs without up rows), `act` with its FATReLU threshold. With `flags`
/// (one i32 per FFN neuron, nonzero = active) an inactive neuron's rows are not read and
/// h[r] = 0; `gate_bias` holds one value per FFN neuron. `Error::Unsupported` for gate and up
/// rows in different formats, or a threshold that is negative, not a number, or given with
/// another activation than ReLU.
pub(crate) fn hot_gate_up<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    x: &B::Buf<f32>,
    flags: Option<&B::Buf<i32>>,
    act: FfnAct,
    gate_bias: Option<&B::Buf<f32>>,
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
        flags.is_none_or(|f| f.len() >= l.ffn),
        Shape,
        "hot_gate_up: {} flags for ffn {}",
        flags.map_or(0, |f| f.len()),
        l.ffn
    );
    ensure!(
        gate_bias.is_none_or(|b| b.len() == l.ffn),
        Shape,
        "hot_gate_up: a gate bias of {} for ffn {}",
        gate_bias.map_or(0, |b| b.len()),
        l.ffn
    );
    ensure!(
        l.up_dtype.is_none_or(|u| u == l.gate_dtype),
        Unsupported,
        "hot_gate_up: gate {} and up {:?} differ",
        l.gate_dtype,
        l.up_dtype
    );
    let t = act.relu_threshold;
    ensure!(
        t.is_finite() && t >= 0.0 && (t == 0.0 || act.act == Act::Relu),
        Unsupported,
        "hot_gate_up: FATReLU threshold {t} with {:?} (a non-negative number, with ReLU only)",
        act.act
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
        bias: gate_bias,
        act,
        h,
    };
    dev.launch(launch, Checked(()))
}
