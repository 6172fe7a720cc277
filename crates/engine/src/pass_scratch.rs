//! What the blocks of a forward pass share: the scratch buffers ([`Scratch`]), the RoPE angles
//! of the pass's rows ([`Angles`]), and the norm and bias steps.

use powerinfer_core::{ModelConfig, Result};
use rayon::prelude::*;

use crate::ffn::{Arith, FfnScratch};
use crate::input_sparse::InputScratch;
use crate::layer::NormKind;
use crate::layer_weights::LayerWeights;
use crate::moe::MoeScratch;
use crate::norm_rope::{layer_norm, rms_norm, RopeAngles};

/// RMSNorm every row of `x` (n rows of `w.len()`) into `out`.
pub(crate) fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    norm_rows_with(x, w, None, eps, out)
}

/// RMSNorm, or LayerNorm where a bias `b` is given, of every row of `x` into `out`.
pub(crate) fn norm_rows_with(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    eps: f32,
    out: &mut Vec<f32>,
) {
    out.resize(x.len(), 0.0);
    let one = |xr: &[f32], o: &mut [f32]| match b {
        None => rms_norm(xr, w, eps, o),
        Some(b) => layer_norm(xr, w, b, eps, o),
    };
    if x.len() == w.len() {
        // One token: not worth a parallel region.
        one(x, out);
        return;
    }
    out.par_chunks_mut(w.len())
        .zip(x.par_chunks(w.len()))
        .for_each(|(o, xr)| one(xr, o));
}

/// `rows += b` for every row of `rows` (b's width).
pub(crate) fn add_rows(rows: &mut [f32], b: &[f32]) {
    for r in rows.chunks_exact_mut(b.len()) {
        r.iter_mut().zip(b).for_each(|(x, b)| *x += b);
    }
}

/// RMSNorm every head (`w.len()` wide) of one row in place (q/k norm).
pub(crate) fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(w.len()) {
        let ss: f64 = head.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = (1.0 / (ss / w.len() as f64 + eps as f64).sqrt()) as f32;
        head.iter_mut()
            .zip(w)
            .for_each(|(v, g)| *v = *v * scale * g);
    }
}

/// Scratch buffers reused across layers and calls.
#[derive(Default)]
pub struct Scratch {
    /// The residual stream (n × dim).
    pub(crate) x: Vec<f32>,
    /// The normed input of the current block.
    pub(crate) xn: Vec<f32>,
    /// The attention's queries, keys and values (n rows each).
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    /// The attention's output before its projection.
    pub(crate) att: Vec<f32>,
    /// A block's output (the attention's projection; the post-norm's swap space).
    pub(crate) o: Vec<f32>,
    /// The FFN's output (n × dim).
    pub(crate) down: Vec<f32>,
    /// The residual stream before the attention of a parallel block (the FFN's input).
    pub(crate) par_in: Vec<f32>,
    pub(crate) ffn: FfnScratch,
    pub(crate) input: InputScratch,
    pub(crate) moe: MoeScratch,
    pub(crate) mla: MlaScratch,
    /// How the current pass multiplies several tokens (set by [`forward`]).
    pub(crate) arith: Arith,
}

/// Scratch of the latent attention ([`crate::mla`]; beside the pass's q, k, v and att).
#[derive(Default)]
pub(crate) struct MlaScratch {
    /// The compressed query (n × q_lora_rank), then its norm.
    pub(crate) qa: Vec<f32>,
    pub(crate) qa_norm: Vec<f32>,
    /// The projected query (n × heads·(qk_nope + rope)).
    pub(crate) q: Vec<f32>,
    /// One head's inputs (n rows) and outputs (n rows) of its absorption.
    pub(crate) head_in: Vec<f32>,
    pub(crate) head_out: Vec<f32>,
    /// The heads' outputs after `attn_v_b` (n × heads·v_head_dim).
    pub(crate) out: Vec<f32>,
}

/// RoPE angles of a chunk's tokens: the model's global ones and, for families whose sliding
/// layers have their own base, those.
pub(crate) struct Angles {
    pub global: Vec<RopeAngles>,
    pub local: Option<Vec<RopeAngles>>,
}

impl Angles {
    /// The angles of positions `start..start + n`.
    pub fn new(c: &ModelConfig, start: usize, n: usize) -> Angles {
        Angles::at(c, &(start..start + n).collect::<Vec<_>>())
    }

    /// The angles of the rows at `positions`.
    pub fn at(c: &ModelConfig, positions: &[usize]) -> Angles {
        let of = |local: bool| -> Vec<RopeAngles> {
            let freqs = c.rope_freqs(local);
            positions
                .iter()
                .map(|&p| RopeAngles::new(p, &freqs))
                .collect()
        };
        Angles {
            global: of(false),
            local: c.arch.rope_theta_local.map(|_| of(true)),
        }
    }

    pub(crate) fn get(&self, local: bool) -> &[RopeAngles] {
        match (&self.local, local) {
            (Some(l), true) => l,
            _ => &self.global,
        }
    }
}

/// The bias of a LayerNorm step (`which` 0: the attention's norm, 1: the FFN's), none for
/// RMSNorm.
pub(crate) fn norm_bias(lw: &LayerWeights, kind: NormKind, which: usize) -> Result<Option<&[f32]>> {
    match kind {
        NormKind::Rms => Ok(None),
        NormKind::Layer => match &lw.norm_bias {
            Some(b) => Ok(Some(&b[which][..])),
            None => powerinfer_core::bail!(Other, "a LayerNorm step without its bias weights"),
        },
    }
}
