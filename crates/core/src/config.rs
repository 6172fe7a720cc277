//! Model hyper-parameters of a llama-style decoder, as the engine needs them, with what each
//! model family changes in the llama layer as data ([`ArchFeatures`]): adding a family is a
//! loader table entry plus, where it needs a new operation, one feature here and its step in
//! the forward pass, not a second forward pass.

use crate::error::Result;
use crate::mla_config::MlaFeatures;
use crate::moe_config::MoeFeatures;
use crate::rope::RopeScaling;
use crate::{bail, ensure};

/// How RoPE pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): GGUF llama files (their q/k rows are permuted at conversion).
    Norm,
    /// Halves (i, i + d/2): Hugging Face checkpoints (`rotate_half`).
    Neox,
}

impl RopeStyle {
    /// Parse "norm" / "neox".
    pub fn from_name(name: &str) -> Result<RopeStyle> {
        Ok(match name {
            "norm" => RopeStyle::Norm,
            "neox" => RopeStyle::Neox,
            _ => bail!(Unsupported, "rope style {name:?} (supported: norm, neox)"),
        })
    }

    /// The name [`RopeStyle::from_name`] reads.
    pub fn name(self) -> &'static str {
        match self {
            RopeStyle::Norm => "norm",
            RopeStyle::Neox => "neox",
        }
    }
}

/// The FFN gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    Relu,
    /// GELU's tanh approximation (llama.cpp's `ggml_gelu`, transformers' "gelu_pytorch_tanh").
    Gelu,
    /// The exact GELU, `x Φ(x)` with erf (transformers' "gelu": Falcon's HF checkpoints).
    GeluErf,
}

impl Activation {
    /// Parse "silu" / "swish" / "relu" / "gelu_erf" / "gelu*" (any other GELU name is the tanh
    /// approximation).
    pub fn from_name(name: &str) -> Result<Activation> {
        let n = name.to_ascii_lowercase();
        Ok(match n.as_str() {
            "silu" | "swish" => Activation::Silu,
            "relu" => Activation::Relu,
            "gelu_erf" => Activation::GeluErf,
            s if s.starts_with("gelu") => Activation::Gelu,
            _ => bail!(
                Unsupported,
                "activation {name:?} (supported: silu, relu, gelu, gelu_erf)"
            ),
        })
    }

    /// The canonical name ([`Activation::from_name`] reads it back).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluErf => "gelu_erf",
        }
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
            Activation::GeluErf => {
                0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
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
    /// With `qk_norm`: q and k are RMS-normed whole (weights of `q_dim` / `kv_dim`) rather
    /// than head by head (OLMoE).
    pub qk_norm_full: bool,
    /// Sliding-window attention: a token attends to the last `w` positions, itself included
    /// (distance < w), in the layers [`ArchFeatures::swa_pattern`] marks.
    pub sliding_window: Option<usize>,
    /// Which layers slide when a window is set: 0 = every layer (Mistral); p > 0 = all but each
    /// p-th layer, counted from 1 (Gemma 2: p = 2, odd layers global; Gemma 3: p = 6), or
    /// counted from 0 with [`ArchFeatures::swa_dense_first`].
    pub swa_pattern: usize,
    /// With `swa_pattern` p: the global layers are 0, p, 2p, ... (llama.cpp's `dense_first`;
    /// SmallThinker) instead of p-1, 2p-1, ...
    pub swa_dense_first: bool,
    /// Layers 0, p, 2p, ... apply no RoPE (llama.cpp's `n_no_rope_layer_step`; SmallThinker's
    /// global layers); 0: every layer rotates.
    pub no_rope_step: usize,
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
    /// A learned logit per query head (`blk.N.attn_sinks`, n_heads values) joins each
    /// softmax's denominator with no value (gpt-oss's attention sinks).
    pub attn_sinks: bool,
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
    /// Multi-head latent attention (DeepSeek-V2/V3); off by default.
    pub mla: MlaFeatures,
}

impl ArchFeatures {
    /// The attention window of layer `l` (None: the whole context).
    pub fn window(&self, l: usize) -> Option<usize> {
        let w = self.sliding_window?;
        match self.swa_pattern {
            0 => Some(w),
            p if self.swa_dense_first && l.is_multiple_of(p) => None,
            p if !self.swa_dense_first && (l + 1).is_multiple_of(p) => None,
            _ => Some(w),
        }
    }

