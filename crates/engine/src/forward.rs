//! One forward pass over a chunk of tokens: the dense layer loop of every family, the llama
//! layer with the steps the config's `ArchFeatures` switch on (biases, q/k norms, windows,
//! post norms, soft-caps, LayerNorm, learned positions, parallel attention and FFN).

use powerinfer_core::{ensure, ModelConfig, Result};
use rayon::prelude::*;

use crate::attention::{attention, AttnShape};
use crate::ffn::{ffn, project, project_many, Arith, FfnCall, FfnScratch};
use crate::input_sparse::{mask_rows, project_kept, site_matrix, InputScratch, Site, SiteMatrix};
use crate::kv_cache::KvCache;
use crate::layer::{AttnStep, FfnInput, FfnKind, FfnStep, NormKind};
use crate::layer_weights::LayerWeights;
use crate::moe::{early_logits, moe_ffn, MoeCall, MoeScratch};
use crate::moe_weights::MoeWeights;
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

    fn get(&self, local: bool) -> &[RopeAngles] {
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

/// How the input mode reads one site's projections for `n` tokens at `start..`: none (another
/// mode, or a threshold of 0), the input-sparse decode product (one token past the first), or
/// the dense product of the masked inputs.
enum SiteRead<'a> {
    Dense,
    Kept(&'a crate::input_sparse::InputSparsity, f32),
    Masked(&'a crate::input_sparse::InputSparsity, f32, usize),
}

fn site_read<'a>(mode: &'a Sparsity, t: Option<f32>, start: usize, n: usize) -> SiteRead<'a> {
    match (mode, t) {
        (Sparsity::Input(p), Some(t)) if t > 0.0 => match mode.dense_rows(start, n) {
            0 if n == 1 => SiteRead::Kept(p, t),
            dense => SiteRead::Masked(p, t, dense),
        },
        _ => SiteRead::Dense,
    }
}

/// Layer `l`'s threshold of `site` in the input mode.
pub(crate) fn site_threshold(mode: &Sparsity, l: usize, site: Site) -> Option<f32> {
    match mode {
        Sparsity::Input(p) => Some(p.thresholds[l][site as usize]),
        _ => None,
    }
}

/// Where the rows of a pass keep their keys and values, and at which positions.
pub(crate) enum Kv<'a, 'b> {
    /// One context: the rows are positions `start..start + n` of `cache`.
    Run {
        cache: &'a mut KvCache,
        start: usize,
    },
    /// Several contexts (decode steps of several conversations in one pass): each slot's rows,
    /// in order, follow its cache's positions.
    Slots(&'a mut [SlotKv<'b>]),
}

/// One context's rows in a [`Kv::Slots`] pass.
pub(crate) struct SlotKv<'b> {
    pub cache: &'b mut KvCache,
    /// Its rows in the pass.
    pub rows: usize,
}

impl Kv<'_, '_> {
    /// The position of the pass's first row (only the input mode, which never runs in a
    /// [`Kv::Slots`] pass, asks).
    fn start(&self) -> usize {
        match self {
            Kv::Run { start, .. } => *start,
            Kv::Slots(slots) => slots.first().map_or(0, |s| s.cache.len()),
        }
    }
}

/// Which mode each row of a pass's FFN runs in, and at which position.
pub(crate) enum Rows<'a> {
    /// One context: every row in `mode`, at positions `start..`.
    Run { mode: &'a Sparsity, start: usize },
    /// Several contexts: each row's own mode and position.
    Slots(&'a [(&'a Sparsity, usize)]),
}

impl<'a> Rows<'a> {
    /// Row `t`'s mode and position.
    fn at(&self, t: usize) -> (&'a Sparsity, usize) {
        match *self {
            Rows::Run { mode, start } => (mode, start + t),
            Rows::Slots(rows) => rows[t],
        }
    }

