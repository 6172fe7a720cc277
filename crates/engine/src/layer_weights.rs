//! One decoder layer's weights, and how they are taken out of a model file's tensors by their
//! canonical names (`blk.N.attn_q`, ...): the attention's projections, the FFN (dense, or a
//! mixture of experts'), the norms and the biases the family has. Below the model's weights
//! ([`crate::weights`]) and everything that reads a layer.

use std::collections::HashMap;

use powerinfer_core::{bail, ensure, MatrixShape, ModelConfig, Result, Weight};
use powerinfer_cpu::{Interleaved, Matrix};

use crate::moe_weights::{ExpertBias, MoeWeights, SharedExpert};

/// One decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// The attention's projections, interleaved at load where their format has that layout
    /// ([`Matrix::for_products`]): only whole-matrix products read them.
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub ffn_norm: Vec<f32>,
    /// The FFN's gate, up and down projections. In a mixture-of-experts layer these are the
    /// merged expert tensors as the file stores them (`ffn_gate_exps` and `ffn_up_exps` of
    /// `n_expert × expert_ffn` rows, `ffn_down_exps` of `n_expert × dim` rows of `expert_ffn`):
    /// the flattened neuron space the planner sees, which no dense-FFN product accepts (the
    /// down matrix has the wrong shape); [`LayerWeights::moe`] holds the per-expert views.
    ///
    /// A dense FFN's are interleaved at load where the model is loaded for dense decoding
    /// ([`Layouts::ffn`]) and their format has that layout; the paths that read rows by index
    /// take them through [`Matrix::indexed`].
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    /// The router, per-expert views and shared expert of a mixture-of-experts layer.
    pub moe: Option<MoeWeights>,
    /// Biases of q, k and v (families with [`ArchFeatures::qkv_bias`]).
    ///
    /// [`ArchFeatures::qkv_bias`]: powerinfer_core::ArchFeatures::qkv_bias
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// Per-head RMSNorm weights of q and k, `head_dim` each (families with
    /// [`ArchFeatures::qk_norm`]).
    ///
    /// [`ArchFeatures::qk_norm`]: powerinfer_core::ArchFeatures::qk_norm
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// Norms of the attention output and of the FFN output before their residual adds
    /// (families with `post_norms`).
    pub post_norms: Option<[Vec<f32>; 2]>,
    /// LayerNorm biases of `attn_norm` and `ffn_norm` (families with `layer_norm`).
    pub norm_bias: Option<[Vec<f32>; 2]>,
    /// Bias of the attention output projection (`out_bias`).
    pub out_bias: Option<Vec<f32>>,
    /// Biases of the FFN's activated input projection (ffn wide) and of its down projection
    /// (dim wide) (`ffn_bias`).
    pub ffn_bias: Option<[Vec<f32>; 2]>,
    /// Each query head's attention sink logit (`attn_sinks`, n_heads values; families with
    /// [`ArchFeatures::attn_sinks`]).
    ///
    /// [`ArchFeatures::attn_sinks`]: powerinfer_core::ArchFeatures::attn_sinks
    pub attn_sinks: Option<Vec<f32>>,
    /// A latent-attention layer's query compression, latent norm and per-head absorptions
    /// (DeepSeek-V2/V3); `wq` is then `attn_q_b` (or `attn_q`), `wk` `attn_kv_a_mqa` and `wv`
    /// the same matrix again (never read).
    pub mla: Option<crate::mla_weights::MlaWeights>,
}

/// Which of a model's matrices are interleaved at load where their format has the layout
/// ([`Matrix::for_products`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layouts {
    /// The attention's projections and the output head: only whole-matrix products read them
    /// (on by default).
    pub attention: bool,
    /// A dense FFN's gate, up and down: for a model decoded dense on the CPU. The sparse
    /// modes, the neuron store and the GPU's hot rows read gate and up rows by index, and on
    /// an interleaved FFN gather a row-major copy on first use ([`Matrix::indexed`]).
    pub ffn: bool,
}

