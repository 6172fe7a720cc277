//! One forward pass over a chunk of tokens: the dense layer loop of every family, the llama
//! layer with the steps the config's `ArchFeatures` switch on (biases, q/k norms, windows,
//! post norms, soft-caps, LayerNorm, learned positions, parallel attention and FFN).

use powerinfer_core::{ensure, ModelConfig, Result};
use rayon::prelude::*;

pub(crate) use crate::attention_block::attention_block;
use crate::ffn::{Arith, FfnScratch};
pub(crate) use crate::ffn_block::ffn_block;
use crate::input_sparse::{InputScratch, SiteMatrix};
use crate::kv_cache::KvCache;
use crate::layer::NormKind;
use crate::layer_weights::LayerWeights;
use crate::moe::{early_logits, MoeScratch};
use crate::norm_rope::{layer_norm, rms_norm, RopeAngles};
pub(crate) use crate::pass_rows::{Kv, Rows, SlotKv};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::project_site::{project_site, SiteCopies, SiteRead};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (decoding).
    Last,
    /// Every token's (scoring, perplexity).
    All,
    /// Every token's, each bit-identical to what a one-token decode step after the tokens
    /// before it gives (speculative verification): the products share their weight reads,
    /// attention and sparse FFNs run per token.
    Steps,
}

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
    /// How the current pass multiplies several tokens (set by [`forward`]).
    pub(crate) arith: Arith,
}

/// Token ids as callers hold them (Python ints, any `i64`) as the engine's `u32` ids: the one
/// check of token ranges, [`Error::Token`](powerinfer_core::Error::Token) for an id outside
/// `0..vocab` ([`forward`] applies it too).
pub fn token_ids(tokens: &[i64], vocab: usize) -> Result<Vec<u32>> {
    tokens
        .iter()
        .map(|&t| match u32::try_from(t) {
            Ok(u) if (u as usize) < vocab => Ok(u),
            _ => powerinfer_core::bail!(Token, "token id {t} is outside the vocabulary 0..{vocab}"),
        })
        .collect()
}

/// Run `tokens` (positions `cache.len()..`) through the model, append their keys and values to
/// `cache`, and return the requested logits (n_out × vocab, row-major).
pub fn forward(
    model: &ModelWeights,
    mode: &Sparsity,
    cache: &mut KvCache,
    scratch: &mut Scratch,
    mut profiler: Option<&mut Profiler>,
    tokens: &[u32],
    which: Logits,
) -> Result<Vec<f32>> {
    let c = &model.config;
    let n = tokens.len();
    ensure!(n > 0, Shape, "forward needs at least one token");
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        token_ids(&[i64::from(bad)], c.vocab_size)?;
    }
    let start = cache.len();
    if which == Logits::Steps && n > 1 && !steps_in_one_pass(model, mode, profiler.is_some()) {
        // One forward pass per token: exact by construction.
        let mut all = Vec::with_capacity(n * c.vocab_size);
        for t in tokens.chunks(1) {
            let p = profiler.as_deref_mut();
            all.extend(forward(model, mode, cache, scratch, p, t, Logits::Last)?);
        }
        return Ok(all);
    }
    cache.reserve(n)?;

    let s = scratch;
    s.arith = match which {
        Logits::Steps => Arith::Steps,
        Logits::Last | Logits::All => Arith::Batch,
    };
    embed(model, tokens, start, &mut s.x)?;
    let angles = Angles::new(c, start, n);
    mark(Phase::Other);
    for l in 0..model.layers.len() {
        if model.program.layers[l].save_residual {
            s.par_in.clone_from(&s.x);
        }
        if let (true, Some(m)) = (model.program.layers[l].early_router, &model.layers[l].moe) {
            early_logits(m, &s.x, n, &mut s.moe)?;
        }
        let kv = &mut Kv::Run { cache, start };
        attention_block(model, l, mode, kv, s, profiler.as_deref_mut(), n, &angles)?;
        let rows = Rows::Run { mode, start };
        ffn_block(model, l, &rows, s, profiler.as_deref_mut(), n)?;
    }
    cache.set_len(start + n);
    if let Some(p) = profiler {
        p.tokens += n as u64;
        if p.capture_sites {
            let bias = match model.program.output.norm {
                NormKind::Rms => None,
                NormKind::Layer => model.output_norm_bias.as_deref(),
            };
            let mut rows = Vec::new();
            norm_rows_with(&s.x, &model.output_norm, bias, c.rms_eps, &mut rows);
            p.output_in.extend_from_slice(&rows);
        }
    }

    let (first, n_out) = match which {
        Logits::Last => (n - 1, 1),
        Logits::All | Logits::Steps => (0, n),
    };
    output_block(model, mode, s, start, first, n_out)
}