    /// Whether layer `l` rotates q and k (see [`ArchFeatures::no_rope_step`]).
    pub fn rope_on(&self, l: usize) -> bool {
        match self.no_rope_step {
            0 => true,
            p => !l.is_multiple_of(p),
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

/// One tensor a model holds: its canonical name (llama.cpp's without `.weight`; biases keep
/// `.bias`), its shape as `rows x cols` for `y = W x` (a norm or bias vector is one row), and
/// whether the model needs it (an optional one is shape-checked where present).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorShape {
    pub name: &'static str,
    pub rows: usize,
    pub cols: usize,
    pub required: bool,
}

impl TensorShape {
    /// A required matrix.
    pub fn matrix(name: &'static str, rows: usize, cols: usize) -> TensorShape {
        TensorShape {
            name,
            rows,
            cols,
            required: true,
        }
    }

    /// A required norm or bias vector of `len` values.
    pub fn vector(name: &'static str, len: usize) -> TensorShape {
        TensorShape::matrix(name, 1, len)
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
    /// RoPE scaling and partial rotation (default: none, the whole head rotates).
    pub rope: RopeScaling,
    /// The mixture of experts (default: none, a dense FFN).
    pub moe: MoeFeatures,
}

impl ModelConfig {
    /// Check the numbers are consistent with each other.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("n_layers", self.n_layers),
            ("dim", self.dim),
            ("ffn_dim", self.ffn_dim),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_context", self.max_context),
        ] {
            ensure!(
                v > 0,
                Shape,
                "config {name} must be a positive integer, got {v}"
            );
        }
        ensure!(
            self.n_heads.is_multiple_of(self.n_kv_heads),
            Shape,
            "n_heads {} is not a multiple of n_kv_heads {}",
            self.n_heads,
            self.n_kv_heads
        );
        ensure!(
            self.head_dim.is_multiple_of(2),
            Shape,
            "head_dim must be even for RoPE, got {}",
            self.head_dim
        );
        ensure!(
            self.rms_eps > 0.0 && self.rms_eps.is_finite(),
            Shape,
            "rms_eps {} must be positive and finite",
            self.rms_eps
        );
        ensure!(
            self.rope_theta > 0.0 && self.rope_theta.is_finite(),
            Shape,
            "rope_theta {} must be positive and finite",
            self.rope_theta
        );
        self.validate_rope()?;
        self.moe.validate()?;
        let mla = &self.arch.mla;
        mla.validate(self.head_dim, self.n_kv_heads, self.rope_dims())?;
        ensure!(
            !mla.is_mla() || self.rope_style == RopeStyle::Norm,
            Unsupported,
            "latent attention with {} RoPE (DeepSeek's pairs are adjacent)",
            self.rope_style.name()
        );
        ensure!(
            self.moe.dense_lead <= self.n_layers,
            Shape,
            "{} leading dense layers in a {}-layer model",
            self.moe.dense_lead,
            self.n_layers
        );
        ensure!(
            !self.moe.is_moe() || !(self.arch.no_gate || self.arch.ffn_bias || self.arch.up_act),
            Unsupported,
            "experts without a gate, with FFN biases or an activated up projection"
        );
        ensure!(
            !self.arch.qk_norm_full || self.arch.qk_norm,
            Shape,
            "qk_norm_full needs qk_norm"
        );
        ensure!(
            self.arch.sliding_window != Some(0),
            Shape,
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
                Shape,
                "{name} {v:?} must be positive and finite"
            );
        }
        ensure!(
            a.norm_offset.is_finite(),
            Shape,
            "norm_offset must be finite"
        );
        ensure!(
            a.relu_threshold >= 0.0 && a.relu_threshold.is_finite(),
            Shape,
            "relu_threshold {} must be a non-negative number",
            a.relu_threshold
        );
        ensure!(
            a.relu_threshold == 0.0 || self.activation == Activation::Relu,
            Unsupported,
            "relu_threshold (FATReLU) needs the relu activation"
        );
        Ok(())
    }

