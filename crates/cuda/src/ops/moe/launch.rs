//! The launches of `kernels/moe.cu`: one struct per kernel, its fields the kernel's parameters
//! in order; thread per element, blocks of 256.

use powerinfer_core::Result;

use super::host::Experts;
use crate::backend::kernel;
use crate::host::view::{prefix_mut, Rows};
use crate::kernels::KernelSource;
use crate::launch_spec::{KernelArgs, LaunchSpec};
use crate::layout::{to_i32, RowLayout};

/// `kernels/moe.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "moe",
    include_str!("../../../kernels/moe.cu"),
    &["expert_flags", "expert_scale"],
);

/// The experts' sizes both kernels take, packed after their first arguments.
fn push_experts(
    a: &mut KernelArgs,
    expert_ffn: usize,
    routed: usize,
    n_expert: usize,
    n: usize,
) -> Result<()> {
    a.i32(to_i32(expert_ffn, "expert_ffn")?)
        .i32(to_i32(routed, "routed")?)
        .i32(to_i32(n_expert, "n_expert")?)
        .i32(to_i32(n, "n")?);
    Ok(())
}

kernel! {
    /// `expert_flags`: `flags[j] = (w[e(j)] != 0)` for j in 0..n, where `e(j) = j / expert_ffn`
    /// for `j < routed`, else `n_expert` (a mixture of experts' flattened neurons: the routed
    /// experts', then the shared expert's).
    struct ExpertFlags<'a, B> {
        w: &'a B::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
        n: usize,
        flags: &'a mut B::Buf<i32>,
    }
    entry(_k) "expert_flags".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr(k.w));
        push_experts(&mut a, k.expert_ffn, k.routed, k.n_expert, k.n)?;
        a.ptr(dev.addr_mut(k.flags));
        LaunchSpec::per_element(&SOURCE, "expert_flags".into(), k.n, a)
    }
    host(k) {
        let e = Experts::new(B::data(k.w), k.expert_ffn, k.routed, k.n_expert)?;
        let flags = prefix_mut(B::data_mut(k.flags), k.n, "flags")?;
        for (j, f) in flags.iter_mut().enumerate() {
            *f = i32::from(e.weight(j as i32)? != 0.0);
        }
        Ok(())
    }
}

kernel! {
    /// `expert_scale`: `h[s] *= w[e(id)]` for the slots s in 0..n of a slab buffer, `id` read
    /// through `ids_l` (padding, −1, left alone); `e` as [`ExpertFlags`]'.
    struct ExpertScale<'a, B> {
        slabs: &'a B::Buf<u8>,
        ids_l: RowLayout,
        w: &'a B::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
        n: usize,
        h: &'a mut B::Buf<f32>,
    }
    entry(_k) "expert_scale".into();
    spec(k, dev) {
        let mut a = KernelArgs::default();
        a.ptr(dev.addr(k.slabs)).layout(&k.ids_l).ptr(dev.addr(k.w));
        push_experts(&mut a, k.expert_ffn, k.routed, k.n_expert, k.n)?;
        a.ptr(dev.addr_mut(k.h));
        LaunchSpec::per_element(&SOURCE, "expert_scale".into(), k.n, a)
    }
    host(k) {
        let e = Experts::new(B::data(k.w), k.expert_ffn, k.routed, k.n_expert)?;
        let ids = Rows::ids(B::data(k.slabs), k.ids_l)?;
        let h = prefix_mut(B::data_mut(k.h), k.n, "h")?;
        for (s, v) in h.iter_mut().enumerate() {
            let id = ids.id(s)?;
            if id >= 0 {
                *v *= e.weight(id)?;
            }
        }
        Ok(())
    }
}