impl Layouts {
    /// The attention's and the head's interleaved, the FFN's rows kept (the default).
    pub const DEFAULT: Layouts = Layouts {
        attention: true,
        ffn: false,
    };
    /// Every matrix in the file's rows.
    pub const ROWS: Layouts = Layouts {
        attention: false,
        ffn: false,
    };
    /// Every whole-matrix product's matrix interleaved (dense decoding on the CPU).
    pub const DENSE: Layouts = Layouts {
        attention: true,
        ffn: true,
    };

    /// Whether the load repacks the tensor of canonical name `name` and shape `shape` (a
    /// layer's matrices and the head by these layouts, the formats with an interleaved layout;
    /// a tied embedding table is not counted).
    pub fn repacks(&self, name: &str, shape: MatrixShape) -> bool {
        let which = match name.split('.').collect::<Vec<_>>()[..] {
            ["output"] => self.attention,
            ["blk", _, "attn_q" | "attn_k" | "attn_v" | "attn_output"] => self.attention,
            // Latent attention's whole-matrix products (DeepSeek); its per-head attn_k_b and
            // attn_v_b views stay the file's rows.
            ["blk", _, "attn_q_a" | "attn_q_b" | "attn_kv_a_mqa"] => self.attention,
            ["blk", _, "ffn_gate" | "ffn_up" | "ffn_down"] => self.ffn,
            // Packed for the decode pass beside the file's rows, which stay where they are.
            ["blk", _, "ffn_gate_exps" | "ffn_up_exps" | "ffn_down_exps"] => self.ffn,
            _ => false,
        };
        which && powerinfer_cpu::interleaving() && Interleaved::pays(shape)
    }

    /// `w` as a matrix, interleaved when `on` (and its format allows).
    pub(crate) fn matrix(on: bool, w: Weight) -> Result<Matrix> {
        match on {
            true => Matrix::for_products(w),
            false => Ok(Matrix::Rows(w)),
        }
    }
}

impl Default for Layouts {
    fn default() -> Layouts {
        Layouts::DEFAULT
    }
}

/// Take a tensor out of the map (its shape checked already, by the model's `check_shapes`).
pub(crate) fn take(map: &mut HashMap<String, Weight>, name: &str) -> Result<Weight> {
    match map.remove(name) {
        Some(w) => Ok(w),
        None => bail!(ModelFile, "missing tensor {name}"),
    }
}

/// A norm or bias vector as f32, whatever its stored format.
pub(crate) fn take_vector(map: &mut HashMap<String, Weight>, name: &str) -> Result<Vec<f32>> {
    let w = take(map, name)?;
    let mut out = vec![0.0f32; w.cols];
    powerinfer_cpu::dequantize_row(w.dtype, w.row(0), &mut out)?;
    ensure!(
        out.iter().all(|v| v.is_finite()),
        ModelFile,
        "tensor {name} holds non-finite values"
    );
    Ok(out)
}

/// A norm vector with the family's offset folded in (Gemma's `1 + w`).
pub(crate) fn take_norm(
    map: &mut HashMap<String, Weight>,
    name: &str,
    offset: f32,
) -> Result<Vec<f32>> {
    let mut w = take_vector(map, name)?;
    if offset != 0.0 {
        w.iter_mut().for_each(|v| *v += offset);
    }
    Ok(w)
}

/// The tensors of layer `i` (`blk.{i}.*`) in the map they are taken from.
struct LayerTensors<'a> {
    i: usize,
    map: &'a mut HashMap<String, Weight>,
    /// The family's norm offset ([`take_norm`]).
    norm_offset: f32,
}

