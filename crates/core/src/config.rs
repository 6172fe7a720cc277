//! Model hyper-parameters of a llama-style decoder, as the engine needs them, with what each
//! model family changes in the llama layer as data ([`ArchFeatures`]): adding a family is a
//! loader table entry plus, where it needs a new operation, one feature here and its step in
//! the forward pass, not a second forward pass.

use crate::error::Result;
use crate::{bail, ensure};

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): GGUF llama files (their q/k rows are permuted at conversion).
    Norm,
    /// Halves (i, i + d/2): Hugging Face checkpoints (`rotate_half`).
    Neox,
}

/// The FFN gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Relu,
    Gelu,
}

impl Activation {
    /// Parse "silu" / "swish" / "relu" / "gelu*".
    pub fn from_name(name: &str) -> Result<Activation> {
        let n = name.to_ascii_lowercase();
        Ok(match n.as_str() {
            "silu" | "swish" => Activation::Silu,
            "relu" => Activation::Relu,
            s if s.starts_with("gelu") => Activation::Gelu,
            _ => bail!(Unsupported, "activation {name:?}"),
        })
    }

    /// Apply to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Relu => x.max(0.0),
            Activation::Gelu => {
                // tanh approximation, as llama.cpp and most checkpoints' "gelu_pytorch_tanh".
                const C: f32 = 0.797_884_6; // sqrt(2/pi)
                0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
            }
        }
    }
}

/// What a model family changes in the llama decoder layer. `ArchFeatures::default()` is llama
/// (and Mistral without a window, SmolLM, ReluLLaMA, ...); every feature is off there, so the
/// llama path takes no extra work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArchFeatures {
    /// The q, k and v projections carry biases (`blk.N.attn_{q,k,v}.bias`; Qwen2).
    pub qkv_bias: bool,
    /// Every head of q and k is RMS-normed (weights of `head_dim`: `blk.N.attn_{q,k}_norm`)
    /// before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Sliding-window attention: a token attends to the last `w` positions, itself included
    /// (distance < w), in the layers [`ArchFeatures::swa_pattern`] marks.
    pub sliding_window: Option<usize>,
    /// Which layers slide when a window is set: 0 = every layer (Mistral); p > 0 = all but each
    /// p-th layer, counted from 1 (Gemma 2: p = 2, odd layers global; Gemma 3: p = 6).
    pub swa_pattern: usize,
    /// RoPE base of the sliding layers when it differs from the global one (Gemma 3: 10000).
    pub rope_theta_local: Option<f32>,
    /// Added to every norm weight at load: RMSNorm by `(offset + w)` (Gemma's HF checkpoints: 1;
    /// llama.cpp's converter adds it to the stored weights, so GGUF files say 0).
    pub norm_offset: f32,
    /// Norms after attention and after the FFN, before each residual add
    /// (`blk.N.post_attention_norm`, `blk.N.post_ffw_norm`; Gemma 2/3).
    pub post_norms: bool,
    /// Embeddings multiplied by this (Gemma: sqrt(dim)).
    pub embed_scale: Option<f32>,
    /// The attention's query scale instead of 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-½).
    pub attn_scale: Option<f32>,
    /// Attention scores soft-capped: `c · tanh(s / c)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Final logits soft-capped the same way (Gemma 2).
    pub final_softcap: Option<f32>,
    /// FATReLU's threshold (ProSparse): with a ReLU activation, `x` where `x > t`, else 0.
    pub relu_threshold: f32,
    /// The FFN's up projection passes through the activation too: `act(gate)·act(up)` (Bamboo).
    pub up_act: bool,
    /// LayerNorm (mean removed, with biases `*_norm.bias`) instead of RMSNorm (OPT, Falcon).
    pub layer_norm: bool,
    /// Learned absolute positions (`position_embd`, row `pos + pos_offset`) instead of RoPE
    /// (OPT: offset 2).
    pub learned_pos: bool,
    /// See [`ArchFeatures::learned_pos`].
    pub pos_offset: usize,
    /// No gate: the FFN is `down(act(up x + b))` (OPT's fc1/fc2, Falcon). The engine holds the
    /// one input projection as `w_gate` (the activated one) and never reads `w_up`.
    pub no_gate: bool,
    /// Biases on the FFN's input projection and on its down projection (OPT).
    pub ffn_bias: bool,
    /// A bias on the attention output projection (OPT).
    pub out_bias: bool,
    /// Attention and FFN in parallel from the same residual: `x + attn(n1(x)) + ffn(n2(x))`,
    /// `n2` = `attn_norm_2` where the file has it, else the attention's norm (Falcon).
    pub parallel: bool,
}