    /// The mode of every row and the first row's position, where the rows can run as one
    /// batch: one context, one row, or several contexts all dense (None otherwise).
    fn uniform(&self) -> Option<(&'a Sparsity, usize)> {
        match *self {
            Rows::Run { mode, start } => Some((mode, start)),
            Rows::Slots([one]) => Some(*one),
            Rows::Slots(rows) => rows
                .iter()
                .all(|(m, _)| matches!(m, Sparsity::Dense))
                .then(|| (&Sparsity::Dense, rows.first().map_or(0, |r| r.1))),
        }
    }
}

/// Layer `l`'s attention block (its program's steps) for the `n` tokens in `s.x`: their keys
/// and values go into their caches (`kv`), the output is added to the residual `s.x`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_block(
    model: &ModelWeights,
    l: usize,
    mode: &Sparsity,
    kv: &mut Kv<'_, '_>,
    s: &mut Scratch,
    mut profiler: Option<&mut Profiler>,
    n: usize,
    angles: &Angles,
) -> Result<()> {
    let c = &model.config;
    let start = kv.start();
    let lw = &model.layers[l];
    let arith = s.arith;
    for step in &model.program.layers[l].attention {
        match step {
            AttnStep::Norm(kind) => {
                let b = norm_bias(lw, *kind, 0)?;
                norm_rows_with(&s.x, &lw.attn_norm, b, c.rms_eps, &mut s.xn);
                mark(Phase::Other);
            }
            AttnStep::Qkv { bias } => {
                if let Some(p) = profiler.as_deref_mut() {
                    p.record_site(l, Site::AttnIn, &s.xn);
                }
                let t = site_threshold(mode, l, Site::AttnIn);
                match site_read(mode, t, start, n) {
                    SiteRead::Kept(p, t) => {
                        let ic = model.input_copies()?;
                        let cp = &ic.layers[l];
                        s.q.resize(lw.wq.rows(), 0.0);
                        s.k.resize(lw.wk.rows(), 0.0);
                        s.v.resize(lw.wv.rows(), 0.0);
                        let norms = &cp.norms[Site::AttnIn as usize];
                        let mats = [
                            site_matrix(ic, &lw.wq, &cp.q),
                            site_matrix(ic, &lw.wk, &cp.k),
                            site_matrix(ic, &lw.wv, &cp.v),
                        ];
                        let ys: &mut [&mut [f32]] = &mut [&mut s.q, &mut s.k, &mut s.v];
                        project_kept(&mats, &s.xn, p.score, norms, t, &mut s.input, ys)?;
                    }
                    read => {
                        if let SiteRead::Masked(p, t, dense) = read {
                            let norms =
                                &model.input_copies()?.layers[l].norms[Site::AttnIn as usize];
                            mask_rows(p.score, norms, t, &mut s.xn, dense);
                        }
                        project_many(
                            [&lw.wq, &lw.wk, &lw.wv],
                            &s.xn,
                            n,
                            [&mut s.q, &mut s.k, &mut s.v],
                            arith,
                        )?;
                    }
                }
                if let (true, Some([bq, bk, bv])) = (bias, &lw.qkv_bias) {
                    add_rows(&mut s.q, bq);
                    add_rows(&mut s.k, bk);
                    add_rows(&mut s.v, bv);
                }
            }
            AttnStep::QkNorm => {
                if let Some([nq, nk]) = &lw.qk_norm {
                    for q in s.q.chunks_exact_mut(c.q_dim()) {
                        norm_heads(q, nq, c.rms_eps);
                    }
                    for k in s.k.chunks_exact_mut(c.kv_dim()) {
                        norm_heads(k, nk, c.rms_eps);
                    }
                }
            }
            AttnStep::Rope { local } => {
                let ang = angles.get(*local);
                let rows =
                    s.q.chunks_exact_mut(c.q_dim())
                        .zip(s.k.chunks_exact_mut(c.kv_dim()));
                for ((q, k), a) in rows.zip(ang) {
                    apply_rope(q, c.head_dim, a, c.rope_style);
                    apply_rope(k, c.head_dim, a, c.rope_style);
                }
            }
            AttnStep::Attend(p) => {
                s.att.resize(n * c.q_dim(), 0.0);
                let shape = AttnShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    window: p.window,
                    scale: Some(p.scale),
                    softcap: p.softcap,
                };
                match kv {
                    Kv::Run { cache, start } => {
                        let (q, k, v, att) = (&s.q[..], &s.k[..], &s.v[..], &mut s.att[..]);
                        attend_rows(&shape, arith, cache, l, *start, q, k, v, att);
                    }
                    Kv::Slots(slots) => {
                        let (qd, kd) = (c.q_dim(), c.kv_dim());
                        let mut row = 0;
                        for slot in slots.iter_mut() {
                            let (a, b) = (row, row + slot.rows);
                            let start = slot.cache.len();
                            attend_rows(
                                &shape,
                                Arith::Steps,
                                slot.cache,
                                l,
                                start,
                                &s.q[a * qd..b * qd],
                                &s.k[a * kd..b * kd],
                                &s.v[a * kd..b * kd],
                                &mut s.att[a * qd..b * qd],
                            );
                            row = b;
                        }
                    }
                }
            }
            AttnStep::Output { bias } => {
                if let Some(p) = profiler.as_deref_mut() {
                    p.record_site(l, Site::AttnOut, &s.att);
                }
                let t = site_threshold(mode, l, Site::AttnOut);
                match site_read(mode, t, start, n) {
                    SiteRead::Kept(p, t) => {
                        let ic = model.input_copies()?;
                        let cp = &ic.layers[l];
                        s.o.resize(lw.wo.rows(), 0.0);
                        let norms = &cp.norms[Site::AttnOut as usize];
                        let mats = [site_matrix(ic, &lw.wo, &cp.o)];
                        let ys: &mut [&mut [f32]] = &mut [&mut s.o];
                        project_kept(&mats, &s.att, p.score, norms, t, &mut s.input, ys)?;
                    }
                    read => {
                        if let SiteRead::Masked(p, t, dense) = read {
                            let norms =
                                &model.input_copies()?.layers[l].norms[Site::AttnOut as usize];
                            mask_rows(p.score, norms, t, &mut s.att, dense);
                        }
                        project(&lw.wo, &s.att, n, &mut s.o, arith)?;
                    }
                }
                if let (true, Some(b)) = (bias, &lw.out_bias) {
                    add_rows(&mut s.o, b);
                }
            }
            AttnStep::PostNorm => {
                if let Some([post, _]) = &lw.post_norms {
                    norm_rows(&s.o, post, c.rms_eps, &mut s.down);
                    std::mem::swap(&mut s.o, &mut s.down);
                }
            }
            AttnStep::Residual => {
                s.x.iter_mut().zip(&s.o).for_each(|(x, o)| *x += o);
                mark(Phase::Attention);
            }
        }
    }
    Ok(())
}

