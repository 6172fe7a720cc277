//! The kernels of `elementwise.cu`: gating, residual adds, and the threshold mask.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, Launch};
use crate::layout::Act;

/// `g[i] = act(g[i]) · u[i]`.
pub(crate) fn act_mul<B: Backend>(
    dev: &B,
    g: &mut B::Buf<f32>,
    u: &B::Buf<f32>,
    act: Act,
) -> Result<()> {
    ensure!(
        g.len() == u.len(),
        Shape,
        "act_mul: {} and {}",
        g.len(),
        u.len()
    );
    let n = g.len();
    if n == 0 {
        return Ok(());
    }
    dev.launch(Launch::ActMul { g, u, n, act }, Checked(()))
}

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
