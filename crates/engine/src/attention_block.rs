//! A layer's attention block on the CPU, as its program's steps say (norm, q/k/v, q/k norms,
//! RoPE, attention over the cache, output, post-norm, residual), for one context's run of
//! tokens or the decode rows of several contexts; the hybrid executor's GPU twin is
//! `hybrid::executor`'s attention.

use powerinfer_core::Result;

use crate::attention::{attention, AttnShape};
use crate::ffn::Arith;
use crate::input_sparse::{site_matrix, Site};
use crate::kv_cache::KvCache;
use crate::kv_rotation::{rotate, rotated, KvRotation};
use crate::layer::AttnStep;
use crate::norm_rope::apply_rope;
use crate::pass_rows::Kv;
use crate::pass_scratch::{
    add_rows, norm_bias, norm_heads, norm_rows, norm_rows_with, Angles, Scratch,
};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::project_site::{project_site, SiteCopies, SiteRead};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

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
                let read = SiteRead::at(mode, l, Site::AttnIn, start, n);
                let copies = || {
                    let ic = model.input_copies()?;
                    let cp = &ic.layers[l];
                    Ok(SiteCopies {
                        mats: [
                            site_matrix(ic, &lw.wq, &cp.q),
                            site_matrix(ic, &lw.wk, &cp.k),
                            site_matrix(ic, &lw.wv, &cp.v),
                        ],
                        norms: &cp.norms[Site::AttnIn as usize],
                    })
                };
                let dense = [(&lw.wq).into(), (&lw.wk).into(), (&lw.wv).into()];
                let ys = [&mut s.q, &mut s.k, &mut s.v];
                project_site(read, dense, copies, &mut s.xn, n, &mut s.input, ys, arith)?;
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
                let shape = AttnShape {
                    n_heads: c.n_heads,
                    n_kv_heads: c.n_kv_heads,
                    head_dim: c.head_dim,
                    window: p.window,
                    scale: Some(p.scale),
                    softcap: p.softcap,
                };
                attend_pass(&shape, arith, kv, l, s, n);
            }
            AttnStep::Mla(p) => {
                crate::mla::mla_attention(c, lw, l, p, kv, s, n, angles)?;
            }
            AttnStep::Output { bias } => {
                if let Some(p) = profiler.as_deref_mut() {
                    p.record_site(l, Site::AttnOut, &s.att);
                }
                let read = SiteRead::at(mode, l, Site::AttnOut, start, n);
                let copies = || {
                    let ic = model.input_copies()?;
                    let cp = &ic.layers[l];
                    Ok(SiteCopies {
                        mats: [site_matrix(ic, &lw.wo, &cp.o)],
                        norms: &cp.norms[Site::AttnOut as usize],
                    })
                };
                let (dense, ys) = ([(&lw.wo).into()], [&mut s.o]);
                project_site(read, dense, copies, &mut s.att, n, &mut s.input, ys, arith)?;
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

/// The attention of the pass's `n` rows in `s.q`/`s.k`/`s.v` into `s.att`, their keys and
/// values written into their caches first: one context's run in `arith`, or each slot's rows
/// over its own cache as decode steps.
pub(crate) fn attend_pass(
    shape: &AttnShape,
    arith: Arith,
    kv: &mut Kv<'_, '_>,
    l: usize,
    s: &mut Scratch,
    n: usize,
) {
    let (qd, kd) = (shape.n_heads * shape.head_dim, cache_width(shape));
    s.att.resize(n * qd, 0.0);
    match kv {
        Kv::Run { cache, start } => {
            let (q, k, v, att) = (&s.q[..], &s.k[..], &s.v[..], &mut s.att[..]);
            attend_rows(shape, arith, cache, l, *start, q, k, v, att);
        }
        Kv::Slots(slots) => {
            let mut row = 0;
            for slot in slots.iter_mut() {
                let (a, b) = (row, row + slot.rows);
                let start = slot.cache.len();
                attend_rows(
                    shape,
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

/// The keys and values of rows at positions `start..` into `cache` (layer `l`; rotated where
/// a side is quantized, [`KvRotation`]), and their attention over it: one pass over all
/// queries ([`Arith::Batch`]) or one query at a time, as decode steps attend
/// ([`Arith::Steps`]).
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
    // A quantized side is kept rotated (llama.cpp's attn_rot_k/v): keys and the queries that
    // meet them, values and the outputs they make.
    let rot = KvRotation::of(cache.types(), shape.head_dim);
    cache.write(l, start, &rotated(k, rot.k), &rotated(v, rot.v));
    let q = rotated(q, rot.k);
    let (keys, values) = cache.rows(l, start + n);
    match arith {
        Arith::Batch => attention(shape, &q[..], keys, values, start, att),
        Arith::Steps => {
            let qd = shape.n_heads * shape.head_dim;
            for (t, (q, o)) in q.chunks_exact(qd).zip(att.chunks_exact_mut(qd)).enumerate() {
                attention(shape, q, keys, values, start + t, o);
            }
        }
    }
    if let Some(block) = rot.v {
        rotate(att, block);
    }
}

/// Values per position of a cache row (keys or values) for `shape`.
fn cache_width(shape: &AttnShape) -> usize {
    shape.n_kv_heads * shape.head_dim
}
