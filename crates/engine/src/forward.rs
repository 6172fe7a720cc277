//! One forward pass over a chunk of tokens: the dense layer loop of every family, the llama
//! layer with the steps the config's `ArchFeatures` switch on (biases, q/k norms, windows,
//! post norms, soft-caps, LayerNorm, learned positions, parallel attention and FFN).

use powerinfer_core::{ensure, Result};

pub(crate) use crate::attention_block::attention_block;
use crate::ffn::Arith;
pub(crate) use crate::ffn_block::ffn_block;
use crate::input_sparse::SiteMatrix;
use crate::kv_cache::KvCache;
use crate::layer::NormKind;
use crate::moe::early_logits;
pub(crate) use crate::pass_rows::{Kv, Rows, SlotKv};
pub use crate::pass_scratch::Scratch;
pub(crate) use crate::pass_scratch::{norm_bias, norm_rows_with, Angles};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::project_site::{project_site, SiteCopies, SiteRead};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// Which logits a forward pass returns (or, [`Logits::Hidden`], which rows before the head).
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
    /// No logits: every token's final hidden state after the output norm (n × dim), the
    /// output head not computed (embeddings). The pass is [`Logits::All`]'s up to the head,
    /// so these rows times the output matrix are its logits.
    Hidden,
}

impl Logits {
    /// Floats per returned row: the vocabulary, or the model's width for [`Logits::Hidden`].
    pub fn row_width(self, config: &powerinfer_core::ModelConfig) -> usize {
        match self {
            Logits::Hidden => config.dim,
            Logits::Last | Logits::All | Logits::Steps => config.vocab_size,
        }
    }
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
        Logits::Last | Logits::All | Logits::Hidden => Arith::Batch,
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
            let mut rows = Vec::new();
            final_norm(model, &s.x, &mut rows);
            p.output_in.extend_from_slice(&rows);
        }
    }

    let (first, n_out) = match which {
        Logits::Last => (n - 1, 1),
        Logits::All | Logits::Steps => (0, n),
        Logits::Hidden => {
            let mut rows = Vec::new();
            final_norm(model, &s.x, &mut rows);
            mark(Phase::Other);
            return Ok(rows);
        }
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

/// The output norm (RMS, or LayerNorm with its bias) of the rows of `x` into `out`: what the
/// output head reads, and what [`Logits::Hidden`] returns.
fn final_norm(model: &ModelWeights, x: &[f32], out: &mut Vec<f32>) {
    let bias = match model.program.output.norm {
        NormKind::Rms => None,
        NormKind::Layer => model.output_norm_bias.as_deref(),
    };
    norm_rows_with(x, &model.output_norm, bias, model.config.rms_eps, out);
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
    final_norm(model, &s.x[first * c.dim..], &mut s.xn);
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