    /// Values of each head that RoPE rotates (`head_dim` unless partial).
    pub fn rope_dims(&self) -> usize {
        if self.rope.dims == 0 {
            self.head_dim
        } else {
            self.rope.dims
        }
    }

    /// Whether layer `l` rotates with its own base ([`ArchFeatures::rope_theta_local`]: Gemma
    /// 3's sliding layers), unscaled, as in llama.cpp and HF.
    pub fn rope_local(&self, l: usize) -> bool {
        self.arch.window(l).is_some() && self.arch.rope_theta_local.is_some()
    }

    /// Width of the query projection output.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the key/value projection outputs.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `l`'s FFN is a mixture of experts (a MoE model's first
    /// [`MoeFeatures::dense_lead`] layers are dense).
    pub fn is_moe_layer(&self, l: usize) -> bool {
        self.moe.is_moe() && l >= self.moe.dense_lead
    }

    /// `Unsupported` for a model off the standard KV cache: `what` (the sparse modes,
    /// profiling, the GPU hybrid, the neuron store) runs over the standard attention's caches,
    /// which latent attention (DeepSeek) does not use. gpt-oss's biased experts with the
    /// clamped SwiGLU pass: the sparse modes and the profiler keep its biases (the gate and up
    /// biases before the activation, the down bias of every routed expert whatever its active
    /// set) and threshold on `|swiglu_oai(gate, up)|`, whose zeros are only where the clamped
    /// gate is 0 or the up value −1 (no exact-relu for it: that is its dense function).
    pub fn refuse_non_flat(&self, what: &str) -> Result<()> {
        ensure!(
            !self.arch.mla.is_mla(),
            Unsupported,
            "{what} on multi-head latent attention (DeepSeek-V2/V3): its latent KV cache and \
             absorbed projections run dense on the CPU only"
        );
        Ok(())
    }

    /// [`ModelConfig::refuse_non_flat`], and `Unsupported` for gpt-oss's expert biases, clamped
    /// SwiGLU and attention sinks: `what` (the neuron store) holds plain `down(act(gate)·up)`
    /// rows, without the biases such an expert adds.
    pub fn refuse_expert_biases(&self, what: &str) -> Result<()> {
        self.refuse_non_flat(what)?;
        ensure!(
            !(self.moe.expert_bias || self.moe.swiglu_limit.is_some() || self.arch.attn_sinks),
            Unsupported,
            "{what} on a mixture of experts with expert biases, the clamped SwiGLU or \
             attention sinks (gpt-oss): it runs from the mapped weights (dense, threshold or \
             predictor mode)"
        );
        Ok(())
    }

    /// [`ModelConfig::refuse_non_flat`], and `Unsupported` for a mixture of experts with
    /// leading dense layers (GLM-4.5's first_k_dense_replace): `what` (the neuron store) sizes
    /// its clusters for one neuron count in every layer, while such a model's layers have
    /// their own ([`ModelConfig::layer_neurons`]).
    pub fn refuse_uneven_layers(&self, what: &str) -> Result<()> {
        self.refuse_non_flat(what)?;
        ensure!(
            self.uniform_neurons(),
            Unsupported,
            "{what} on a mixture of experts with {} leading dense layers (GLM-4.5's \
             first_k_dense_replace): its layers' neuron counts differ ({} and {}); the sparse \
             modes, profiling and the GPU hybrid run it from the mapped weights",
            self.moe.dense_lead,
            self.ffn_dim,
            self.n_neurons()
        );
        Ok(())
    }

    /// The neurons of a mixture-of-experts layer's FFN as plans count them (`ffn_dim` for a
    /// dense model): the flattened space of its routed experts (`n_expert · expert_ffn`:
    /// neuron `e · expert_ffn + j` is row j of expert e, the merged tensors' own row order)
    /// followed by the shared expert's `shared_ffn_dim` neurons. A leading dense layer has its
    /// own count ([`ModelConfig::layer_neurons`]).
    pub fn n_neurons(&self) -> usize {
        match self.moe.is_moe() {
            true => self.n_routed_neurons() + self.moe.shared_ffn_dim,
            false => self.ffn_dim,
        }
    }