/// The keys and values of rows at positions `start..` into `cache` (layer `l`), and their
/// attention over it: one pass over all queries ([`Arith::Batch`]) or one query at a time, as
/// decode steps attend ([`Arith::Steps`]).
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    shape: &AttnShape,
    arith: Arith,
    cache: &mut KvCache,
    l: usize,
    start: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    att: &mut [f32],
) {
    let n = k.len() / cache_width(shape);
    cache.write(l, start, k, v);
    let (keys, values) = cache.layer(l, start + n);
    match arith {
        Arith::Batch => attention(shape, q, keys, values, start, att),
        Arith::Steps => {
            let qd = shape.n_heads * shape.head_dim;
            for (t, (q, o)) in q.chunks_exact(qd).zip(att.chunks_exact_mut(qd)).enumerate() {
                attention(shape, q, keys, values, start + t, o);
            }
        }
    }
}

/// Values per position of a cache row (keys or values) for `shape`.
fn cache_width(shape: &AttnShape) -> usize {
    shape.n_kv_heads * shape.head_dim
}

/// Layer `l`'s FFN block (its program's steps) for the `n` tokens in `s.x` (each in its row's
/// mode and at its position, `rows`), added to the residual.
pub(crate) fn ffn_block(
    model: &ModelWeights,
    l: usize,
    rows: &Rows<'_>,
    s: &mut Scratch,
    mut profiler: Option<&mut Profiler>,
    n: usize,
) -> Result<()> {
    let c = &model.config;
    let lw = &model.layers[l];
    let mut phase = Phase::Other;
    let uniform = rows.uniform();
    let per_token =
        s.arith == Arith::Steps && n > 1 && !matches!(uniform, Some((Sparsity::Dense, _)));
    for step in &model.program.layers[l].ffn {
        let x_in = match model.program.layers[l].ffn_input() {
            FfnInput::Saved => &s.par_in,
            FfnInput::Residual => &s.x,
        };
        match step {
            FfnStep::Norm(kind, _) => {
                let b = norm_bias(lw, *kind, 1)?;
                norm_rows_with(x_in, &lw.ffn_norm, b, c.rms_eps, &mut s.xn);
                mark(Phase::Other);
            }
            // Decode steps of a sparse mode read each token's own rows: one call per token.
            FfnStep::Ffn(_) if per_token => {
                let dim = c.dim;
                s.down.resize(n * dim, 0.0);
                let mut row = Vec::with_capacity(dim);
                for t in 0..n {
                    let (mode, start) = rows.at(t);
                    let call = FfnCall {
                        model,
                        layer: l,
                        mode,
                        x_res: &x_in[t * dim..(t + 1) * dim],
                        xn: &s.xn[t * dim..(t + 1) * dim],
                        n: 1,
                        start,
                        arith: Arith::Batch,
                    };
                    phase = ffn(&call, &mut s.ffn, None, &mut row)?;
                    s.down[t * dim..(t + 1) * dim].copy_from_slice(&row);
                }
            }
            FfnStep::Ffn(_) => {
                let Some((mode, start)) = uniform else {
                    powerinfer_core::bail!(Other, "layer {l}: rows of several modes in one pass");
                };
                let call = FfnCall {
                    model,
                    layer: l,
                    mode,
                    x_res: x_in,
                    xn: &s.xn,
                    n,
                    start,
                    arith: s.arith,
                };
                phase = ffn(&call, &mut s.ffn, profiler.as_deref_mut(), &mut s.down)?;
            }
            FfnStep::Moe(kind) => {
                let Some(w) = &lw.moe else {
                    powerinfer_core::bail!(Other, "layer {l}: an MoE step without its experts");
                };
                if profiler.as_ref().is_some_and(|p| p.capture_sites) {
                    powerinfer_core::bail!(
                        Unsupported,
                        "capturing the input sites of a mixture-of-experts model is not \
                         supported yet"
                    );
                }
                let at = |mode| MoeAt {
                    model,
                    l,
                    mode,
                    w,
                    kind: *kind,
                };
                match (s.arith, uniform) {
                    // Decode steps route and read each token on its own: one call per token.
                    (Arith::Steps, _) if n > 1 => {
                        let dim = c.dim;
                        s.down.resize(n * dim, 0.0);
                        let mut row = Vec::with_capacity(dim);
                        for t in 0..n {
                            let (mode, start) = rows.at(t);
                            let xn = &s.xn[t * dim..(t + 1) * dim];
                            at(mode).run(xn, 1, start, &mut s.moe, None, &mut row)?;
                            s.down[t * dim..(t + 1) * dim].copy_from_slice(&row);
                        }
                    }
                    (_, Some((mode, start))) => at(mode).run(
                        &s.xn,
                        n,
                        start,
                        &mut s.moe,
                        profiler.as_deref_mut(),
                        &mut s.down,
                    )?,
                    (_, None) => {
                        powerinfer_core::bail!(
                            Other,
                            "layer {l}: rows of several modes in one pass"
                        )
                    }
                }
                phase = Phase::Ffn;
            }
            FfnStep::DownBias => {
                if let Some([_, b]) = &lw.ffn_bias {
                    add_rows(&mut s.down, b);
                }
            }
            FfnStep::PostNorm => {
                if let Some([_, post]) = &lw.post_norms {
                    norm_rows(&s.down, post, c.rms_eps, &mut s.o);
                    std::mem::swap(&mut s.o, &mut s.down);
                }
            }
            FfnStep::Residual => {
                s.x.iter_mut().zip(&s.down).for_each(|(x, d)| *x += d);
                mark(phase);
            }
        }
    }
    Ok(())
}

