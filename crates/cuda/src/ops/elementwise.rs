//! The kernels of `elementwise.cu`: residual adds, the threshold mask, the logits' soft-cap,
//! copies, and a mixture of experts' routing on the hot neurons.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn, Launch};

/// `y[i] += x[i]`.
pub(crate) fn add<B: Backend>(dev: &B, y: &mut B::Buf<f32>, x: &B::Buf<f32>) -> Result<()> {
    ensure!(
        y.len() == x.len(),
        Shape,
        "add: {} and {}",
        y.len(),
        x.len()
    );
    let n = y.len();
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::Add { y, x, n }, Checked(()))
}

/// `h[i] = 0` where `|h[i]| < t`, for i in 0..n (the first n values of `h`).
pub(crate) fn threshold_mask<B: Backend>(
    dev: &B,
    h: &mut B::Buf<f32>,
    n: usize,
    t: f32,
) -> Result<()> {
    ensure!(
        n <= h.len(),
        Shape,
        "threshold_mask: {n} values of a buffer of {}",
        h.len()
    );
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::ThresholdMask { h, n, t }, Checked(()))
}

/// `y[i] = cap · tanh(y[i] / cap)` for i in 0..n; `Error::Unsupported` unless `cap` is a
/// positive number.
pub(crate) fn softcap<B: Backend>(dev: &B, y: &mut B::Buf<f32>, n: usize, cap: f32) -> Result<()> {
    ensure!(
        n <= y.len(),
        Shape,
        "softcap: {n} values of a buffer of {}",
        y.len()
    );
    ensure!(
        cap > 0.0 && cap.is_finite(),
        Unsupported,
        "softcap: the cap {cap} must be a positive number"
    );
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::Softcap { y, n, cap }, Checked(()))
}

/// `y[i] = v` for every value of `y`.
pub(crate) fn fill<B: Backend>(dev: &B, y: &mut B::Buf<f32>, v: f32) -> Result<()> {
    let n = y.len();
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::Fill { y, n, v }, Checked(()))
}

/// `dst[i] = src[i]` for i < `src.len()`; `dst` at least as long.
pub(crate) fn copy<B: Backend>(dev: &B, dst: &mut B::Buf<f32>, src: &B::Buf<f32>) -> Result<()> {
    let n = src.len();
    ensure!(
        n <= dst.len(),
        Shape,
        "copy: {n} values into a buffer of {}",
        dst.len()
    );
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::Copy { dst, src, n }, Checked(()))
}

/// The experts `w` describes (`n_expert + 1` weights) for a space of `routed` routed neurons in
/// experts of `expert_ffn`; `Error::Shape` when they do not fit.
fn n_expert_of(w_len: usize, expert_ffn: usize, routed: usize) -> Result<usize> {
    ensure!(
        w_len >= 2 && expert_ffn > 0 && routed == (w_len - 1) * expert_ffn,
        Shape,
        "experts: {w_len} weights (experts + shared) for {routed} routed neurons in experts of \
         {expert_ffn}"
    );
    Ok(w_len - 1)
}

/// `flags[j] = (w[e(j)] != 0)` over all of `flags` (see `GpuOps::expert_flags`).
pub(crate) fn expert_flags<B: Backend>(
    dev: &B,
    w: &B::Buf<f32>,
    expert_ffn: usize,
    routed: usize,
    flags: &mut B::Buf<i32>,
) -> Result<()> {
    let n_expert = n_expert_of(w.len(), expert_ffn, routed)?;
    let n = flags.len();
    ensure!(
        n >= routed,
        Shape,
        "expert_flags: {n} flags for {routed} routed neurons"
    );
    dev.launch(
        Launch::ExpertFlags {
            w,
            expert_ffn,
            routed,
            n_expert,
            n,
            flags,
        },
        Checked(()),
    )
}

/// `h[s] *= w[e(id of slot s)]` over the hot slots of `ffn` (see `GpuOps::expert_scale`).
pub(crate) fn expert_scale<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    w: &B::Buf<f32>,
    expert_ffn: usize,
    routed: usize,
    h: &mut B::Buf<f32>,
) -> Result<()> {
    let n_expert = n_expert_of(w.len(), expert_ffn, routed)?;
    let l = &ffn.layout;
    ensure!(
        h.len() >= l.n_hot && l.ffn >= routed,
        Shape,
        "expert_scale: h {} for {} hot of a space of {} ({routed} routed)",
        h.len(),
        l.n_hot,
        l.ffn
    );
    if l.n_hot == 0 {
        return Ok(());
    }
    dev.launch(
        Launch::ExpertScale {
            slabs: &ffn.data,
            ids_l: l.ids,
            w,
            expert_ffn,
            routed,
            n_expert,
            n: l.n_hot,
            h,
        },
        Checked(()),
    )
}
