//! The layer program: what one decoder layer of this model computes, as a short list of steps
//! compiled once from the config ([`ModelProgram::compile`]). The CPU forward pass (one token
//! or a batch) and the hybrid executor both walk it, each step on the side the plan puts its
//! block: the family knowledge lives here, as data, and nowhere else.
//!
//! A layer is two blocks, attention then FFN (or both from the same residual, Falcon's
//! parallel block), each a list of steps:
//!
//! * attention: norm → q/k/v (+ biases) → q/k norm → RoPE → attend → output projection
//!   (+ bias) → post-norm → residual add;
//! * FFN: norm → the FFN core (gated or not, its activation, FATReLU threshold, input bias; the
//!   sparsity mode decides which rows it reads) → down bias → post-norm → residual add.
//!
//! Around the layers, the embedding (scale, learned positions) and the output head (norm, final
//! soft-cap) are steps too. Adding a family means adding data to the loaders' family table and,
//! at most, one step here with its CPU and GPU implementation.

use powerinfer_core::{Activation, ModelConfig, Result};

/// Which normalisation a norm step applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / rms(x) · w`.
    Rms,
    /// `(x − mean) / std · w + b` (OPT, Falcon).
    Layer,
}

/// One step of a layer's attention block.
#[derive(Clone, Debug, PartialEq)]
pub enum AttnStep {
    /// `xn = norm(x)` with the layer's `attn_norm` (and its bias for LayerNorm).
    Norm(NormKind),
    /// `q, k, v = Wq xn, Wk xn, Wv xn`, plus their biases when `bias` (Qwen2).
    Qkv { bias: bool },
    /// Every head of q and k RMS-normed by `attn_q_norm` / `attn_k_norm` (Qwen3).
    QkNorm,
    /// Rotary embedding of q and k: the model's global angles, or the layer's own base
    /// (`local`, Gemma 3's sliding layers). Pairing and rotated dims come from the config.
    Rope { local: bool },
    /// Causal attention over the KV cache (the new keys and values written first).
    Attend(AttendParams),
    /// `o = Wo att`, plus its bias when `bias` (OPT).
    Output { bias: bool },
    /// Multi-head latent attention from the normed input to `o` (DeepSeek-V2/V3: its query,
    /// the latent cache row, the absorbed heads, the output projection; [`crate::mla`]), in
    /// place of q/k/v, RoPE, attend and output.
    Mla(AttendParams),
    /// `o = rms(o) · post_attention_norm` (Gemma 2/3).
    PostNorm,
    /// `x += o`.
    Residual,
}

/// The attention step's parameters for one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttendParams {
    /// Sliding window: the last `w` positions, the query's own included (None: all).
    pub window: Option<usize>,
    /// The query scale (1/sqrt(head_dim) unless the family sets one).
    pub scale: f32,
    /// Scores soft-capped to `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
}

/// The FFN's activated input and its gating, as the family sets them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FfnKind {
    pub act: Activation,
    /// FATReLU's threshold (ProSparse; 0 = plain ReLU): with ReLU, `x` where `x > t`, else 0.
    pub relu_threshold: f32,
    /// A gate and an up projection (`act(gate)·up`); false: one input projection, `act(up)`
    /// (OPT's fc1, Falcon), held as `w_gate`.
    pub gated: bool,
    /// The up value passes through the activation too: `act(gate)·act(up)` (Bamboo).
    pub up_act: bool,
    /// A bias on the activated input projection, added before the activation (OPT).
    pub in_bias: bool,
    /// gpt-oss's clamped SwiGLU with this limit instead of `act(gate)·up`
    /// ([`powerinfer_core::MoeFeatures::swiglu_limit`]).
    pub swiglu_limit: Option<f32>,
}

impl FfnKind {
    /// The activation of a gate value (with FATReLU's threshold).
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self.act {
            Activation::Relu if self.relu_threshold > 0.0 => {
                if x > self.relu_threshold {
                    x
                } else {
                    0.0
                }
            }
            a => a.apply(x),
        }
    }

    /// `h · up'` for an activated gate value `h` and an up value (activated too for Bamboo).
    #[inline]
    pub fn times_up(self, h: f32, u: f32) -> f32 {
        match self.up_act {
            true => h * self.apply(u),
            false => h * u,
        }
    }
}