impl LayerTensors<'_> {
    /// The canonical name of this layer's tensor `s`.
    fn name(&self, s: &str) -> String {
        format!("blk.{}.{s}", self.i)
    }

    /// Whether the map still holds tensor `s`.
    fn has(&self, s: &str) -> bool {
        self.map.contains_key(&self.name(s))
    }

    /// Tensor `s` ([`take`]).
    fn take(&mut self, s: &str) -> Result<Weight> {
        let name = self.name(s);
        take(self.map, &name)
    }

    /// Vector `s` as f32 ([`take_vector`]).
    fn vector(&mut self, s: &str) -> Result<Vec<f32>> {
        let name = self.name(s);
        take_vector(self.map, &name)
    }

    /// Norm `s` with the family's offset ([`take_norm`]).
    fn norm(&mut self, s: &str) -> Result<Vec<f32>> {
        let name = self.name(s);
        take_norm(self.map, &name, self.norm_offset)
    }
}

/// A layer's FFN tensors as the file gives them.
struct FfnTensors {
    gate: Weight,
    up: Weight,
    down: Weight,
    moe: Option<MoeWeights>,
    /// The transposed down projection the file gives (PowerInfer's `ffn_down_t`).
    down_t: Option<Weight>,
}

/// A layer's norms: the attention's, the FFN's, q and k's, the two post norms.
struct LayerNorms {
    attn: Vec<f32>,
    ffn: Vec<f32>,
    qk: Option<[Vec<f32>; 2]>,
    post: Option<[Vec<f32>; 2]>,
}

/// A layer's biases (see the fields of [`LayerWeights`] of the same names).
struct LayerBiases {
    norm: Option<[Vec<f32>; 2]>,
    out: Option<Vec<f32>>,
    ffn: Option<[Vec<f32>; 2]>,
    qkv: Option<[Vec<f32>; 3]>,
}

impl LayerWeights {
    /// Layer `i`'s tensors taken out of `tensors` (their shapes checked already), with the
    /// transposed down projection the file gives for a dense FFN, if it does.
    pub(crate) fn take(
        c: &ModelConfig,
        i: usize,
        tensors: &mut HashMap<String, Weight>,
    ) -> Result<(LayerWeights, Option<Weight>)> {
        let mut t = LayerTensors {
            i,
            map: tensors,
            norm_offset: c.arch.norm_offset,
        };
        let (wq, wk, wv, mla) = match c.arch.mla.is_mla() {
            true => take_mla(c, &mut t)?,
            false => (
                Matrix::Rows(t.take("attn_q")?),
                Matrix::Rows(t.take("attn_k")?),
                Matrix::Rows(t.take("attn_v")?),
                None,
            ),
        };
        let wo = Matrix::Rows(t.take("attn_output")?);
        let ffn = match c.is_moe_layer(i) {
            true => take_moe_ffn(c, &mut t)?,
            false => take_dense_ffn(c, &mut t)?,
        };
        // Parallel blocks norm the FFN input with `attn_norm_2`, or share the attention's.
        let ffn_norm_name = match c.arch.parallel {
            true if t.has("attn_norm_2") => Some("attn_norm_2"),
            true => None,
            false => Some("ffn_norm"),
        };
        let norms = take_norms(c, &mut t, ffn_norm_name)?;
        let biases = take_biases(c, &mut t, ffn_norm_name)?;
        let attn_sinks = match c.arch.attn_sinks {
            true => Some(t.vector("attn_sinks")?),
            false => None,
        };
        let (w_gate, w_up, w_down) = (
            Matrix::Rows(ffn.gate),
            Matrix::Rows(ffn.up),
            Matrix::Rows(ffn.down),
        );
        let layer = LayerWeights {
            attn_norm: norms.attn,
            wq,
            wk,
            wv,
            wo,
            ffn_norm: norms.ffn,
            w_gate,
            w_up,
            w_down,
            moe: ffn.moe,
            qkv_bias: biases.qkv,
            qk_norm: norms.qk,
            post_norms: norms.post,
            norm_bias: biases.norm,
            out_bias: biases.out,
            ffn_bias: biases.ffn,
            attn_sinks,
            mla,
        };
        Ok((layer, ffn.down_t))
    }