impl ArchFeatures {
    /// The attention window of layer `l` (None: the whole context).
    pub fn window(&self, l: usize) -> Option<usize> {
        let w = self.sliding_window?;
        match self.swa_pattern {
            0 => Some(w),
            p if (l + 1).is_multiple_of(p) => None,
            _ => Some(w),
        }
    }

    /// The RoPE base of layer `l`, given the model's global one.
    pub fn rope_theta(&self, l: usize, global: f32) -> f32 {
        match (self.window(l), self.rope_theta_local) {
            (Some(_), Some(local)) => local,
            _ => global,
        }
    }
}

/// Shape and numerics of a llama-style model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub n_layers: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub max_context: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub activation: Activation,
    /// What the family changes (default: plain llama).
    pub arch: ArchFeatures,
}

impl ModelConfig {
    /// Check the numbers are consistent with each other.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.n_layers > 0, ModelFile, "n_layers must be > 0");
        ensure!(
            self.dim > 0 && self.ffn_dim > 0,
            ModelFile,
            "dim and ffn_dim must be > 0"
        );
        ensure!(
            self.n_heads > 0 && self.n_kv_heads > 0,
            ModelFile,
            "head counts must be > 0"
        );
        ensure!(
            self.n_heads.is_multiple_of(self.n_kv_heads),
            ModelFile,
            "n_heads {} is not a multiple of n_kv_heads {}",
            self.n_heads,
            self.n_kv_heads
        );
        ensure!(
            self.head_dim > 0 && self.head_dim.is_multiple_of(2),
            ModelFile,
            "head_dim {} must be even and > 0",
            self.head_dim
        );
        ensure!(self.vocab_size > 0, ModelFile, "vocab_size must be > 0");
        ensure!(self.max_context > 0, ModelFile, "max_context must be > 0");
        ensure!(
            self.rms_eps > 0.0 && self.rms_eps.is_finite(),
            ModelFile,
            "rms_eps {} must be a positive number",
            self.rms_eps
        );
        ensure!(
            self.rope_theta > 0.0 && self.rope_theta.is_finite(),
            ModelFile,
            "rope_theta {} must be a positive number",
            self.rope_theta
        );
        ensure!(
            self.arch.sliding_window != Some(0),
            ModelFile,
            "sliding_window must be > 0"
        );
        let a = &self.arch;
        for (name, v) in [
            ("rope_theta_local", a.rope_theta_local),
            ("embed_scale", a.embed_scale),
            ("attn_scale", a.attn_scale),
            ("attn_softcap", a.attn_softcap),
            ("final_softcap", a.final_softcap),
        ] {
            ensure!(
                v.is_none_or(|v| v > 0.0 && v.is_finite()),
                ModelFile,
                "{name} {v:?} must be a positive number"
            );
        }
        ensure!(
            a.norm_offset.is_finite(),
            ModelFile,
            "norm_offset must be finite"
        );
        ensure!(
            a.relu_threshold >= 0.0 && a.relu_threshold.is_finite(),
            ModelFile,
            "relu_threshold {} must be a non-negative number",
            a.relu_threshold
        );
        ensure!(
            a.relu_threshold == 0.0 || self.activation == Activation::Relu,
            ModelFile,
            "relu_threshold (FATReLU) needs the ReLU activation"
        );
        Ok(())
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the key/value projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ModelConfig {
        ModelConfig {
            max_context: 32,
            ..crate::testing::tiny_config(Activation::Silu)
        }
    }

    #[test]
    fn validate_catches_bad_heads() {
        assert!(cfg().validate().is_ok());
        let mut c = cfg();
        c.n_kv_heads = 3;
        assert!(c.validate().is_err());
        let mut c = cfg();
        c.head_dim = 15;
        assert!(c.validate().is_err());
    }

    #[test]
    fn sliding_window_layers() {
        let mut a = ArchFeatures::default();
        assert_eq!(a.window(0), None);
        a.sliding_window = Some(8);
        assert_eq!((a.window(0), a.window(5)), (Some(8), Some(8)));
        a.swa_pattern = 2;
        assert_eq!(
            (a.window(0), a.window(1), a.window(2)),
            (Some(8), None, Some(8))
        );
        a.swa_pattern = 6;
        assert_eq!(
            (a.window(4), a.window(5), a.window(11)),
            (Some(8), None, None)
        );
        let mut c = cfg();
        c.arch.sliding_window = Some(0);
        assert!(c.validate().is_err());
    }

    #[test]
    fn activations() {
        assert_eq!(Activation::from_name("SiLU").unwrap(), Activation::Silu);
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!(Activation::from_name("tanh").is_err());
    }
}