/// One layer's MoE step, for [`ffn_block`].
struct MoeAt<'a> {
    model: &'a ModelWeights,
    l: usize,
    mode: &'a Sparsity,
    w: &'a MoeWeights,
    kind: FfnKind,
}

impl MoeAt<'_> {
    /// The routed (and shared) experts of the `n` tokens `xn` at positions `start..` into `out`.
    fn run(
        &self,
        xn: &[f32],
        n: usize,
        start: usize,
        moe: &mut MoeScratch,
        profiler: Option<&mut Profiler>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let MoeAt {
            model,
            l,
            mode,
            w,
            kind,
        } = *self;
        let c = &model.config;
        // Exact-relu reads only the up and down rows of the neurons that fire in each
        // routed expert (one token), threshold mode the down rows of those that pass;
        // batches compute the same function densely, masked.
        // A neuron store serves one token's routed experts in the modes the mode table
        // says (moe_store: dense, exact-relu): no transposed copy in memory then.
        let stored = mode.mode().support().moe_store;
        let store = match (stored, n, profiler.is_some()) {
            (true, 1, false) => model.neuron_store(),
            _ => None,
        };
        let down_t = match (mode, n) {
            (Sparsity::ExactRelu | Sparsity::Threshold(_) | Sparsity::Predictor { .. }, 1)
                if store.is_none() =>
            {
                Some(&model.expert_down_t()?[l][..])
            }
            _ => None,
        };
        // This layer's predictor per expert (None where it has none: exact-relu).
        let predictors = match mode {
            Sparsity::Predictor { experts, .. } => Some(experts.get(l).map_or(&[][..], |r| &r[..])),
            _ => None,
        };
        let threshold = match mode {
            Sparsity::Threshold(t) => Some(t[l]),
            _ => None,
        };
        let call = MoeCall {
            m: &c.moe,
            w,
            act: kind,
            xn,
            n,
            dim: c.dim,
            down_t,
            threshold,
            dense_rows: mode.dense_rows(start, n),
            layer: l,
            store: store.as_deref(),
            exact: matches!(mode, Sparsity::ExactRelu),
            predictors,
        };
        moe_ffn(&call, moe, profiler, out)
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
    match site_read(mode, t, start + first, n_out) {
        SiteRead::Kept(p, t) => {
            let oc = model.output_copy()?;
            logits.resize(model.output.rows(), 0.0);
            let ys: &mut [&mut [f32]] = &mut [&mut logits];
            let mats = [SiteMatrix {
                w: model.output.view(),
                m: &oc.w,
                crossover: oc.crossover,
            }];
            project_kept(&mats, &s.xn, p.score, &oc.norms, t, &mut s.input, ys)?;
        }
        read => {
            if let SiteRead::Masked(p, t, dense) = read {
                let oc = model.output_copy()?;
                mask_rows(p.score, &oc.norms, t, &mut s.xn, dense);
            }
            project(&model.output, &s.xn, n_out, &mut logits, s.arith)?;
        }
    }
    if let Some(cap) = p.softcap {
        logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
    }
    mark(Phase::Output);
    Ok(logits)
}
