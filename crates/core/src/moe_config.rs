//! What a mixture-of-experts FFN changes in the config ([`MoeFeatures`]): how many experts, how
//! many a token uses, their width, the router's gating, and the shared expert. Every value is
//! llama.cpp's (its `build_moe_ffn` and the family graphs in `src/models/`); the loaders fill
//! them from the GGUF keys (`<arch>.expert_count`, `expert_used_count`,
//! `expert_feed_forward_length`, `expert_shared_feed_forward_length`, `expert_shared_count`,
//! `expert_gating_func`, `expert_weights_norm`, `expert_weights_scale`,
//! `leading_dense_block_count`) and the family's own defaults.

use crate::error::Result;
use crate::{bail, ensure};

/// How the router turns its logits into expert probabilities (before top-k).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gating {
    /// `softmax(logits)` over all experts (Mixtral, Qwen2/3-MoE, OLMoE).
    #[default]
    Softmax,
    /// `sigmoid(logit)` per expert (SmallThinker's sigmoid routers, DeepSeek V3).
    Sigmoid,
    /// The top-k of the raw logits, weighted by the softmax over the k chosen (llama.cpp's
    /// `SOFTMAX_WEIGHT`; gpt-oss).
    SoftmaxWeight,
}

impl Gating {
    /// Parse "softmax" / "sigmoid".
    pub fn from_name(name: &str) -> Result<Gating> {
        Ok(match name {
            "softmax" => Gating::Softmax,
            "sigmoid" => Gating::Sigmoid,
            "softmax_weight" => Gating::SoftmaxWeight,
            _ => bail!(
                Unsupported,
                "expert gating {name:?} (supported: softmax, sigmoid, softmax_weight)"
            ),
        })
    }

    /// The name [`Gating::from_name`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Gating::Softmax => "softmax",
            Gating::Sigmoid => "sigmoid",
            Gating::SoftmaxWeight => "softmax_weight",
        }
    }
}

/// The mixture-of-experts FFN of every layer. `MoeFeatures::default()` (`n_expert` 0) is a
/// dense FFN.
///
/// A token's FFN output is `Σ_{e ∈ top-k} w_e · down_e(act(gate_e x) · up_e x)` (+ the shared
/// expert), where `p = gating(router x)`, top-k are the `n_expert_used` largest `p`, and
/// `w_e = p_e`, divided by their sum when `norm_weights`, times `weights_scale` where set.
/// With a correction bias (`score_bias`, GLM-4.5 and DeepSeek-V3's `e_score_correction_bias`)
/// the experts are chosen by `p + b` but weighted by `p`; with expert groups (`n_group` > 1)
/// only the `topk_group` groups of the best group scores (each the sum of its two largest
/// `p + b`) are candidates.
/// Experts are stored as llama.cpp's merged 3-D tensors: `ffn_{gate,up}_exps` are
/// `n_expert × expert_ffn` rows of `dim`, `ffn_down_exps` `n_expert × dim` rows of
/// `expert_ffn` (expert `e` is one contiguous block of each).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeFeatures {
    /// Experts per layer (0: a dense FFN).
    pub n_expert: usize,
    /// Experts each token is routed to (top-k).
    pub n_expert_used: usize,
    /// Rows of each expert's gate and up (0: the config's `ffn_dim`).
    pub expert_ffn_dim: usize,
    /// A shared expert every token runs (`ffn_{gate,up,down}_shexp`) of this width; 0: none.
    pub shared_ffn_dim: usize,
    /// The shared expert's output is scaled by `sigmoid(ffn_gate_inp_shexp · x)` (Qwen2-MoE).
    pub shared_gate: bool,
    pub gating: Gating,
    /// The top-k weights are divided by their sum (llama.cpp's `norm_w`).
    pub norm_weights: bool,
    /// The weights are multiplied by this (None: 1).
    pub weights_scale: Option<f32>,
    /// The router reads the layer's input residual before attention, not the FFN's normed
    /// input (SmallThinker).
    pub router_on_residual: bool,
    /// The first `dense_lead` layers have a dense FFN of the config's `ffn_dim` instead of
    /// experts (GLM-4.5's and DeepSeek's `first_k_dense_replace`).
    pub dense_lead: usize,
    /// Each routed layer's router has a correction bias (`exp_probs_b.bias`, n_expert values)
    /// added to the probabilities to choose the top-k only.
    pub score_bias: bool,
    /// Expert groups (0 or 1: none): the experts split into `n_group` equal groups ...
    pub n_group: usize,
    /// ... of which the `topk_group` best hold the candidates.
    pub topk_group: usize,
    /// Biases on the router's logits (`ffn_gate_inp.bias`, n_expert) and on every expert's
    /// gate, up and down outputs (`ffn_{gate,up}_exps.bias`, n_expert·expert_ffn;
    /// `ffn_down_exps.bias`, n_expert·dim), the down bias added before the route's weight
    /// (gpt-oss).
    pub expert_bias: bool,
    /// The clamped SwiGLU of gpt-oss (llama.cpp's `swiglu_oai`) with this limit: with
    /// `g = min(gate, limit)` and `u = clamp(up, -limit, limit)`, `g·σ(1.702·g)·(u + 1)`
    /// instead of `act(gate)·up` (None: the config's activation).
    pub swiglu_limit: Option<f32>,
}

