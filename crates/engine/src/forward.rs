//! One forward pass over a chunk of tokens: the dense llama layer loop.

use powerinfer_core::{ensure, Result};
use rayon::prelude::*;

use crate::attention::{attention, AttnShape};
use crate::ffn::{ffn, project, project_many, FfnCall, FfnScratch};
use crate::kv_cache::KvCache;
use crate::norm_rope::{apply_rope, rms_norm, RopeAngles};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (decoding).
    Last,
    /// Every token's (scoring, perplexity).
    All,
}

/// RMSNorm every row of `x` (n rows of `w.len()`) into `out`.
pub(crate) fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    if x.len() == w.len() {
        // One token: not worth a parallel region.
        rms_norm(x, w, eps, out);
        return;
    }
    out.par_chunks_mut(w.len())
        .zip(x.par_chunks(w.len()))
        .for_each(|(o, xr)| rms_norm(xr, w, eps, o));
}

/// Scratch buffers reused across layers and calls.
#[derive(Default)]
pub struct Scratch {
    /// The residual stream (n × dim).
    pub(crate) x: Vec<f32>,
    /// The normed input of the current block.
    pub(crate) xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    down: Vec<f32>,
    pub(crate) ffn: FfnScratch,
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
    cache.reserve(n)?;

    let s = scratch;
    s.x.resize(n * c.dim, 0.0);
    for (row, &t) in s.x.chunks_exact_mut(c.dim).zip(tokens) {
        let e = &model.token_embd;
        powerinfer_cpu::dequantize_row(e.dtype, e.row(t as usize), row)?;
    }
    let angles: Vec<RopeAngles> = (0..n)
        .map(|t| RopeAngles::new(start + t, c.head_dim, c.rope_theta))
        .collect();
    mark(Phase::Other);
    for l in 0..model.layers.len() {
        attention_block(model, l, cache, s, start, n, &angles)?;
        ffn_block(model, l, mode, s, profiler.as_deref_mut(), start, n)?;
    }
    cache.set_len(start + n);
    if let Some(p) = profiler {
        p.tokens += n as u64;
    }

    let (first, n_out) = match which {
        Logits::Last => (n - 1, 1),
        Logits::All => (0, n),
    };
    output_block(model, s, first, n_out)
}

/// Layer `l`'s attention for the `n` tokens in `s.x` at positions `start..`: their keys and
/// values go into `cache`, the output is added to the residual `s.x`.
pub(crate) fn attention_block(
    model: &ModelWeights,
    l: usize,
    cache: &mut KvCache,
    s: &mut Scratch,
    start: usize,
    n: usize,
    angles: &[RopeAngles],
) -> Result<()> {
    let c = &model.config;
    let layer = &model.layers[l];
    norm_rows(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xn);
    mark(Phase::Other);
    project_many(
        [&layer.wq, &layer.wk, &layer.wv],
        &s.xn,
        n,
        [&mut s.q, &mut s.k, &mut s.v],
    )?;
    let rows =
        s.q.chunks_exact_mut(c.q_dim())
            .zip(s.k.chunks_exact_mut(c.kv_dim()));
    for ((q, k), ang) in rows.zip(angles) {
        apply_rope(q, c.head_dim, ang, c.rope_style);
        apply_rope(k, c.head_dim, ang, c.rope_style);
    }
    cache.write(l, start, &s.k, &s.v);
    let (keys, values) = cache.layer(l, start + n);
    s.att.resize(n * c.q_dim(), 0.0);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
    };
    attention(&shape, &s.q, keys, values, start, &mut s.att);
    project(&layer.wo, &s.att, n, &mut s.o)?;
    s.x.iter_mut().zip(&s.o).for_each(|(x, o)| *x += o);
    mark(Phase::Attention);
    Ok(())
}

/// Layer `l`'s FFN in `mode` for the `n` tokens in `s.x` (positions `start..`), added to the
/// residual.
pub(crate) fn ffn_block(
    model: &ModelWeights,
    l: usize,
    mode: &Sparsity,
    s: &mut Scratch,
    profiler: Option<&mut Profiler>,
    start: usize,
    n: usize,
) -> Result<()> {
    let c = &model.config;
    norm_rows(&s.x, &model.layers[l].ffn_norm, c.rms_eps, &mut s.xn);
    mark(Phase::Other);
    let call = FfnCall {
        model,
        layer: l,
        mode,
        x_res: &s.x,
        xn: &s.xn,
        n,
        start,
    };
    ffn(&call, &mut s.ffn, profiler, &mut s.down)?;
    s.x.iter_mut().zip(&s.down).for_each(|(x, d)| *x += d);
    mark(Phase::Down);
    Ok(())
}

/// Logits of the `n_out` tokens of `s.x` from row `first` on (final norm, output head).
pub(crate) fn output_block(
    model: &ModelWeights,
    s: &mut Scratch,
    first: usize,
    n_out: usize,
) -> Result<Vec<f32>> {
    let c = &model.config;
    norm_rows(
        &s.x[first * c.dim..],
        &model.output_norm,
        c.rms_eps,
        &mut s.xn,
    );
    mark(Phase::Other);
    let mut logits = Vec::new();
    project(&model.output, &s.xn, n_out, &mut logits)?;
    mark(Phase::Output);
    Ok(logits)
}