/// Where an FFN block reads the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnInput {
    /// The residual after the attention block (sequential layers).
    Residual,
    /// The residual saved before the attention block (Falcon's parallel block).
    Saved,
}

/// One step of a layer's FFN block.
#[derive(Clone, Debug, PartialEq)]
pub enum FfnStep {
    /// `xn = norm(input)` with the layer's `ffn_norm` (and its bias for LayerNorm).
    Norm(NormKind, FfnInput),
    /// The FFN core: active neurons' input rows, activation, their down rows (the sparsity
    /// mode and the plan decide which rows and on which side).
    Ffn(FfnKind),
    /// A mixture of experts in place of the FFN core: router, the routed experts (each an FFN
    /// of this kind), the shared expert (see [`crate::moe`]).
    Moe(FfnKind),
    /// `out += ffn_down.bias` (OPT).
    DownBias,
    /// `out = rms(out) · post_ffw_norm` (Gemma 2/3).
    PostNorm,
    /// `x += out`.
    Residual,
}

/// One decoder layer's steps.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerProgram {
    /// Save the residual before attention: the FFN reads it ([`FfnInput::Saved`]).
    pub save_residual: bool,
    /// The experts' router reads the layer input before attention (SmallThinker).
    pub early_router: bool,
    pub attention: Vec<AttnStep>,
    pub ffn: Vec<FfnStep>,
}

impl LayerProgram {
    /// The FFN core's kind (every layer has one; of a mixture of experts, its experts').
    pub fn ffn_kind(&self) -> FfnKind {
        self.ffn
            .iter()
            .find_map(|s| match s {
                FfnStep::Ffn(k) | FfnStep::Moe(k) => Some(*k),
                _ => None,
            })
            .expect("every FFN block has its core step")
    }

    /// Whether the FFN is a mixture of experts.
    pub fn is_moe(&self) -> bool {
        self.ffn.iter().any(|s| matches!(s, FfnStep::Moe(_)))
    }

    /// Where the FFN block reads the residual.
    pub fn ffn_input(&self) -> FfnInput {
        match self.save_residual {
            true => FfnInput::Saved,
            false => FfnInput::Residual,
        }
    }
}

/// The steps before the first layer: the token's embedding row, then these.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedProgram {
    /// Embeddings multiplied by this (Gemma: sqrt(dim)).
    pub scale: Option<f32>,
    /// Learned positions added: row `pos + offset` of `position_embd` (OPT: offset 2).
    pub learned_pos: Option<usize>,
}

/// The steps after the last layer.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputProgram {
    pub norm: NormKind,
    /// Logits soft-capped to `c · tanh(l / c)` (Gemma 2).
    pub softcap: Option<f32>,
}

/// The steps of ordinary attention after its q/k/v (q/k norm, RoPE, attend, output).
fn plain_attention(c: &ModelConfig, l: usize, attention: &mut Vec<AttnStep>) {
    let a = &c.arch;
    if a.qk_norm {
        attention.push(AttnStep::QkNorm);
    }
    if !a.learned_pos && a.rope_on(l) {
        attention.push(AttnStep::Rope {
            local: c.rope_local(l),
        });
    }
    attention.push(AttnStep::Attend(AttendParams {
        window: a.window(l),
        scale: a.attn_scale.unwrap_or(1.0 / (c.head_dim as f32).sqrt()),
        softcap: a.attn_softcap,
    }));
    attention.push(AttnStep::Output { bias: a.out_bias });
}

/// The whole model's program.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProgram {
    pub embed: EmbedProgram,
    pub layers: Vec<LayerProgram>,
    pub output: OutputProgram,
}

