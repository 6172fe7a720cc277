//! The row family (`kernels/sparse_matvec.cu`): a matvec over chosen rows of a matrix, the
//! hot neurons' fused gate/up pass over their slabs, and x quantized for the integer dots,
//! checked ([`RowOps`]), launched ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight, HotFfn};
use crate::layout::{xq_bytes, Act, FfnAct};
use crate::ops::compact::Compacted;

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

pub use launch::XArg;
use launch::{GateUp, QuantizeX, SparseMatvec};

/// The input vector of the row operations: its floats, and for weights in a quantized format
/// the same vector quantized by [`RowOps::quantize_x`] since the
/// floats last changed (the operations cannot tell a stale copy: the caller keeps them in step).
pub struct XIn<'a, B: Backend> {
    /// The values.
    pub x: &'a B::Buf<f32>,
    /// The values quantized, when a quantized weight reads them.
    pub q: Option<&'a B::Buf<u8>>,
}

impl<B: Backend> Clone for XIn<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backend> Copy for XIn<'_, B> {}

impl<'a, B: Backend> XIn<'a, B> {
    /// Floats only (for weights in a float format).
    pub fn floats(x: &'a B::Buf<f32>) -> Self {
        XIn { x, q: None }
    }

    /// The floats and their quantized copy.
    pub fn quantized(x: &'a B::Buf<f32>, q: &'a B::Buf<u8>) -> Self {
        XIn { x, q: Some(q) }
    }

    /// What the row kernels of `dtype` over `cols` columns read, checked: `cols` floats, and
    /// for a quantized format the quantized copy.
    pub(crate) fn arg(&self, dtype: DType, cols: usize, what: &str) -> Result<XArg<'a, B>> {
        ensure!(
            self.x.len() == cols,
            Shape,
            "{what}: x {} for {cols} cols",
            self.x.len()
        );
        if !dtype.is_quantized() {
            return Ok(XArg::F32(self.x));
        }
        let Some(q) = self.q else {
            powerinfer_core::bail!(
                Shape,
                "{what}: {dtype} weights read x quantized (quantize_x), none given"
            );
        };
        ensure!(
            q.len() >= xq_bytes(cols),
            Shape,
            "{what}: quantized x of {} bytes for {cols} cols ({} needed)",
            q.len(),
            xq_bytes(cols)
        );
        Ok(XArg::Quant(q))
    }
}

