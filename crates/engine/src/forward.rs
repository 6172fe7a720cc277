//! One forward pass over a chunk of tokens: the dense layer loop of every family, the llama
//! layer with the steps the config's `ArchFeatures` switch on (biases, q/k norms, windows,
//! post norms, soft-caps, LayerNorm, learned positions, parallel attention and FFN).

use powerinfer_core::{ensure, Result};
use rayon::prelude::*;

use crate::attention::{attention, AttnShape};
use crate::ffn::{ffn, project, project_many, FfnCall, FfnScratch};
use crate::kv_cache::KvCache;
use crate::norm_rope::{apply_rope, layer_norm, rms_norm, RopeAngles};
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
    norm_rows_with(x, w, None, eps, out)
}

/// RMSNorm, or LayerNorm where a bias `b` is given, of every row of `x` into `out`.
fn norm_rows_with(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, out: &mut Vec<f32>) {
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
fn add_rows(rows: &mut [f32], b: &[f32]) {
    for r in rows.chunks_exact_mut(b.len()) {
        r.iter_mut().zip(b).for_each(|(x, b)| *x += b);
    }
}

/// RMSNorm every head (`w.len()` wide) of one row in place (q/k norm).
fn norm_heads(x: &mut [f32], w: &[f32], eps: f32) {
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
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    down: Vec<f32>,
    /// The residual stream before the attention of a parallel block (the FFN's input).
    par_in: Vec<f32>,
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
        if let Some(f) = c.arch.embed_scale {
            row.iter_mut().for_each(|v| *v *= f);
        }
    }
    if let Some(pe) = &model.pos_embd {
        let mut p = vec![0.0f32; c.dim];
        for (t, row) in s.x.chunks_exact_mut(c.dim).enumerate() {
            let pos = start + t + c.arch.pos_offset;
            ensure!(
                pos < pe.rows,
                ContextOverflow,
                "position {pos} is past the {} learned positions",
                pe.rows
            );
            powerinfer_cpu::dequantize_row(pe.dtype, pe.row(pos), &mut p)?;
            row.iter_mut().zip(&p).for_each(|(x, p)| *x += p);
        }
    }
    let angles_for = |local: bool| -> Vec<RopeAngles> {
        let inv = c.rope_inv_freqs(local);
        (0..n).map(|t| RopeAngles::new(start + t, &inv)).collect()
    };
    let angles = angles_for(false);
    let local = c.arch.rope_theta_local.map(|_| angles_for(true));
    mark(Phase::Other);
    for l in 0..model.layers.len() {
        let ang = match &local {
            Some(local) if c.rope_local(l) => local,
            _ => &angles,
        };
        if c.arch.parallel {
            s.par_in.clone_from(&s.x);
        }
        attention_block(model, l, cache, s, start, n, ang)?;
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
    let nb = layer.norm_bias.as_ref();
    norm_rows_with(
        &s.x,
        &layer.attn_norm,
        nb.map(|b| &b[0][..]),
        c.rms_eps,
        &mut s.xn,
    );
    mark(Phase::Other);
    project_many(
        [&layer.wq, &layer.wk, &layer.wv],
        &s.xn,
        n,
        [&mut s.q, &mut s.k, &mut s.v],
    )?;
    let rows =
        s.q.chunks_exact_mut(c.q_dim())
            .zip(s.k.chunks_exact_mut(c.kv_dim()))
            .zip(s.v.chunks_exact_mut(c.kv_dim()));
    for (((q, k), v), ang) in rows.zip(angles) {
        if let Some([bq, bk, bv]) = &layer.qkv_bias {
            for (x, b) in [(&mut *q, bq), (&mut *k, bk), (&mut *v, bv)] {
                x.iter_mut().zip(b).for_each(|(x, b)| *x += b);
            }
        }
        if let Some([nq, nk]) = &layer.qk_norm {
            norm_heads(q, nq, c.rms_eps);
            norm_heads(k, nk, c.rms_eps);
        }
        if !c.arch.learned_pos {
            apply_rope(q, c.head_dim, ang, c.rope_style);
            apply_rope(k, c.head_dim, ang, c.rope_style);
        }
    }
    cache.write(l, start, &s.k, &s.v);
    let (keys, values) = cache.layer(l, start + n);
    s.att.resize(n * c.q_dim(), 0.0);
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
        window: c.arch.window(l),
        scale: c.arch.attn_scale,
        softcap: c.arch.attn_softcap,
    };
    attention(&shape, &s.q, keys, values, start, &mut s.att);
    project(&layer.wo, &s.att, n, &mut s.o)?;
    if let Some(b) = &layer.out_bias {
        add_rows(&mut s.o, b);
    }
    if let Some([post, _]) = &layer.post_norms {
        norm_rows(&s.o, post, c.rms_eps, &mut s.down);
        std::mem::swap(&mut s.o, &mut s.down);
    }
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
    let lw = &model.layers[l];
    // A parallel block's FFN reads the residual stream from before the attention.
    let x_in = match c.arch.parallel {
        true => &s.par_in,
        false => &s.x,
    };
    let nb = lw.norm_bias.as_ref().map(|b| &b[1][..]);
    norm_rows_with(x_in, &lw.ffn_norm, nb, c.rms_eps, &mut s.xn);
    mark(Phase::Other);
    let call = FfnCall {
        model,
        layer: l,
        mode,
        x_res: x_in,
        xn: &s.xn,
        n,
        start,
    };
    let phase = ffn(&call, &mut s.ffn, profiler, &mut s.down)?;
    if let Some([_, b]) = &lw.ffn_bias {
        add_rows(&mut s.down, b);
    }
    if let Some([_, post]) = &lw.post_norms {
        norm_rows(&s.down, post, c.rms_eps, &mut s.o);
        std::mem::swap(&mut s.o, &mut s.down);
    }
    s.x.iter_mut().zip(&s.down).for_each(|(x, d)| *x += d);
    mark(phase);
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
    norm_rows_with(
        &s.x[first * c.dim..],
        &model.output_norm,
        model.output_norm_bias.as_deref(),
        c.rms_eps,
        &mut s.xn,
    );
    mark(Phase::Other);
    let mut logits = Vec::new();
    project(&model.output, &s.xn, n_out, &mut logits)?;
    if let Some(cap) = c.arch.final_softcap {
        logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
    mark(Phase::Output);
    Ok(logits)
}
