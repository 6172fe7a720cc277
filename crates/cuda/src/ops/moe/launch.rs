//! The launches of `kernels/moe.cu`: one struct per kernel, its fields the kernel's parameters
//! in order; thread per element, blocks of 256.

use powerinfer_core::Result;

use super::host::Experts;
use crate::backend::{kernel, Backend, HostMem};
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

/// A token's routing as both kernels take it: `w` holds each expert's weight (0: not routed)
/// and, at `n_expert`, the shared expert's scale; neuron `j < routed` belongs to expert
/// `j / expert_ffn`, the rest to the shared expert.
pub struct Routing<'a, B: Backend> {
    pub w: &'a B::Buf<f32>,
    pub expert_ffn: usize,
    pub routed: usize,
    pub n_expert: usize,
}

impl<B: Backend> Routing<'_, B> {
    /// `(w, expert_ffn, routed, n_expert)` packed into `a`, `w` as `dev`'s address.
    fn push(&self, dev: &B, a: &mut KernelArgs) -> Result<()> {
        a.ptr(dev.addr(self.w))
            .i32(to_i32(self.expert_ffn, "expert_ffn")?)
            .i32(to_i32(self.routed, "routed")?)
            .i32(to_i32(self.n_expert, "n_expert")?);
        Ok(())
    }

    /// The weights as the host contract reads them.
    fn host(&self) -> Result<Experts<'_>>
    where
        B: HostMem,
    {
        Experts::new(B::data(self.w), self.expert_ffn, self.routed, self.n_expert)
    }
}

kernel! {
    /// `expert_flags(w, expert_ffn, routed, n_expert, n, flags)`: `flags[j] = (w[e(j)] != 0)`
    /// for j in 0..n, `e(j)` the expert of neuron j ([`Routing`]).
    struct ExpertFlags<'a, B> {
        routing: Routing<'a, B>,
        n: usize,
        flags: &'a mut B::Buf<i32>,
    }
    entry = "expert_flags";
    spec(k, dev, a) {
        k.routing.push(dev, &mut a)?;
        a.i32(to_i32(k.n, "n")?).ptr(dev.addr_mut(k.flags));
        LaunchSpec::per_element(&SOURCE, "expert_flags".into(), k.n, a)
    }
    host(k) {
        let e = k.routing.host()?;
        let flags = prefix_mut(B::data_mut(k.flags), k.n, "flags")?;
        for (j, f) in flags.iter_mut().enumerate() {
            *f = i32::from(e.weight(j as i32)? != 0.0);
        }
        Ok(())
    }
}

kernel! {
    /// `expert_scale(slabs, ids_l, w, expert_ffn, routed, n_expert, n, h)`: `h[s] *= w[e(id)]`
    /// for the slots s in 0..n of a slab buffer, `id` read through `ids_l` (padding, −1, left
    /// alone).
    struct ExpertScale<'a, B> {
        slabs: &'a B::Buf<u8>,
        ids_l: RowLayout,
        routing: Routing<'a, B>,
        n: usize,
        h: &'a mut B::Buf<f32>,
    }
    entry = "expert_scale";
    spec(k, dev, a) {
        a.ptr(dev.addr(k.slabs)).layout(&k.ids_l);
        k.routing.push(dev, &mut a)?;
        a.i32(to_i32(k.n, "n")?).ptr(dev.addr_mut(k.h));
        LaunchSpec::per_element(&SOURCE, "expert_scale".into(), k.n, a)
    }
    host(k) {
        let e = k.routing.host()?;
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
