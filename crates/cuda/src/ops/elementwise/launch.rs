//! The launches of `kernels/elementwise.cu`: one struct per kernel, its fields the kernel's
//! parameters in order; thread per element, blocks of 256.

use super::host;
use crate::backend::kernel;
use crate::host::view::{prefix, prefix_mut};
use crate::kernels::KernelSource;
use crate::launch_spec::LaunchSpec;
use crate::layout::to_i32;

/// `kernels/elementwise.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "elementwise",
    include_str!("../../../kernels/elementwise.cu"),
    &["add", "threshold_mask", "softcap", "copy", "fill"],
);

/// The kernels over two vectors, `y` and `x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pair {
    /// `add`: `y[i] += x[i]`.
    Add,
    /// `copy`: `y[i] = x[i]`.
    Copy,
}

/// The kernels over one vector `y` and a number `v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WithValue {
    /// `threshold_mask`: `y[i] = 0` where `|y[i]| < v` (threshold mode).
    ThresholdMask,
    /// `softcap`: `y[i] = v · tanh(y[i] / v)`.
    Softcap,
    /// `fill`: `y[i] = v`.
    Fill,
}

impl Pair {
    /// The kernel's entry name.
    pub fn entry(self) -> &'static str {
        match self {
            Pair::Add => "add",
            Pair::Copy => "copy",
        }
    }
}

impl WithValue {
    /// The kernel's entry name.
    pub fn entry(self) -> &'static str {
        match self {
            WithValue::ThresholdMask => "threshold_mask",
            WithValue::Softcap => "softcap",
            WithValue::Fill => "fill",
        }
    }
}

kernel! {
    /// `add` or `copy` (`op`) over the first `n` values: `add(y, x, n)`, `copy(dst, src, n)`.
    struct PairKernel<'a, B> {
        op: Pair,
        y: &'a mut B::Buf<f32>,
        x: &'a B::Buf<f32>,
        n: usize,
    }
    entry(k) = k.op.entry();
    spec(k, dev, a) {
        let entry = k.entry();
        a.ptr(dev.addr_mut(k.y)).ptr(dev.addr(k.x));
        a.i32(to_i32(k.n, "n")?);
        LaunchSpec::per_element(&SOURCE, entry, k.n, a)
    }
    host(k) {
        let x = prefix(B::data(k.x), k.n, "x")?;
        let y = prefix_mut(B::data_mut(k.y), k.n, "y")?;
        match k.op {
            Pair::Add => host::add(y, x),
            Pair::Copy => y.copy_from_slice(x),
        }
        Ok(())
    }
}

kernel! {
    /// `threshold_mask`, `softcap` or `fill` (`op`) over the first `n` values of `y`, with `v`:
    /// `(y, n, v)`.
    struct ValueKernel<'a, B> {
        op: WithValue,
        y: &'a mut B::Buf<f32>,
        n: usize,
        v: f32,
    }
    entry(k) = k.op.entry();
    spec(k, dev, a) {
        let entry = k.entry();
        a.ptr(dev.addr_mut(k.y)).i32(to_i32(k.n, "n")?).f32(k.v);
        LaunchSpec::per_element(&SOURCE, entry, k.n, a)
    }
    host(k) {
        let y = prefix_mut(B::data_mut(k.y), k.n, "y")?;
        match k.op {
            WithValue::ThresholdMask => host::threshold_mask(y, k.v),
            WithValue::Softcap => host::softcap(y, k.v),
            WithValue::Fill => y.fill(k.v),
        }
        Ok(())
    }
}