impl ModelProgram {
    /// Compile the program of a (validated) config.
    pub fn compile(c: &ModelConfig) -> Result<ModelProgram> {
        c.validate()?;
        let a = &c.arch;
        let norm = match a.layer_norm {
            true => NormKind::Layer,
            false => NormKind::Rms,
        };
        let layer = |l: usize| {
            let mut attention = vec![AttnStep::Norm(norm), AttnStep::Qkv { bias: a.qkv_bias }];
            if a.mla.is_mla() {
                let head = a.mla.q_head(c.rope_dims()) as f32;
                attention = vec![
                    AttnStep::Norm(norm),
                    AttnStep::Mla(AttendParams {
                        window: a.window(l),
                        scale: a.attn_scale.unwrap_or(1.0 / head.sqrt()),
                        softcap: None,
                    }),
                ];
            }
            if !a.mla.is_mla() {
                plain_attention(c, l, &mut attention);
            }
            if a.post_norms {
                attention.push(AttnStep::PostNorm);
            }
            attention.push(AttnStep::Residual);
            let input = match a.parallel {
                true => FfnInput::Saved,
                false => FfnInput::Residual,
            };
            let kind = FfnKind {
                act: c.activation,
                relu_threshold: a.relu_threshold,
                gated: !a.no_gate,
                up_act: a.up_act,
                in_bias: a.ffn_bias,
                swiglu_limit: c.moe.swiglu_limit.filter(|_| c.is_moe_layer(l)),
            };
            let core = match c.is_moe_layer(l) {
                true => FfnStep::Moe(kind),
                false => FfnStep::Ffn(kind),
            };
            let mut ffn = vec![FfnStep::Norm(norm, input), core];
            if a.ffn_bias {
                ffn.push(FfnStep::DownBias);
            }
            if a.post_norms {
                ffn.push(FfnStep::PostNorm);
            }
            ffn.push(FfnStep::Residual);
            LayerProgram {
                save_residual: a.parallel,
                early_router: c.is_moe_layer(l) && c.moe.router_on_residual,
                attention,
                ffn,
            }
        };
        Ok(ModelProgram {
            embed: EmbedProgram {
                scale: a.embed_scale,
                learned_pos: a.learned_pos.then_some(a.pos_offset),
            },
            layers: (0..c.n_layers).map(layer).collect(),
            output: OutputProgram {
                norm,
                softcap: a.final_softcap,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::testing::tiny_config;

    #[test]
    fn llama_is_the_plain_list() {
        let c = tiny_config(Activation::Silu);
        let p = ModelProgram::compile(&c).unwrap();
        let l = &p.layers[1];
        assert!(!l.save_residual);
        assert_eq!(
            l.attention,
            vec![
                AttnStep::Norm(NormKind::Rms),
                AttnStep::Qkv { bias: false },
                AttnStep::Rope { local: false },
                AttnStep::Attend(AttendParams {
                    window: None,
                    scale: 0.25,
                    softcap: None
                }),
                AttnStep::Output { bias: false },
                AttnStep::Residual,
            ]
        );
        assert_eq!(l.ffn.len(), 3);
        assert!(l.ffn_kind().gated);
        assert_eq!(p.embed.learned_pos, None);
    }

    #[test]
    fn family_features_become_steps() {
        let mut c = tiny_config(Activation::Relu);
        let a = &mut c.arch;
        (a.layer_norm, a.learned_pos, a.pos_offset) = (true, true, 2);
        (a.ffn_bias, a.out_bias, a.no_gate, a.parallel) = (true, true, true, true);
        (a.sliding_window, a.swa_pattern, a.attn_softcap) = (Some(4), 2, Some(30.0));
        let p = ModelProgram::compile(&c).unwrap();
        let l0 = &p.layers[0];
        assert!(l0.save_residual);
        assert!(!l0
            .attention
            .iter()
            .any(|s| matches!(s, AttnStep::Rope { .. })));
        assert!(l0.attention.contains(&AttnStep::Output { bias: true }));
        let window = |l: &LayerProgram| {
            l.attention.iter().find_map(|s| match s {
                AttnStep::Attend(p) => Some(p.window),
                _ => None,
            })
        };
        assert_eq!(
            (window(l0), window(&p.layers[1])),
            (Some(Some(4)), Some(None))
        );
        assert_eq!(l0.ffn[0], FfnStep::Norm(NormKind::Layer, FfnInput::Saved));
        assert!(l0.ffn.contains(&FfnStep::DownBias));
        let k = l0.ffn_kind();
        assert!(!k.gated && k.in_bias);
        assert_eq!(
            (p.embed.learned_pos, p.output.norm),
            (Some(2), NormKind::Layer)
        );
    }

    #[test]
    fn fatrelu_and_up_activation() {
        let k = FfnKind {
            act: Activation::Relu,
            relu_threshold: 0.5,
            gated: true,
            up_act: true,
            in_bias: false,
            swiglu_limit: None,
        };
        assert_eq!((k.apply(0.4), k.apply(0.6)), (0.0, 0.6));
        assert_eq!(k.times_up(2.0, -1.0), 0.0);
        assert_eq!(k.times_up(2.0, 3.0), 6.0);
    }
}
