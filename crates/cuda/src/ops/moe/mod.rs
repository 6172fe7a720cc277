//! The mixture-of-experts family (`kernels/moe.cu`): a token's routing applied on the GPU to a
//! layer's hot neurons, as flags for the gate/up pass ([`MoeOps::expert_flags`]) and as each
//! slot's weight before the down pass ([`MoeOps::expert_scale`]); their launches ([`launch`])
//! and contracts on host memory (`host`).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn};

pub(crate) mod host;
pub mod launch;

use launch::{ExpertFlags, ExpertScale, Routing};

/// The routing `w` describes (`n_expert + 1` weights) for a space of `routed` routed neurons
/// in experts of `expert_ffn`; `Error::Shape` when they do not fit.
fn routing<B: Backend>(
    w: &B::Buf<f32>,
    expert_ffn: usize,
    routed: usize,
) -> Result<Routing<'_, B>> {
    let w_len = w.len();
    ensure!(
        w_len >= 2 && expert_ffn > 0 && routed == (w_len - 1) * expert_ffn,
        Shape,
        "experts: {w_len} weights (experts + shared) for {routed} routed neurons in experts of \
         {expert_ffn}"
    );
    Ok(Routing {
        w,
        expert_ffn,
        routed,
        n_expert: w_len - 1,
    })
}

/// A mixture of experts' routing on the hot neurons, checked, on any backend.
pub trait MoeOps: Backend {
    /// A mixture of experts' routing as flags over its flattened neurons: `flags[j]` for every
    /// j in `flags` is whether neuron j's expert has a nonzero weight in `w` (n_expert + 1
    /// values: each expert's weight for the token, 0 where not routed, then the shared
    /// expert's scale). Neuron `j < routed` belongs to expert `j / expert_ffn`, the rest to the
    /// shared expert.
    fn expert_flags(
        &self,
        w: &Self::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        flags: &mut Self::Buf<i32>,
    ) -> Result<()> {
        let routing = routing::<Self>(w, expert_ffn, routed)?;
        let n = flags.len();
        ensure!(
            n >= routed,
            Shape,
            "expert_flags: {n} flags for {routed} routed neurons"
        );
        let launch = ExpertFlags { routing, n, flags };
        self.launch(launch, Checked(()))
    }

    /// Each hot slot's value of `h` times its neuron's expert weight in `w` (as
    /// [`MoeOps::expert_flags`]), before the down pass sums the slots.
    fn expert_scale(
        &self,
        ffn: &HotFfn<Self>,
        w: &Self::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let routing = routing::<Self>(w, expert_ffn, routed)?;
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
        let launch = ExpertScale {
            slabs: &ffn.data,
            ids_l: l.ids,
            routing,
            n: l.n_hot,
            h,
        };
        self.launch(launch, Checked(()))
    }
}

impl<B: Backend> MoeOps for B {}