    /// Repack the matrices `layouts` names in their interleaved layout where the format has
    /// one (the file's rows dropped as each is done). A mixture of experts' merged tensors
    /// keep the file's rows (the batched and row-by-index paths read them expert by expert)
    /// and, with `layouts.ffn`, gain an interleaved copy for the decode pass
    /// ([`MoeWeights::pack`]).
    pub(crate) fn interleave(&mut self, layouts: Layouts) -> Result<()> {
        let ffn = layouts.ffn && self.moe.is_none();
        if let (true, Some(moe)) = (layouts.ffn, &mut self.moe) {
            let merged = [&self.w_gate, &self.w_up, &self.w_down].map(Matrix::as_rows);
            if let [Some(g), Some(u), Some(d)] = merged {
                moe.pack([g, u, d])?;
            }
        }
        let attn = [&mut self.wq, &mut self.wk, &mut self.wo];
        let ffn_mats = [&mut self.w_gate, &mut self.w_up, &mut self.w_down];
        for m in attn.into_iter().filter(|_| layouts.attention) {
            repack(m)?;
        }
        match &mut self.mla {
            // `wv` is `wk` again, never read: not repacked a second time.
            Some(mla) => {
                if let (true, Some((q_a, _))) = (layouts.attention, &mut mla.q_a) {
                    repack(q_a)?;
                }
            }
            None if layouts.attention => repack(&mut self.wv)?,
            None => {}
        }
        for m in ffn_mats.into_iter().filter(|_| ffn) {
            repack(m)?;
        }
        Ok(())
    }
}

/// A latent-attention layer's `wq` (`attn_q_b`, or `attn_q` without a query compression),
/// `wk` (`attn_kv_a_mqa`), `wv` (the same again) and the rest of its weights.
fn take_mla(
    c: &ModelConfig,
    t: &mut LayerTensors<'_>,
) -> Result<(
    Matrix,
    Matrix,
    Matrix,
    Option<crate::mla_weights::MlaWeights>,
)> {
    let (wq, q_a) = match c.arch.mla.q_lora_rank {
        0 => (t.take("attn_q")?, None),
        _ => {
            let q_a = (t.take("attn_q_a")?, t.norm("attn_q_a_norm")?);
            (t.take("attn_q_b")?, Some(q_a))
        }
    };
    let kv_a = t.take("attn_kv_a_mqa")?;
    let kv_norm = t.norm("attn_kv_a_norm")?;
    let (k_b, v_b) = (t.take("attn_k_b")?, t.take("attn_v_b")?);
    let mla = crate::mla_weights::MlaWeights::new(c, q_a, kv_norm, &k_b, &v_b)?;
    let wk = Matrix::Rows(kv_a.clone());
    Ok((Matrix::Rows(wq), wk, Matrix::Rows(kv_a), Some(mla)))
}

/// `m` in its interleaved layout where its format has one ([`Matrix::for_products`]).
fn repack(m: &mut Matrix) -> Result<()> {
    if let Matrix::Rows(w) = m {
        *m = Matrix::for_products(w.clone())?;
    }
    Ok(())
}

/// A mixture of experts' FFN: the router (with its correction bias where the family has one),
/// the merged expert tensors (viewed per expert) and the shared expert where the family has
/// one, with its gate.
fn take_moe_ffn(c: &ModelConfig, t: &mut LayerTensors<'_>) -> Result<FfnTensors> {
    let gate_inp = match (c.moe.shared_ffn_dim, c.moe.shared_gate) {
        (1.., true) => Some(t.vector("ffn_gate_inp_shexp")?),
        _ => None,
    };
    let (router, gate, up, down) = (
        t.take("ffn_gate_inp")?,
        t.take("ffn_gate_exps")?,
        t.take("ffn_up_exps")?,
        t.take("ffn_down_exps")?,
    );
    let shared = match c.moe.shared_ffn_dim {
        0 => None,
        _ => Some(SharedExpert {
            gate_inp,
            gate: t.take("ffn_gate_shexp")?,
            up: t.take("ffn_up_shexp")?,
            down: t.take("ffn_down_shexp")?,
        }),
    };
    let bias = match c.moe.score_bias {
        true => Some(t.vector("exp_probs_b.bias")?),
        false => None,
    };
    let expert_bias = match c.moe.expert_bias {
        true => Some(ExpertBias {
            router: t.vector("ffn_gate_inp.bias")?,
            gate: t.vector("ffn_gate_exps.bias")?,
            up: t.vector("ffn_up_exps.bias")?,
            down: t.vector("ffn_down_exps.bias")?,
        }),
        false => None,
    };
    let mut moe = MoeWeights::new(&c.moe, router, bias, [&gate, &up, &down], shared)?;
    moe.set_expert_bias(expert_bias)?;
    Ok(FfnTensors {
        gate,
        up,
        down,
        moe: Some(moe),
        down_t: None,
    })
}

