//! RoPE as the engine applies it: what scales the angles and the magnitude of the rotation
//! ([`RopeScaling`], a part of [`ModelConfig`]), checked once, and the per-layer-kind tables
//! every backend rotates with ([`RopeFreqs`]), so the CPU and the GPU turn the same bits.
//!
//! The loaders turn each file format's scaling into these fields (python/powerinfer_rs/loading/
//! rope.py): linear scaling, Llama 3.1's "llama3" factors and YaRN's interpolation ramp become
//! per-pair divisors of the frequencies, YaRN's and LongRoPE's attention factor the magnitude,
//! and LongRoPE's two factor sets stay two, chosen by the context
//! ([`ModelConfig::for_context`](crate::ModelConfig::for_context)).

/// What changes RoPE's angles beyond the base `theta`, and how much of each head rotates.
/// `RopeScaling::default()` is plain RoPE over the whole head.
///
/// Pair `i` (of `rope_dims / 2`) of a head at position `p` turns by
/// `p · theta^(−2i / rope_dims) / linear_factor / freq_factors[i]`, as llama.cpp's `rope_ext`
/// computes it (`freq_scale = 1 / linear_factor`, `freq_factors` = the `rope_freqs` tensor) and
/// as Hugging Face's `inv_freq` does (linear: `inv_freq / factor`; llama3: `inv_freq` divided
/// per pair; YaRN: its blend of interpolated and extrapolated frequencies, a divisor per pair),
/// and the rotated values are then multiplied by `attn_factor` (llama.cpp's `mscale` on cos and
/// sin, HF's `attention_scaling`). Only the first `rope_dims` values of each head rotate, in the
/// model's [`RopeStyle`](crate::RopeStyle) (norm: pairs `(2i, 2i+1)`; neox: `(i, i +
/// rope_dims/2)`); the rest pass through (llama.cpp's `n_rot < head_dim`, HF's
/// `partial_rotary_factor`). Layers with their own base (Gemma 3's sliding layers) are not
/// scaled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RopeScaling {
    /// Rotated values at the start of each head; 0 means all of `head_dim`.
    pub dims: usize,
    /// Linear scaling: positions divided by this (None: 1).
    pub linear_factor: Option<f32>,
    /// Per-pair frequency divisors, `rope_dims / 2` of them (Llama 3.1's "llama3" scaling,
    /// YaRN's ramp, LongRoPE's short factors); empty: none.
    pub freq_factors: Vec<f32>,
    /// The magnitude of the rotation: cos and sin times this, so each attention score of a
    /// scaled layer is scaled by its square (YaRN's `0.1 · ln(factor) + 1`, LongRoPE's
    /// `sqrt(1 + ln(scale) / ln(original))`; llama.cpp's `attn_factor`). None: 1.
    pub attn_factor: Option<f32>,
    /// LongRoPE: the per-pair divisors for a context of more than `original_context` positions,
    /// in place of `freq_factors` (Phi-3's `rope_factors_long`; `freq_factors` then holds the
    /// short ones); empty: none.
    /// [`ModelConfig::for_context`](crate::ModelConfig::for_context) makes the choice.
    pub long_factors: Vec<f32>,
    /// LongRoPE: the context the short factors serve (the model's original context length).
    pub original_context: usize,
}

impl RopeScaling {
    /// Whether anything scales the angles or the magnitude (a layer with its own base ignores
    /// the scaling).
    pub fn scales(&self) -> bool {
        self.linear_factor.is_some()
            || !self.freq_factors.is_empty()
            || self.attn_factor.is_some()
            || !self.long_factors.is_empty()
    }
}

/// One kind of layer's rotation (the global layers', or the sliding layers' with their own
/// base): the angle per position of each rotated pair and the magnitude.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeFreqs {
    /// Radians per position of each rotated pair, in f64: positions reach tens of thousands of
    /// radians, where f32 loses the phase.
    pub inv: Vec<f64>,
    /// What cos and sin are multiplied by (1: a plain rotation).
    pub mscale: f64,
}

impl RopeFreqs {
    /// A plain rotation (magnitude 1) by `inv`.
    pub fn plain(inv: Vec<f64>) -> RopeFreqs {
        RopeFreqs { inv, mscale: 1.0 }
    }

    /// Rotated pairs per head.
    pub fn pairs(&self) -> usize {
        self.inv.len()
    }

    /// `mscale · cos(pos · inv[i])` and `mscale · sin(pos · inv[i])`, formed in f64 and
    /// rounded to f32: the one definition the CPU's tables and the GPU kernel's arguments are
    /// made with, so every backend, and every row of a batch, rotates the same bits.
    #[inline]
    pub fn cos_sin(&self, pos: usize, i: usize) -> (f32, f32) {
        let (s, c) = (pos as f64 * self.inv[i]).sin_cos();
        ((c * self.mscale) as f32, (s * self.mscale) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cos_sin_scales_the_rotation_and_keeps_plain_bits() {
        let f = RopeFreqs::plain(vec![0.5, 0.01]);
        let (s, c) = (77.0f64 * 0.5).sin_cos();
        assert_eq!(f.cos_sin(77, 0), (c as f32, s as f32));
        let m = RopeFreqs {
            mscale: 1.5,
            ..f.clone()
        };
        assert_eq!(m.cos_sin(77, 1), {
            let (s, c) = (0.77f64).sin_cos();
            ((c * 1.5) as f32, (s * 1.5) as f32)
        });
        assert_eq!(f.pairs(), 2);
    }
}
