//! A layer's attention block on the CPU, as its program's steps say (norm, q/k/v, q/k norms,
//! RoPE, attention over the cache, output, post-norm, residual), for one context's run of
//! tokens or the decode rows of several contexts; the hybrid executor's GPU twin is
//! `hybrid::executor`'s attention.

use powerinfer_core::Result;

use crate::attend_pass::attend_pass;
use crate::attention::AttnShape;
use crate::input_sparse::{site_matrix, Site};
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
                    sinks: lw.attn_sinks.as_deref(),
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