/// A dense FFN: gate and up (one activated projection without a gate), the down projection,
/// and the transposed one if the file gives it (the down projection is then made from it when
/// the file has no `ffn_down`).
fn take_dense_ffn(c: &ModelConfig, t: &mut LayerTensors<'_>) -> Result<FfnTensors> {
    // Without a gate the one input projection (`ffn_up`, OPT's fc1) is the activated one.
    let (gate, up) = match c.arch.no_gate {
        true => {
            let w = t.take("ffn_up")?;
            (w.clone(), w)
        }
        false => (t.take("ffn_gate")?, t.take("ffn_up")?),
    };
    let down_t = match t.has("ffn_down_t") {
        true => Some(t.take("ffn_down_t")?),
        false => None,
    };
    let down = match (&down_t, t.has("ffn_down")) {
        (Some(dt), false) => crate::transpose::transpose(dt)?,
        _ => t.take("ffn_down")?,
    };
    Ok(FfnTensors {
        gate,
        up,
        down,
        moe: None,
        down_t,
    })
}

/// The layer's norms; the FFN's is named `ffn_norm_name` (None: it shares the attention's).
fn take_norms(
    c: &ModelConfig,
    t: &mut LayerTensors<'_>,
    ffn_norm_name: Option<&str>,
) -> Result<LayerNorms> {
    let a = &c.arch;
    let attn = t.norm("attn_norm")?;
    let ffn = match ffn_norm_name {
        Some(s) => t.norm(s)?,
        None => attn.clone(),
    };
    let qk = match a.qk_norm {
        true => Some([t.norm("attn_q_norm")?, t.norm("attn_k_norm")?]),
        false => None,
    };
    let post = match a.post_norms {
        true => Some([t.norm("post_attention_norm")?, t.norm("post_ffw_norm")?]),
        false => None,
    };
    Ok(LayerNorms {
        attn,
        ffn,
        qk,
        post,
    })
}

/// The layer's biases the family has; the FFN norm's is that of `ffn_norm_name` (None: the
/// attention norm's).
fn take_biases(
    c: &ModelConfig,
    t: &mut LayerTensors<'_>,
    ffn_norm_name: Option<&str>,
) -> Result<LayerBiases> {
    let a = &c.arch;
    let norm = match a.layer_norm {
        true => {
            let attn = t.vector("attn_norm.bias")?;
            let ffn = match ffn_norm_name {
                Some(s) => t.vector(&format!("{s}.bias"))?,
                None => attn.clone(),
            };
            Some([attn, ffn])
        }
        false => None,
    };
    let out = match a.out_bias {
        true => Some(t.vector("attn_output.bias")?),
        false => None,
    };
    let ffn = match a.ffn_bias {
        true => Some([t.vector("ffn_up.bias")?, t.vector("ffn_down.bias")?]),
        false => None,
    };
    let qkv = match a.qkv_bias {
        true => Some([
            t.vector("attn_q.bias")?,
            t.vector("attn_k.bias")?,
            t.vector("attn_v.bias")?,
        ]),
        false => None,
    };
    Ok(LayerBiases {
        norm,
        out,
        ffn,
        qkv,
    })
}