/// Whether [`Logits::Steps`] runs its tokens through one pass (the products shared): not in
/// the input mode (whose one-token products read input-major columns), not while profiling,
/// and not where a router reads the residual before attention (its logits are per pass).
fn steps_in_one_pass(model: &ModelWeights, mode: &Sparsity, profiling: bool) -> bool {
    let early = model.program.layers.iter().any(|l| l.early_router);
    !matches!(mode, Sparsity::Input(_)) && !profiling && !early
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
            let inv = c.rope_inv_freqs(local);
            positions
                .iter()
                .map(|&p| RopeAngles::new(p, &inv))
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

/// The embedding steps of the model's program for `tokens` at positions `start..` into `x`
/// (resized to n × dim): each token's row, scaled, plus its learned position.
pub(crate) fn embed(
    model: &ModelWeights,
    tokens: &[u32],
    start: usize,
    x: &mut Vec<f32>,
) -> Result<()> {
    let c = &model.config;
    let p = &model.program.embed;
    x.resize(tokens.len() * c.dim, 0.0);
    for (row, &t) in x.chunks_exact_mut(c.dim).zip(tokens) {
        let e = &model.token_embd;
        ensure!(
            (t as usize) < e.rows(),
            Token,
            "token id {t} is past the vocabulary of {}",
            e.rows()
        );
        powerinfer_cpu::dequantize_row(e.dtype(), &e.row(t as usize), row)?;
        if let Some(f) = p.scale {
            row.iter_mut().for_each(|v| *v *= f);
        }
    }
    if let (Some(offset), Some(pe)) = (p.learned_pos, &model.pos_embd) {
        let mut add = vec![0.0f32; c.dim];
        for (t, row) in x.chunks_exact_mut(c.dim).enumerate() {
            let pos = start + t + offset;
            ensure!(
                pos < pe.rows,
                ContextOverflow,
                "position {pos} is past the {} learned positions",
                pe.rows
            );
            powerinfer_cpu::dequantize_row(pe.dtype, pe.row(pos), &mut add)?;
            row.iter_mut().zip(&add).for_each(|(x, p)| *x += p);
        }
    }
    Ok(())
}

/// Logits of the `n_out` tokens of `s.x` from row `first` on (final norm, output head); `start`
/// is the position of row 0 (the input mode keeps the context's first position dense).
pub(crate) fn output_block(
    model: &ModelWeights,
    mode: &Sparsity,
    s: &mut Scratch,
    start: usize,
    first: usize,
    n_out: usize,
) -> Result<Vec<f32>> {
    let c = &model.config;
    let p = &model.program.output;
    let bias = match p.norm {
        NormKind::Rms => None,
        NormKind::Layer => model.output_norm_bias.as_deref(),
    };
    norm_rows_with(
        &s.x[first * c.dim..],
        &model.output_norm,
        bias,
        c.rms_eps,
        &mut s.xn,
    );
    mark(Phase::Other);
    let mut logits = Vec::new();
    let t = match mode {
        Sparsity::Input(p) => Some(p.output),
        _ => None,
    };
    let read = SiteRead::new(mode, t, start + first, n_out);
    let copies = || {
        let oc = model.output_copy()?;
        Ok(SiteCopies {
            mats: [SiteMatrix {
                w: model.output.view(),
                m: &oc.w,
                crossover: oc.crossover,
            }],
            norms: &oc.norms[..],
        })
    };
    let (dense, ys) = ([(&model.output).into()], [&mut logits]);
    project_site(
        read,
        dense,
        copies,
        &mut s.xn,
        n_out,
        &mut s.input,
        ys,
        s.arith,
    )?;
    if let Some(cap) = p.softcap {
        logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
    mark(Phase::Output);
    Ok(logits)
}
