//! Model hyper-parameters of a llama-architecture decoder, as the engine needs them.

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
    fn activations() {
        assert_eq!(Activation::from_name("SiLU").unwrap(), Activation::Silu);
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!(Activation::from_name("tanh").is_err());
    }
}
