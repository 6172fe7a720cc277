//! The elementwise family (`kernels/elementwise.cu`): residual adds, the threshold mask, the
//! logits' soft-cap, copies and fills, checked ([`ElementwiseOps`]), their launches
//! ([`launch`]) and their contracts on host memory (`host`).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice};

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

use launch::{Pair, PairKernel, ValueKernel, WithValue};

/// `op` over the first `n` values of `y` with `v`, after checking `y` holds them (none: no
/// launch).
fn with_value<B: Backend>(
    dev: &B,
    op: WithValue,
    y: &mut B::Buf<f32>,
    n: usize,
    v: f32,
) -> Result<()> {
    ensure!(
        n <= y.len(),
        Shape,
        "{}: {n} values of a buffer of {}",
        op.entry(),
        y.len()
    );
    if n == 0 {
        return Ok(());
    }
    dev.launch(ValueKernel { op, y, n, v }, Checked(()))
}

/// The elementwise operations, checked, on any backend.
pub trait ElementwiseOps: Backend {
    /// `y[i] += x[i]`.
    fn add(&self, y: &mut Self::Buf<f32>, x: &Self::Buf<f32>) -> Result<()> {
        ensure!(
            y.len() == x.len(),
            Shape,
            "add: {} and {}",
            y.len(),
            x.len()
        );
        let (op, n) = (Pair::Add, y.len());
        if n == 0 {
            return Ok(());
        }
        self.launch(PairKernel { op, y, x, n }, Checked(()))
    }

    /// `h[i] = 0` where `|h[i]| < t`, for i in 0..n (the first n values of `h`).
    fn threshold_mask(&self, h: &mut Self::Buf<f32>, n: usize, t: f32) -> Result<()> {
        with_value(self, WithValue::ThresholdMask, h, n, t)
    }

    /// `y[i] = cap · tanh(y[i] / cap)` for i in 0..n (Gemma 2's final logits);
    /// `Error::Unsupported` unless `cap` is a positive number.
    fn softcap(&self, y: &mut Self::Buf<f32>, n: usize, cap: f32) -> Result<()> {
        ensure!(
            cap > 0.0 && cap.is_finite(),
            Unsupported,
            "softcap: the cap {cap} must be a positive number"
        );
        with_value(self, WithValue::Softcap, y, n, cap)
    }

    /// `dst[i] = src[i]` over `src.len()` values (`dst` at least as long).
    fn copy(&self, dst: &mut Self::Buf<f32>, src: &Self::Buf<f32>) -> Result<()> {
        let (op, n) = (Pair::Copy, src.len());
        ensure!(
            n <= dst.len(),
            Shape,
            "copy: {n} values into a buffer of {}",
            dst.len()
        );
        if n == 0 {
            return Ok(());
        }
        let (y, x) = (dst, src);
        self.launch(PairKernel { op, y, x, n }, Checked(()))
    }

    /// `y[i] = v` for every value of `y`.
    fn fill(&self, y: &mut Self::Buf<f32>, v: f32) -> Result<()> {
        let n = y.len();
        with_value(self, WithValue::Fill, y, n, v)
    }
}

impl<B: Backend> ElementwiseOps for B {}