/// The slope inside the sigmoid of gpt-oss's clamped SwiGLU (llama.cpp's and HF's alpha).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;

/// gpt-oss's clamped SwiGLU of one gate and up value (see [`MoeFeatures::swiglu_limit`]), in
/// llama.cpp's f32 order of operations.
#[inline]
pub fn swiglu_oai(gate: f32, up: f32, limit: f32) -> f32 {
    let g = gate.min(limit);
    let u = up.clamp(-limit, limit);
    g / (1.0 + (SWIGLU_OAI_ALPHA * -g).exp()) * (u + 1.0)
}

impl MoeFeatures {
    /// Whether the FFN is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// The width of each expert given the config's `ffn_dim`.
    pub fn expert_ffn(&self, ffn_dim: usize) -> usize {
        match self.expert_ffn_dim {
            0 => ffn_dim,
            e => e,
        }
    }

    /// Whether the experts are chosen group by group ([`MoeFeatures::n_group`] > 1).
    pub fn grouped(&self) -> bool {
        self.n_group > 1
    }

    /// Check the values fit together (nothing to check for a dense FFN beyond unset fields).
    pub fn validate(&self) -> Result<()> {
        if !self.is_moe() {
            ensure!(
                self.n_expert_used == 0
                    && self.shared_ffn_dim == 0
                    && !self.router_on_residual
                    && self.dense_lead == 0
                    && !self.score_bias
                    && !self.grouped()
                    && !self.expert_bias
                    && self.swiglu_limit.is_none(),
                Shape,
                "expert settings (n_expert_used, shared_ffn_dim, router_on_residual, \
                 dense_lead, score_bias, n_group, expert_bias, swiglu_limit) without experts \
                 (n_expert 0)"
            );
            return Ok(());
        }
        self.validate_groups()?;
        ensure!(
            self.swiglu_limit.is_none_or(|l| l > 0.0 && l.is_finite()),
            Shape,
            "swiglu_limit {:?} must be positive and finite",
            self.swiglu_limit
        );
        ensure!(
            (1..=self.n_expert).contains(&self.n_expert_used),
            Shape,
            "n_expert_used {} must lie in 1..={} (n_expert)",
            self.n_expert_used,
            self.n_expert
        );
        ensure!(
            self.n_expert <= 1 << 16,
            Shape,
            "n_expert {} is more than 65536",
            self.n_expert
        );
        ensure!(
            self.weights_scale.is_none_or(|s| s > 0.0 && s.is_finite()),
            Shape,
            "expert_weights_scale {:?} must be positive and finite",
            self.weights_scale
        );
        ensure!(
            !self.shared_gate || self.shared_ffn_dim > 0,
            Shape,
            "a shared expert gate without a shared expert (shared_ffn_dim 0)"
        );
        Ok(())
    }

    /// The expert groups divide the experts and leave at least `n_expert_used` candidates.
    fn validate_groups(&self) -> Result<()> {
        if !self.grouped() {
            return Ok(());
        }
        let (g, k) = (self.n_group, self.topk_group);
        ensure!(
            self.n_expert.is_multiple_of(g),
            Shape,
            "{} experts do not split into {g} groups",
            self.n_expert
        );
        ensure!(
            (1..=g).contains(&k) && k * (self.n_expert / g) >= self.n_expert_used,
            Shape,
            "topk_group {k} must lie in 1..={g} and hold n_expert_used {} experts",
            self.n_expert_used
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(MoeFeatures::default().validate().is_ok());
        let m = MoeFeatures {
            n_expert: 8,
            n_expert_used: 2,
            ..Default::default()
        };
        assert!(m.validate().is_ok());
        assert_eq!((m.expert_ffn(96), m.is_moe()), (96, true));
        let bad = |f: &dyn Fn(&mut MoeFeatures)| {
            let mut b = m.clone();
            f(&mut b);
            b.validate().is_err()
        };
        assert!(bad(&|b| b.n_expert_used = 0));
        assert!(bad(&|b| b.n_expert_used = 9));
        assert!(bad(&|b| b.weights_scale = Some(f32::NAN)));
        assert!(bad(&|b| b.shared_gate = true));
        assert!(bad(&|b| (b.n_group, b.topk_group) = (3, 1)));
        assert!(bad(&|b| (b.n_group, b.topk_group) = (4, 0)));
        assert!(!bad(&|b| (b.n_group, b.topk_group) = (4, 1)));
        assert!(bad(
            &|b| (b.n_expert, b.n_expert_used, b.dense_lead) = (0, 0, 1)
        ));
        assert!(!bad(&|b| (b.n_expert, b.n_expert_used) = (0, 0)));
        assert!(bad(&|b| b.n_expert = 0));
        assert_eq!(Gating::from_name("sigmoid").unwrap(), Gating::Sigmoid);
        assert!(Gating::from_name("softplus").is_err());
    }
}
