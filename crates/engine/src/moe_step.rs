//! One layer's mixture-of-experts step in a forward pass: which expert rows the row's mode
//! reads (the neuron store, the transposed down copy, predictors, thresholds) and the call.

use powerinfer_core::Result;

use crate::ffn::Arith;
use crate::layer::FfnKind;
use crate::moe::{moe_ffn, MoeCall, MoeScratch};
use crate::moe_weights::MoeWeights;
use crate::pass_rows::Rows;
use crate::pass_scratch::Scratch;
use crate::profiler::Profiler;
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// One layer's MoE step, for [`ffn_block`](crate::forward::ffn_block).
pub(crate) struct MoeAt<'a> {
    pub model: &'a ModelWeights,
    pub l: usize,
    pub mode: &'a Sparsity,
    pub w: &'a MoeWeights,
    pub kind: FfnKind,
}

impl MoeAt<'_> {
    /// The routed (and shared) experts of the `n` tokens `xn` at positions `start..` into `out`.
    pub(crate) fn run(
        &self,
        xn: &[f32],
        n: usize,
        start: usize,
        moe: &mut MoeScratch,
        profiler: Option<&mut Profiler>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let MoeAt {
            model,
            l,
            mode,
            w,
            kind,
        } = *self;
        let c = &model.config;
        // Exact-relu reads only the up and down rows of the neurons that fire in each
        // routed expert (one token), threshold mode the down rows of those that pass;
        // batches compute the same function densely, masked.
        // A neuron store serves one token's routed experts in the modes the mode table
        // says (moe_store: dense, exact-relu): no transposed copy in memory then.
        let stored = mode.mode().support().moe_store;
        let store = match (stored, n, profiler.is_some()) {
            (true, 1, false) => model.neuron_store(),
            _ => None,
        };
        let down_t = match (mode, n) {
            (Sparsity::ExactRelu | Sparsity::Threshold(_) | Sparsity::Predictor { .. }, 1)
                if store.is_none() =>
            {
                Some(&model.expert_down_t()?[l][..])
            }
            _ => None,
        };
        // This layer's predictor per expert (None where it has none: exact-relu).
        let predictors = match mode {
            Sparsity::Predictor { experts, .. } => Some(experts.get(l).map_or(&[][..], |r| &r[..])),
            _ => None,
        };
        let threshold = match mode {
            Sparsity::Threshold(t) => Some(t[l]),
            _ => None,
        };
        let call = MoeCall {
            m: &c.moe,
            w,
            act: kind,
            xn,
            n,
            dim: c.dim,
            down_t,
            threshold,
            dense_rows: mode.dense_rows(start, n),
            layer: l,
            store: store.as_deref(),
            exact: matches!(mode, Sparsity::ExactRelu),
            predictors,
        };
        moe_ffn(&call, moe, profiler, out)
    }
}

/// Layer `l`'s MoE step (experts of kind `kind`) for the `n` rows of `s.xn` into `s.down`:
/// decode steps route and read each token on its own, one context's rows in one call.
pub(crate) fn moe_rows(
    model: &ModelWeights,
    l: usize,
    kind: FfnKind,
    rows: &Rows<'_>,
    s: &mut Scratch,
    profiler: Option<&mut Profiler>,
    n: usize,
) -> Result<()> {
    let c = &model.config;
    let lw = &model.layers[l];
    let Some(w) = &lw.moe else {
        powerinfer_core::bail!(Other, "layer {l}: an MoE step without its experts");
    };
    if profiler.as_ref().is_some_and(|p| p.capture_sites) {
        powerinfer_core::bail!(
            Unsupported,
            "capturing the input sites of a mixture-of-experts model is not \
             supported yet"
        );
    }
    let at = |mode| MoeAt {
        model,
        l,
        mode,
        w,
        kind,
    };
    match (s.arith, rows.uniform()) {
        // Decode steps route and read each token on its own: one call per token.
        (Arith::Steps, _) if n > 1 => {
            let dim = c.dim;
            s.down.resize(n * dim, 0.0);
            let mut row = Vec::with_capacity(dim);
            for t in 0..n {
                let (mode, start) = rows.at(t);
                let xn = &s.xn[t * dim..(t + 1) * dim];
                at(mode).run(xn, 1, start, &mut s.moe, None, &mut row)?;
                s.down[t * dim..(t + 1) * dim].copy_from_slice(&row);
            }
        }
        (_, Some((mode, start))) => {
            at(mode).run(&s.xn, n, start, &mut s.moe, profiler, &mut s.down)?
        }
        (_, None) => {
            powerinfer_core::bail!(Other, "layer {l}: rows of several modes in one pass")
        }
    }
    Ok(())
}
