//! Multi-head latent attention (DeepSeek-V2/V3, llama.cpp's `deepseek2`), as the config
//! describes it: the ranks of the query's and the keys' compression and the head widths, and
//! the attention shape it makes (MQA over the latent, as llama.cpp runs it).
//!
//! With MLA on, the model's `head_dim` is the latent key's width (`kv_lora_rank + rope dims`,
//! the GGUF's `key_length`), `n_kv_heads` is 1 and `rope.dims` the rotated part (its
//! `qk_rope_head_dim`), so `kv_dim()` is one cached row per position: the normed latent `c_kv`
//! followed by the rotated `k_pe`. The values are the latent part of the same row
//! (`value_length = kv_lora_rank`), held once.

use crate::ensure;
use crate::error::Result;

/// The latent attention's widths; `MlaFeatures::default()` (a `kv_lora_rank` of 0) is ordinary
/// attention.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MlaFeatures {
    /// Width of the compressed keys and values, `c_kv` (`attention.kv_lora_rank`); 0: no MLA.
    pub kv_lora_rank: usize,
    /// Width of the compressed query (`attention.q_lora_rank`); 0: the query is one
    /// projection (`attn_q`, DeepSeek-V2-Lite).
    pub q_lora_rank: usize,
    /// Values of each query head that meet the latent through `attn_k_b`
    /// (`qk_nope_head_dim`: `key_length_mla` less the rope dims).
    pub qk_nope: usize,
    /// Width of each head's output after `attn_v_b` (`value_length_mla`, `v_head_dim`).
    pub v_head_dim: usize,
}

impl MlaFeatures {
    /// Whether the model's attention is latent.
    pub fn is_mla(&self) -> bool {
        self.kv_lora_rank > 0
    }

    /// Check the widths against the model's head shape (`head_dim`, `n_kv_heads`, the rotated
    /// dims).
    pub fn validate(&self, head_dim: usize, n_kv_heads: usize, rope_dims: usize) -> Result<()> {
        if !self.is_mla() {
            return Ok(());
        }
        ensure!(
            n_kv_heads == 1,
            Shape,
            "latent attention caches one key row (n_kv_heads 1), got {n_kv_heads}"
        );
        ensure!(
            rope_dims > 0 && rope_dims.is_multiple_of(2) && rope_dims < head_dim,
            Shape,
            "latent attention's rope dims {rope_dims} must be even and inside head_dim {head_dim}"
        );
        ensure!(
            head_dim == self.kv_lora_rank + rope_dims,
            Shape,
            "latent attention's head_dim {head_dim} is not kv_lora_rank {} + rope dims {rope_dims}",
            self.kv_lora_rank
        );
        ensure!(
            self.qk_nope > 0 && self.v_head_dim > 0,
            Shape,
            "latent attention needs qk_nope ({}) and v_head_dim ({}) > 0",
            self.qk_nope,
            self.v_head_dim
        );
        Ok(())
    }

    /// Width of one head of the projected query (`qk_nope + rope_dims`).
    pub fn q_head(&self, rope_dims: usize) -> usize {
        self.qk_nope + rope_dims
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::tiny_config;
    use crate::{Activation, Error, ModelConfig, RopeStyle};

    /// A DeepSeek-like config: 4 heads over a latent of 32 with 16 rotated dims.
    fn mla(q_lora_rank: usize) -> ModelConfig {
        let mut c = tiny_config(Activation::Silu);
        (c.n_heads, c.n_kv_heads, c.head_dim, c.rope.dims) = (4, 1, 48, 16);
        c.rope_style = RopeStyle::Norm;
        c.arch.mla = super::MlaFeatures {
            kv_lora_rank: 32,
            q_lora_rank,
            qk_nope: 24,
            v_head_dim: 20,
        };
        c
    }

    #[test]
    fn the_latent_attention_lists_its_tensors_and_checks_its_widths() {
        let c = mla(40);
        c.validate().unwrap();
        let l = c.layer_tensors();
        let get = |n: &str| l.iter().find(|t| t.name == n).map(|t| (t.rows, t.cols));
        let d = c.dim;
        assert_eq!(get("attn_q_a"), Some((40, d)));
        assert_eq!(get("attn_q_b"), Some((4 * 40, 40)));
        assert_eq!(get("attn_kv_a_mqa"), Some((48, d)));
        assert_eq!(get("attn_k_b"), Some((4 * 32, 24)));
        assert_eq!(get("attn_v_b"), Some((4 * 20, 32)));
        assert_eq!(get("attn_output"), Some((d, 4 * 20)));
        assert_eq!(
            (get("attn_q"), get("attn_k"), get("attn_v")),
            (None, None, None)
        );
        let lite = mla(0).layer_tensors();
        assert!(lite.iter().any(|t| t.name == "attn_q" && t.rows == 4 * 40));
        assert_eq!(
            c.kv_dim(),
            48,
            "one cached row: the latent and the rotated key"
        );
        let bad = |f: fn(&mut ModelConfig)| {
            let mut c = mla(40);
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(bad(|c| c.n_kv_heads = 2), Error::Shape(_)));
        assert!(matches!(bad(|c| c.head_dim = 50), Error::Shape(_)));
        assert!(matches!(bad(|c| c.arch.mla.qk_nope = 0), Error::Shape(_)));
        assert!(matches!(
            bad(|c| c.rope_style = RopeStyle::Neox),
            Error::Unsupported(_)
        ));
        assert!(matches!(
            c.refuse_non_flat("a sparse mode"),
            Err(Error::Unsupported(_))
        ));
    }
}