    /// The routed experts' neurons of one layer (`n_expert · expert_ffn`; `ffn_dim` for a
    /// dense FFN): the first part of [`ModelConfig::n_neurons`].
    pub fn n_routed_neurons(&self) -> usize {
        match self.moe.is_moe() {
            true => self.moe.n_expert * self.moe.expert_ffn(self.ffn_dim),
            false => self.ffn_dim,
        }
    }

    /// Layer `l`'s neurons as plans count them: [`ModelConfig::n_neurons`] for a layer of
    /// experts, `ffn_dim` (its plain gate, up and down rows) for a dense one (every layer of a
    /// dense model, a mixture of experts' first [`MoeFeatures::dense_lead`]).
    pub fn layer_neurons(&self, l: usize) -> usize {
        match self.is_moe_layer(l) {
            true => self.n_neurons(),
            false => self.ffn_dim,
        }
    }

    /// Layer `l`'s neurons the profiler counts and the sparse modes choose among: the routed
    /// experts' flattened space ([`ModelConfig::n_routed_neurons`]) for a layer of experts
    /// (its shared expert always runs), `ffn_dim` for a dense layer.
    pub fn layer_routed_neurons(&self, l: usize) -> usize {
        match self.is_moe_layer(l) {
            true => self.n_routed_neurons(),
            false => self.ffn_dim,
        }
    }

    /// [`ModelConfig::layer_neurons`] of every layer.
    pub fn neuron_counts(&self) -> Vec<usize> {
        (0..self.n_layers).map(|l| self.layer_neurons(l)).collect()
    }

    /// The most neurons of any layer ([`ModelConfig::layer_neurons`]): what buffers shared by
    /// every layer hold.
    pub fn max_neurons(&self) -> usize {
        match self.moe.dense_lead {
            0 => self.n_neurons(),
            _ => self.n_neurons().max(self.ffn_dim),
        }
    }

    /// Whether every layer has the same neuron count ([`ModelConfig::layer_neurons`]): all
    /// but a mixture of experts with leading dense layers of another width.
    pub fn uniform_neurons(&self) -> bool {
        !self.moe.is_moe() || self.moe.dense_lead == 0 || self.ffn_dim == self.n_neurons()
    }

    /// The tensors outside the layers, in file order (see [`TensorShape`]).
    pub fn global_tensors(&self) -> Vec<TensorShape> {
        let (d, a) = (self.dim, &self.arch);
        let mut out = vec![TensorShape::matrix("token_embd", self.vocab_size, d)];
        if a.learned_pos {
            let rows = self.max_context + a.pos_offset;
            out.push(TensorShape::matrix("position_embd", rows, d));
        }
        out.push(TensorShape::vector("output_norm", d));
        if a.layer_norm {
            out.push(TensorShape::vector("output_norm.bias", d));
        }
        out.push(TensorShape {
            required: false, // absent: the head is the embeddings (tied)
            ..TensorShape::matrix("output", self.vocab_size, d)
        });
        out
    }

    /// The tensors of a layer past the leading dense ones (a routed layer of a mixture of
    /// experts; any layer of a dense model): [`ModelConfig::layer_tensors_at`].
    pub fn layer_tensors(&self) -> Vec<TensorShape> {
        self.layer_tensors_at(usize::MAX)
    }

