//! The contract of the routing kernels (moe.cu) on host memory: which expert a flattened
//! neuron belongs to, and its weight for the token.

/// A mixture of experts' routing weights over its flattened neurons (`expert_flags`,
/// `expert_scale`): neuron `id < routed` belongs to expert `id / expert_ffn`, the rest to the
/// shared expert (`n_expert`), whose weight is `w[n_expert]`.
pub(crate) struct Experts<'a> {
    w: &'a [f32],
    expert_ffn: usize,
    routed: usize,
    n_expert: usize,
}

impl<'a> Experts<'a> {
    pub(crate) fn new(
        w: &'a [f32],
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
    ) -> powerinfer_core::Result<Experts<'a>> {
        powerinfer_core::ensure!(
            expert_ffn > 0 && w.len() > n_expert && routed <= n_expert * expert_ffn,
            Shape,
            "experts: {} weights for {n_expert} experts of {expert_ffn} ({routed} routed neurons)",
            w.len()
        );
        Ok(Experts {
            w,
            expert_ffn,
            routed,
            n_expert,
        })
    }

    /// The weight of neuron `id`'s expert.
    pub(crate) fn weight(&self, id: i32) -> powerinfer_core::Result<f32> {
        let id = usize::try_from(id).map_err(|_| {
            powerinfer_core::Error::Shape(format!("experts: neuron id {id} is negative"))
        })?;
        let e = match id < self.routed {
            true => id / self.expert_ffn,
            false => self.n_expert,
        };
        Ok(self.w[e])
    }
}
