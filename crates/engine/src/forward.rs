//! One forward pass over a chunk of tokens: the dense llama layer loop.

use powerinfer_core::{ensure, Activation, Result, Weight};
use powerinfer_cpu::{matmul, matvec, matvec_many};
use rayon::prelude::*;

use crate::attention::{attention, AttnShape};
use crate::kv_cache::KvCache;
use crate::norm_rope::{apply_rope, rms_norm, RopeAngles};
use crate::weights::ModelWeights;

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (decoding).
    Last,
    /// Every token's (scoring, perplexity).
    All,
}

/// `y = W x` for n tokens: a matvec for one token, a batched matmul for more.
fn project(w: &Weight, x: &[f32], n: usize, y: &mut Vec<f32>) -> Result<()> {
    y.resize(n * w.rows, 0.0);
    match n {
        1 => matvec(w, x, y),
        _ => matmul(w, x, n, y),
    }
}

/// `ys[i] = ws[i] x` for n tokens; one parallel region for all weights when decoding.
fn project_many<const K: usize>(
    ws: [&Weight; K],
    x: &[f32],
    n: usize,
    ys: [&mut Vec<f32>; K],
) -> Result<()> {
    if n > 1 {
        for (w, y) in ws.into_iter().zip(ys) {
            project(w, x, n, y)?;
        }
        return Ok(());
    }
    let mut outs: Vec<&mut [f32]> = Vec::with_capacity(K);
    for (w, y) in ws.iter().zip(ys) {
        y.resize(w.rows, 0.0);
        outs.push(y.as_mut_slice());
    }
    matvec_many(&ws, x, &mut outs)
}

/// RMSNorm every row of `x` (n rows of `w.len()`) into `out`.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
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

/// `gate = act(gate) * up`, elementwise; parallel only when there is enough work.
fn gated_activation(act: Activation, gate: &mut [f32], up: &[f32]) {
    const CHUNK: usize = 16 * 1024;
    let apply = |g: &mut [f32], u: &[f32]| {
        g.iter_mut()
            .zip(u)
            .for_each(|(g, u)| *g = act.apply(*g) * u)
    };
    if gate.len() <= CHUNK {
        apply(gate, up);
    } else {
        gate.par_chunks_mut(CHUNK)
            .zip(up.par_chunks(CHUNK))
            .for_each(|(g, u)| apply(g, u));
    }
}

/// Scratch buffers reused across layers and calls.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// Run `tokens` (positions `cache.len()..`) through the model, append their keys and values to
/// `cache`, and return the requested logits (n_out × vocab, row-major).
pub fn forward(
    model: &ModelWeights,
    cache: &mut KvCache,
    scratch: &mut Scratch,
    tokens: &[u32],
    which: Logits,
) -> Result<Vec<f32>> {
    let c = &model.config;
    let n = tokens.len();
    ensure!(n > 0, Shape, "forward needs at least one token");
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        powerinfer_core::bail!(
            Token,
            "token id {bad} is not below the vocabulary size {}",
            c.vocab_size
        );
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
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: c.head_dim,
    };

    for (l, layer) in model.layers.iter().enumerate() {
        norm_rows(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xn);
        project_many(
            [&layer.wq, &layer.wk, &layer.wv],
            &s.xn,
            n,
            [&mut s.q, &mut s.k, &mut s.v],
        )?;
        let rows =
            s.q.chunks_exact_mut(c.q_dim())
                .zip(s.k.chunks_exact_mut(c.kv_dim()));
        for ((q, k), ang) in rows.zip(&angles) {
            apply_rope(q, c.head_dim, ang, c.rope_style);
            apply_rope(k, c.head_dim, ang, c.rope_style);
        }
        cache.write(l, start, &s.k, &s.v);
        let (keys, values) = cache.layer(l, start + n);
        s.att.resize(n * c.q_dim(), 0.0);
        attention(&shape, &s.q, keys, values, start, &mut s.att);
        project(&layer.wo, &s.att, n, &mut s.o)?;
        s.x.iter_mut().zip(&s.o).for_each(|(x, o)| *x += o);

        norm_rows(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.xn);
        project_many(
            [&layer.w_gate, &layer.w_up],
            &s.xn,
            n,
            [&mut s.gate, &mut s.up],
        )?;
        gated_activation(c.activation, &mut s.gate, &s.up);
        project(&layer.w_down, &s.gate, n, &mut s.down)?;
        s.x.iter_mut().zip(&s.down).for_each(|(x, d)| *x += d);
    }
    cache.set_len(start + n);

    let (first, n_out) = match which {
        Logits::Last => (n - 1, 1),
        Logits::All => (0, n),
    };
    norm_rows(
        &s.x[first * c.dim..],
        &model.output_norm,
        c.rms_eps,
        &mut s.xn,
    );
    let mut logits = Vec::new();
    project(&model.output, &s.xn, n_out, &mut logits)?;
    Ok(logits)
}