    /// The tensors of layer `l`, named without their `blk.N.` prefix, in file order: what
    /// the family's steps read (see [`TensorShape`]); a leading dense layer of a mixture of
    /// experts has a dense FFN of `ffn_dim`. The Python loaders' shape checks and the
    /// engine's weight table both read it.
    pub fn layer_tensors_at(&self, l: usize) -> Vec<TensorShape> {
        let (d, a) = (self.dim, &self.arch);
        let (q, kv) = (self.q_dim(), self.kv_dim());
        let (m, v) = (TensorShape::matrix, TensorShape::vector);
        let mut out = vec![v("attn_norm", d)];
        if a.layer_norm {
            out.push(v("attn_norm.bias", d));
        }
        if a.mla.is_mla() {
            out.extend(self.mla_tensors());
            return self.ffn_tensors_at(l, out);
        }
        out.extend([m("attn_q", q, d), m("attn_k", kv, d), m("attn_v", kv, d)]);
        if a.qkv_bias {
            out.extend([
                v("attn_q.bias", q),
                v("attn_k.bias", kv),
                v("attn_v.bias", kv),
            ]);
        }
        if a.qk_norm {
            let (nq, nk) = match a.qk_norm_full {
                true => (q, kv),
                false => (self.head_dim, self.head_dim),
            };
            out.extend([v("attn_q_norm", nq), v("attn_k_norm", nk)]);
        }
        out.push(m("attn_output", d, q));
        if a.out_bias {
            out.push(v("attn_output.bias", d));
        }
        if a.attn_sinks {
            out.push(v("attn_sinks", self.n_heads));
        }
        if a.post_norms {
            out.push(v("post_attention_norm", d));
        }
        self.ffn_tensors_at(l, out)
    }

    /// `out` (a layer's attention tensors) followed by layer `l`'s FFN tensors.
    fn ffn_tensors_at(&self, l: usize, mut out: Vec<TensorShape>) -> Vec<TensorShape> {
        let (d, a, f) = (self.dim, &self.arch, self.ffn_dim);
        let (m, v) = (TensorShape::matrix, TensorShape::vector);
        // A parallel block norms the FFN input with `attn_norm_2` where the file has one,
        // else with the attention's norm.
        let (ffn_norm, required) = match a.parallel {
            true => ("attn_norm_2", false),
            false => ("ffn_norm", true),
        };
        out.push(TensorShape {
            required,
            ..v(ffn_norm, d)
        });
        if a.layer_norm {
            let bias = if a.parallel {
                "attn_norm_2.bias"
            } else {
                "ffn_norm.bias"
            };
            out.push(TensorShape {
                required,
                ..v(bias, d)
            });
        }
        if self.is_moe_layer(l) {
            out.extend(self.moe_tensors());
            if a.post_norms {
                out.push(v("post_ffw_norm", d));
            }
            return out;
        }
        if !a.no_gate {
            out.push(m("ffn_gate", f, d));
        }
        out.push(m("ffn_up", f, d));
        if a.ffn_bias {
            out.push(v("ffn_up.bias", f));
        }
        out.push(m("ffn_down", d, f));
        if a.ffn_bias {
            out.push(v("ffn_down.bias", d));
        }
        if a.post_norms {
            out.push(v("post_ffw_norm", d));
        }
        out
    }
}

impl ModelConfig {
    /// A latent-attention layer's tensors (llama.cpp's `deepseek2`): the query (compressed,
    /// `attn_q_a` → `attn_q_a_norm` → `attn_q_b`, or one `attn_q`), the joint compression of
    /// keys and values with the rotated key (`attn_kv_a_mqa`, then `attn_kv_a_norm` on the
    /// latent part), the per-head absorptions (`attn_k_b`: per head `kv_lora_rank` rows of
    /// `qk_nope`; `attn_v_b`: per head `v_head_dim` rows of `kv_lora_rank`) and the output.
    fn mla_tensors(&self) -> Vec<TensorShape> {
        let (d, h, mla) = (self.dim, self.n_heads, &self.arch.mla);
        let (m, v) = (TensorShape::matrix, TensorShape::vector);
        let (r, qh) = (mla.kv_lora_rank, mla.q_head(self.rope_dims()));
        let mut out = match mla.q_lora_rank {
            0 => vec![m("attn_q", h * qh, d)],
            ql => vec![
                m("attn_q_a", ql, d),
                v("attn_q_a_norm", ql),
                m("attn_q_b", h * qh, ql),
            ],
        };
        out.extend([
            m("attn_kv_a_mqa", self.kv_dim(), d),
            v("attn_kv_a_norm", r),
            m("attn_k_b", h * r, mla.qk_nope),
            m("attn_v_b", h * mla.v_head_dim, r),
            m("attn_output", d, h * mla.v_head_dim),
        ]);
        out
    }