/// Error unless the rows a launch reads exist: `n` indices when `idx` is given (their values
/// are the caller's to keep in range), else rows 0..n of `rows`.
fn check_rows<B: Backend>(
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

/// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k (`y[k] += ...` with
/// `accumulate`). The indices must be rows of `w` (the kernel does not check them). A dense
/// matvec is `idx = None, n = rows`.
#[allow(clippy::too_many_arguments)]
fn matvec_rows<B: Backend>(
    dev: &B,
    w: &DeviceWeight<B>,
    x: XIn<'_, B>,
    idx: Option<&B::Buf<i32>>,
    n: usize,
    act: Act,
    accumulate: bool,
    y: &mut B::Buf<f32>,
) -> Result<()> {
    let x = x.arg(w.dtype, w.cols, "matvec_rows")?;
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
    let launch = SparseMatvec {
        idx,
        act,
        accumulate,
        ..SparseMatvec::rows(w.dtype, &w.data, w.layout, x, w.cols, n, y)
    };
    dev.launch(launch, Checked(()))
}

/// Which hot slots a gate/up pass computes: all (`Flags(None)`), those whose neuron's flag is
/// set, or the list compact_flags wrote (h[k] for its k-th slot).
enum Active<'a, B: Backend> {
    Flags(Option<&'a B::Buf<i32>>),
    Slots(&'a Compacted<B>),
}

/// The gate and up biases of a gate/up pass, one value per FFN neuron each (None: none).
type GateUpBias<'a, B> = [Option<&'a <B as Backend>::Buf<f32>>; 2];

fn gate_up<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    x: XIn<'_, B>,
    active: Active<'_, B>,
    act: FfnAct,
    [gate_bias, up_bias]: GateUpBias<'_, B>,
    h: &mut B::Buf<f32>,
) -> Result<()> {
    let (flags, idx, count) = match active {
        Active::Flags(f) => (f, None, None),
        Active::Slots(s) => (None, Some(&s.idx), Some(&s.count)),
    };
    let l = &ffn.layout;
    let x = x.arg(l.gate_dtype, l.dim, "hot_gate_up")?;
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
    for (b, what) in [(gate_bias, "gate"), (up_bias, "up")] {
        ensure!(
            b.is_none_or(|b| b.len() == l.ffn),
            Shape,
            "hot_gate_up: a {what} bias of {} for ffn {}",
            b.map_or(0, |b| b.len()),
            l.ffn
        );
    }
    let lim = act.swiglu_limit;
    ensure!(
        lim.is_finite() && lim >= 0.0 && (lim == 0.0 || (l.up.is_some() && !act.up_act)),
        Unsupported,
        "hot_gate_up: the clamped SwiGLU's limit {lim} (a non-negative number, over up rows, \
         without an activated up)"
    );
    ensure!(
        up_bias.is_none() || lim > 0.0,
        Unsupported,
        "hot_gate_up: an up bias without the clamped SwiGLU"
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
    let launch = GateUp {
        dtype: l.gate_dtype,
        w: &ffn.data,
        gate_l: l.gate,
        up_l: l.up,
        x,
        cols: l.dim,
        idx,
        n: l.n_hot,
        ids_l: l.ids,
        flags,
        bias: gate_bias,
        up_bias,
        act,
        count,
        h,
    };
    dev.launch(launch, Checked(()))
}

/// The row operations, checked, on any backend.
pub trait RowOps: Backend {
    /// `x` (all of it: a multiple of 32 values) quantized to the int16 blocks the row kernels of
    /// the quantized formats read, into `xq` (at least [`xq_bytes`] of x's length): once per
    /// vector, before the row operations that read it ([`XIn::quantized`]).
    fn quantize_x(&self, x: &Self::Buf<f32>, xq: &mut Self::Buf<u8>) -> Result<()> {
        let cols = x.len();
        ensure!(
            cols.is_multiple_of(32),
            Shape,
            "quantize_x: {cols} values, not whole blocks of 32"
        );
        ensure!(
            xq.len() >= xq_bytes(cols),
            Shape,
            "quantize_x: {} bytes for {cols} values ({} needed)",
            xq.len(),
            xq_bytes(cols)
        );
        if cols == 0 {
            return Ok(());
        }
        self.launch(QuantizeX { x, cols, xq }, Checked(()))
    }

    /// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k; x quantized when
    /// W is. The indices must be rows of `w` (the kernel does not check them); a dense matvec
    /// is `idx = None, n = rows`.
    fn matvec_rows(
        &self,
        w: &DeviceWeight<Self>,
        x: XIn<'_, Self>,
        idx: Option<&Self::Buf<i32>>,
        n: usize,
        act: Act,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        matvec_rows(self, w, x, idx, n, act, false, y)
    }

    /// `y[k] += dot(W[row k], x)` for k in 0..n (a dense matvec added into `y` in the same
    /// launch: the attention's output into the residual); x quantized when W is.
    fn matvec_add(
        &self,
        w: &DeviceWeight<Self>,
        x: XIn<'_, Self>,
        n: usize,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        matvec_rows(self, w, x, None, n, Act::None, true, y)
    }

    /// The hot neurons' gate/up pass, for every hot slot r in 0..n_hot: `h[r] = g · u'` with
    /// `g = act(dot(gate[r], x) + gate_bias[id])` and `u' = dot(up[r], x)` (`act(u)` with
    /// `act.up_act`, 1 for slabs without up rows), `act` with its FATReLU threshold. With
    /// `flags` (one i32 per FFN neuron, nonzero = active) an inactive neuron's rows are not
    /// read and h[r] = 0; `gate_bias` holds one value per FFN neuron (OPT's fc1 bias); x
    /// quantized when the slabs are. `Error::Unsupported` for gate and up rows in different
    /// formats, or a threshold that is negative, not a number, or given with another
    /// activation than ReLU.
    fn hot_gate_up(
        &self,
        ffn: &HotFfn<Self>,
        x: XIn<'_, Self>,
        flags: Option<&Self::Buf<i32>>,
        act: FfnAct,
        gate_bias: Option<&Self::Buf<f32>>,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        gate_up(
            self,
            ffn,
            x,
            Active::Flags(flags),
            act,
            [gate_bias, None],
            h,
        )
    }

    /// [`RowOps::hot_gate_up`] of gpt-oss's experts: with `act.swiglu_limit` > 0, `h[r] =
    /// swiglu_oai(dot(gate[r], x) + bias[0][id], dot(up[r], x) + bias[1][id], limit)`, each
    /// bias one value per FFN neuron (the flattened experts' `ffn_{gate,up}_exps.bias`).
    fn hot_gate_up_biased(
        &self,
        ffn: &HotFfn<Self>,
        x: XIn<'_, Self>,
        flags: Option<&Self::Buf<i32>>,
        act: FfnAct,
        bias: [Option<&Self::Buf<f32>>; 2],
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        gate_up(self, ffn, x, Active::Flags(flags), act, bias, h)
    }

    /// [`RowOps::hot_gate_up`] over the slots of `slots` only (`CompactOps::active_slots`):
    /// `h[k]` for the k-th of them, the entries past their count left as they are.
    fn hot_gate_up_listed(
        &self,
        ffn: &HotFfn<Self>,
        x: XIn<'_, Self>,
        slots: &Compacted<Self>,
        act: FfnAct,
        gate_bias: Option<&Self::Buf<f32>>,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        slots.check(ffn.layout.n_hot, "hot_gate_up")?;
        gate_up(
            self,
            ffn,
            x,
            Active::Slots(slots),
            act,
            [gate_bias, None],
            h,
        )
    }
}

impl<B: Backend> RowOps for B {}
