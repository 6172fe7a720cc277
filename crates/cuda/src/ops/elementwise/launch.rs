//! The launches of `kernels/elementwise.cu`: one struct per kernel, its fields the kernel's
//! parameters in order; thread per element, blocks of 256.

use powerinfer_core::Result;

use super::host;
use crate::backend::kernel;
use crate::host::view::{prefix, prefix_mut};
use crate::kernels::KernelSource;
use crate::launch_spec::{KernelArgs, LaunchSpec};
use crate::layout::to_i32;

/// `kernels/elementwise.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "elementwise",
    include_str!("../../../kernels/elementwise.cu"),
    &["add", "threshold_mask", "softcap", "copy", "fill"],
);

/// The spec of thread-per-element kernel `entry` of this module over `n` values.
fn per_element(entry: &str, n: usize, a: KernelArgs) -> Result<LaunchSpec> {
    LaunchSpec::per_element(&SOURCE, entry.into(), n, a)
}

kernel! {
    /// `add`: `y[i] += x[i]`.
    struct Add<'a, B> {
        y: &'a mut B::Buf<f32>,
        x: &'a B::Buf<f32>,
        n: usize,
    }
    entry(_k) "add".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr_mut(k.y)).ptr(dev.addr(k.x));
        a.i32(to_i32(k.n, "n")?);
        per_element("add", k.n, a)
    }
    host(k) {
        let x = prefix(B::data(k.x), k.n, "x")?;
        host::add(prefix_mut(B::data_mut(k.y), k.n, "y")?, x);
        Ok(())
    }
}

kernel! {
    /// `threshold_mask`: `h[i] = 0` where `|h[i]| < t` (threshold mode).
    struct ThresholdMask<'a, B> {
        h: &'a mut B::Buf<f32>,
        n: usize,
        t: f32,
    }
    entry(_k) "threshold_mask".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr_mut(k.h)).i32(to_i32(k.n, "n")?).f32(k.t);
        per_element("threshold_mask", k.n, a)
    }
    host(k) {
        host::threshold_mask(prefix_mut(B::data_mut(k.h), k.n, "h")?, k.t);
        Ok(())
    }
}

kernel! {
    /// `softcap`: `y[i] = cap · tanh(y[i] / cap)`.
    struct Softcap<'a, B> {
        y: &'a mut B::Buf<f32>,
        n: usize,
        cap: f32,
    }
    entry(_k) "softcap".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr_mut(k.y));
        a.i32(to_i32(k.n, "n")?).f32(k.cap);
        per_element("softcap", k.n, a)
    }
    host(k) {
        host::softcap(prefix_mut(B::data_mut(k.y), k.n, "y")?, k.cap);
        Ok(())
    }
}

kernel! {
    /// `copy`: `dst[i] = src[i]`.
    struct Copy<'a, B> {
        dst: &'a mut B::Buf<f32>,
        src: &'a B::Buf<f32>,
        n: usize,
    }
    entry(_k) "copy".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr_mut(k.dst)).ptr(dev.addr(k.src));
        a.i32(to_i32(k.n, "n")?);
        per_element("copy", k.n, a)
    }
    host(k) {
        let src = prefix(B::data(k.src), k.n, "src")?;
        prefix_mut(B::data_mut(k.dst), k.n, "dst")?.copy_from_slice(src);
        Ok(())
    }
}

kernel! {
    /// `fill`: `y[i] = v`.
    struct Fill<'a, B> {
        y: &'a mut B::Buf<f32>,
        n: usize,
        v: f32,
    }
    entry(_k) "fill".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr_mut(k.y)).i32(to_i32(k.n, "n")?).f32(k.v);
        per_element("fill", k.n, a)
    }
    host(k) {
        prefix_mut(B::data_mut(k.y), k.n, "y")?.fill(k.v);
        Ok(())
    }
}