    /// A layer's expert tensors, in llama.cpp's file order: the router (`ffn_gate_inp`,
    /// `n_expert x dim`), the merged experts (expert `e` is rows `e·rows..(e+1)·rows` of each:
    /// `ffn_gate_exps` and `ffn_up_exps` of `expert_ffn` rows, `ffn_down_exps` of `dim` rows),
    /// then the shared expert and its gate where the family has them.
    fn moe_tensors(&self) -> Vec<TensorShape> {
        let (d, m) = (self.dim, &self.moe);
        let (e, ef, sf) = (m.n_expert, m.expert_ffn(self.ffn_dim), m.shared_ffn_dim);
        let mut out = vec![
            TensorShape::matrix("ffn_gate_inp", e, d),
            TensorShape::matrix("ffn_gate_exps", e * ef, d),
            TensorShape::matrix("ffn_up_exps", e * ef, d),
            TensorShape::matrix("ffn_down_exps", e * d, ef),
        ];
        if m.score_bias {
            out.push(TensorShape::vector("exp_probs_b.bias", e));
        }
        if m.expert_bias {
            out.extend([
                TensorShape::vector("ffn_gate_inp.bias", e),
                TensorShape::vector("ffn_gate_exps.bias", e * ef),
                TensorShape::vector("ffn_up_exps.bias", e * ef),
                TensorShape::vector("ffn_down_exps.bias", e * d),
            ]);
        }
        if sf > 0 {
            if m.shared_gate {
                out.push(TensorShape::vector("ffn_gate_inp_shexp", d));
            }
            out.extend([
                TensorShape::matrix("ffn_gate_shexp", sf, d),
                TensorShape::matrix("ffn_up_shexp", sf, d),
                TensorShape::matrix("ffn_down_shexp", d, sf),
            ]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_tensors_replace_the_ffn() {
        let mut c = cfg();
        c.moe = MoeFeatures {
            n_expert: 4,
            n_expert_used: 2,
            expert_ffn_dim: 32,
            shared_ffn_dim: 48,
            shared_gate: true,
            ..Default::default()
        };
        c.validate().unwrap();
        let l = c.layer_tensors();
        let get = |n: &str| l.iter().find(|t| t.name == n).map(|t| (t.rows, t.cols));
        assert_eq!(get("ffn_gate"), None);
        assert_eq!(get("ffn_gate_inp"), Some((4, 64)));
        assert_eq!(get("ffn_up_exps"), Some((4 * 32, 64)));
        assert_eq!(get("ffn_down_exps"), Some((4 * 64, 32)));
        assert_eq!(get("ffn_gate_inp_shexp"), Some((1, 64)));
        assert_eq!(get("ffn_down_shexp"), Some((64, 48)));
        c.arch.no_gate = true;
        assert!(matches!(c.validate(), Err(crate::Error::Unsupported(_))));
        c.arch.no_gate = false;
        (c.arch.qk_norm, c.arch.qk_norm_full) = (true, true);
        let l = c.layer_tensors();
        let q = l.iter().find(|t| t.name == "attn_q_norm").unwrap();
        assert_eq!(q.cols, c.q_dim());
        // Without leading dense layers every layer is the flattened expert space.
        assert!(c.uniform_neurons() && c.neuron_counts() == vec![4 * 32 + 48; c.n_layers]);
        assert_eq!(cfg().neuron_counts(), vec![cfg().ffn_dim; c.n_layers]);
        // GLM-4.5: a leading dense layer, the router's correction bias on the others.
        (c.moe.dense_lead, c.moe.score_bias) = (1, true);
        c.validate().unwrap();
        let names = |l: usize| -> Vec<_> { c.layer_tensors_at(l).iter().map(|t| t.name).collect() };
        assert!(names(0).contains(&"ffn_gate") && !names(0).contains(&"ffn_gate_inp"));
        assert!(names(1).contains(&"exp_probs_b.bias") && !names(1).contains(&"ffn_up"));
        assert_eq!(c.layer_tensors(), c.layer_tensors_at(1));
        assert!(!c.is_moe_layer(0) && c.is_moe_layer(1));
        // Each layer's own neuron space: the dense lead's ffn_dim, the experts' flattened one.
        let moe_neurons = 4 * 32 + 48;
        assert_eq!(c.n_neurons(), moe_neurons);
        assert_eq!(
            (c.layer_neurons(0), c.layer_neurons(1)),
            (c.ffn_dim, moe_neurons)
        );
        assert_eq!(
            (c.layer_routed_neurons(0), c.layer_routed_neurons(1)),
            (c.ffn_dim, 128)
        );
        let mut want = vec![moe_neurons; c.n_layers];
        want[0] = c.ffn_dim;
        assert_eq!(c.neuron_counts(), want);
        assert!(!c.uniform_neurons());
        assert_eq!(c.max_neurons(), moe_neurons.max(c.ffn_dim));
        assert!(c.refuse_non_flat("x").is_ok());
        assert!(matches!(
            c.refuse_uneven_layers("x"),
            Err(crate::Error::Unsupported(_))
        ));
        c.moe.dense_lead = c.n_layers + 1;
        assert!(c.validate().is_err());
    }

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
    fn tensor_lists_follow_the_features() {
        let names = |c: &ModelConfig| -> Vec<(&str, bool)> {
            let mut v: Vec<_> = c
                .global_tensors()
                .into_iter()
                .chain(c.layer_tensors())
                .collect();
            v.sort_by_key(|t| t.name);
            v.into_iter().map(|t| (t.name, t.required)).collect()
        };
        let llama = cfg();
        let l = llama.layer_tensors();
        assert_eq!(l.len(), 9);
        let down = l.iter().find(|t| t.name == "ffn_down").unwrap();
        assert_eq!((down.rows, down.cols), (llama.dim, llama.ffn_dim));
        assert!(names(&llama).contains(&("output", false)));
        // OPT: LayerNorm biases, learned positions, biases everywhere, no gate.
        let mut opt = cfg();
        let a = &mut opt.arch;
        (a.layer_norm, a.learned_pos, a.pos_offset, a.no_gate) = (true, true, 2, true);
        (a.ffn_bias, a.out_bias, a.qkv_bias) = (true, true, true);
        let n = names(&opt);
        for want in [
            "position_embd",
            "output_norm.bias",
            "attn_norm.bias",
            "ffn_norm.bias",
            "attn_q.bias",
            "attn_output.bias",
            "ffn_up.bias",
            "ffn_down.bias",
        ] {
            assert!(n.contains(&(want, true)), "{want}");
        }
        assert!(!n.iter().any(|(t, _)| *t == "ffn_gate"));
        let pos = opt.global_tensors()[1];
        assert_eq!((pos.name, pos.rows), ("position_embd", opt.max_context + 2));
        // Falcon: the FFN's norm is an optional attn_norm_2 (else the attention's).
        let mut falcon = cfg();
        (falcon.arch.parallel, falcon.arch.layer_norm) = (true, true);
        let n = names(&falcon);
        assert!(n.contains(&("attn_norm_2", false)) && n.contains(&("attn_norm_2.bias", false)));
        assert!(!n.iter().any(|(t, _)| *t == "ffn_norm"));
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
        // SmallThinker: layers 0, 4, 8 global (and without RoPE).
        (a.swa_pattern, a.swa_dense_first, a.no_rope_step) = (4, true, 4);
        assert_eq!(
            (a.window(0), a.window(3), a.window(4)),
            (None, Some(8), None)
        );
        assert_eq!(
            (a.rope_on(0), a.rope_on(1), a.rope_on(8)),
            (false, true, false)
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
        assert_eq!(
            Activation::from_name("gelu_erf").unwrap(),
            Activation::GeluErf
        );
        assert_eq!(Activation::from_name("gelu_new").unwrap(), Activation::Gelu);
        // x Φ(x) against float64 values (math.erf); the tanh form is 4.4e-4 off at ±2.5.
        let exact = [
            (1.0f32, 0.841_344_746_068_543f64),
            (-2.0, -0.045_500_263_896_358),
            (0.5, 0.345_731_230_637_007),
            (2.5, 2.484_475_836_685_56),
        ];
        for (x, want) in exact {
            assert!(
                (Activation::GeluErf.apply(x) as f64 - want).abs() < 4e-7,
                "{x}"
            );
        }
        assert!((Activation::Gelu.apply(2.5) as f64 - 2.484_475_836_685_56).abs() > 4e-4);
    }
}
