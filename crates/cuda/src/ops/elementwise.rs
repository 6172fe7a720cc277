//! The kernels of `elementwise.cu`: residual adds, the threshold mask, the logits' soft-cap and
//! copies.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, Launch};

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
