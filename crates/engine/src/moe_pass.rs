//! One token through a routed layer's dense experts, as one parallel pass
//! ([`powerinfer_cpu::in_pass`]): every thread of the pool takes its share of the router's rows;
//! after a barrier each routes the token itself (the same top-k from the same logits, a few
//! hundred nanoseconds); then its byte share of one work list, the routed experts' gate and up
//! rows (and the shared expert's), pairs of rows computed together and activated on the spot;
//! after a barrier its share of all their down rows; after a last barrier its columns of the
//! output, the experts' outputs summed with the routes' weights in route order, then the shared
//! expert's times its gate. One fork-join per layer instead of three (router, gate/up, down)
//! plus the serial steps between them, and every value the one the separate products give:
//! the same kernels on the same prepared inputs, the same sums in the same order.
//!
//! The hybrid executor's CPU part of experts split between the devices takes the same pass with
//! the token's routes given and each expert's cold rows listed: their gate and up rows, then the
//! expert's whole down product over the activations with the hot neurons' left at zero (the
//! original rows, read as dense dot products, where the transposed rows of the cold neurons
//! alone were read as scattered sums at a third of the speed).

use std::cell::RefCell;

use powerinfer_core::{ensure, MoeFeatures, Result, Weight};
use powerinfer_cpu::{in_pass, Disjoint, PreparedX};

use crate::ffn::activate;
use crate::layer::FfnKind;
use crate::moe_weights::{route, shared_scale, MoeWeights};

/// Rows per piece of a thread's share of a product (the matvec kernels' row groups).
const ALIGN: usize = 8;
/// Columns per piece of a thread's share of the output sum (a cache line of f32).
const COLS: usize = 16;

thread_local! {
    /// The token's routes, as each thread of a pass computes them.
    static ROUTES: RefCell<Vec<(u32, f32)>> = const { RefCell::new(Vec::new()) };
}

/// What one [`experts_pass`] computes.
pub(crate) struct ExpertsPass<'a> {
    pub m: &'a MoeFeatures,
    pub w: &'a MoeWeights,
    pub act: FfnKind,
    /// The FFN input after the norm (dim).
    pub xn: &'a [f32],
    pub dim: usize,
    /// Router logits computed before the attention block; None: the pass computes them.
    pub early: Option<&'a [f32]>,
    /// The token's routes where the caller routed it; None: each thread routes it.
    pub routes: Option<&'a [(u32, f32)]>,
    /// Per expert the rows to compute, ascending (an expert with none is skipped); None: every
    /// row of each routed expert.
    pub rows: Option<&'a [Vec<u32>]>,
    /// Whether the shared expert (where the layer has one) runs in this pass.
    pub shared: bool,
}

/// Rows of expert `e` this pass computes (all `ef` without a list).
fn listed(rows: Option<&[Vec<u32>]>, e: usize) -> Option<&[u32]> {
    rows.map(|r| r.get(e).map_or(&[][..], |v| &v[..]))
}

/// `out` (dim) += the pass's experts' outputs (see [`ExpertsPass`]); `bufs` is scratch kept
/// across tokens.
pub(crate) fn experts_pass(
    p: &ExpertsPass<'_>,
    bufs: &mut Vec<Vec<f32>>,
    out: &mut [f32],
) -> Result<()> {
    let (w, m, act, dim) = (p.w, p.m, p.act, p.dim);
    ensure!(
        out.len() == dim,
        Shape,
        "the experts' output is {} long, want {dim}",
        out.len()
    );
    let k = m.n_expert_used.min(m.n_expert);
    let sh = w.shared.as_ref().filter(|_| p.shared);
    let items = k + usize::from(sh.is_some());
    let xp = PreparedX::new(p.xn, true);
    match (p.routes, p.early) {
        (Some(r), _) => ensure!(
            r.len() <= k && r.iter().all(|&(e, _)| (e as usize) < m.n_expert),
            Shape,
            "{} routes for {} experts, top-{k}",
            r.len(),
            m.n_expert
        ),
        (None, Some(l)) => ensure!(
            l.len() == m.n_expert,
            Other,
            "router logits for {} values, want {} experts",
            l.len(),
            m.n_expert
        ),
        (None, None) => xp.check(&w.router)?,
    }
    // Every expert is a row block of the same tensors: the first one's shapes are all of them.
    let (ef, sh_ef) = (w.gate[0].rows, sh.map_or(0, |s| s.gate.rows));
    let shapes = std::iter::once((&w.gate[0], &w.up[0], &w.down[0], ef))
        .chain(sh.map(|s| (&s.gate, &s.up, &s.down, sh_ef)));
    for (g, u, dn, rows) in shapes {
        xp.check(g)?;
        xp.check(u)?;
        ensure!(
            u.rows == rows && dn.rows == dim && dn.cols == rows,
            Shape,
            "an expert of {rows} neurons has up {} x {} and down {} x {} (dim {dim})",
            u.rows,
            u.cols,
            dn.rows,
            dn.cols
        );
    }
    if let Some(rows) = p.rows {
        ensure!(
            rows.len() == m.n_expert,
            Shape,
            "{} row lists for {} experts",
            rows.len(),
            m.n_expert
        );
        for ids in rows {
            xp.check_listed(&w.gate[0], ids)?;
        }
    }
    let scale = sh.map_or(0.0, |sh| shared_scale(sh, p.xn));
    let down_quantized =
        w.down[0].dtype.is_quantized() || sh.is_some_and(|s| s.down.dtype.is_quantized());
    // Buffers: the logits; per item its gate and up values (compact, one per computed row), its
    // activations (all its neurons, zero where not computed) and its output; then `out`.
    let (lg, gate, up, hid, y) = (0, 1, 1 + items, 1 + 2 * items, 1 + 3 * items);
    let width = |i: usize| if i < k { ef } else { sh_ef };
    bufs.resize_with(1 + 4 * items, Vec::new);
    for (i, b) in bufs.iter_mut().enumerate() {
        let len = match i {
            0 => m.n_expert,
            i if i < hid => width((i - gate) % items),
            i if i < y => width(i - hid),
            _ => dim,
        };
        b.clear();
        b.resize(len, 0.0);
    }
    let mut slices: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    slices.push(out);
    let d = Disjoint::new(&mut slices);
    let o = d.len() - 1;
    in_pass(|pass| {
        if p.routes.is_none() && p.early.is_none() {
            let router = [(m.n_expert, w.router.row_bytes())];
            pass.share(&router, 1, |_, rows| {
                // SAFETY: this thread's rows of the logits, written by it alone before the sync.
                let part = unsafe { d.part(lg, rows.clone()) };
                xp.rows(&w.router, rows, part);
            });
            pass.sync();
        }
        ROUTES.with_borrow_mut(|own| {
            let routes: &[(u32, f32)] = match p.routes {
                Some(r) => r,
                None => {
                    // SAFETY: the logits are complete (synced) and nobody writes them any more.
                    let logits = p.early.unwrap_or_else(|| unsafe { d.read(lg) });
                    route(m, logits, own);
                    own
                }
            };
            // Item i: route i's expert, or past the routes the shared expert; its weights and
            // the rows computed (None: all).
            let n = routes.len() + usize::from(sh.is_some());
            let item = |i: usize| -> (&Weight, &Weight, &Weight, Option<&[u32]>, usize) {
                match (routes.get(i), sh) {
                    (Some(&(e, _)), _) => {
                        let e = e as usize;
                        // A list of every row is the contiguous rows.
                        let ids = listed(p.rows, e).filter(|v| v.len() < ef);
                        (&w.gate[e], &w.up[e], &w.down[e], ids, ef)
                    }
                    (None, Some(sh)) => (&sh.gate, &sh.up, &sh.down, None, sh_ef),
                    (None, None) => unreachable!("item {i} beyond the routes"),
                }
            };
            let computed = |i: usize| {
                let (.., ids, width) = item(i);
                ids.map_or(width, |v| v.len())
            };
            // Gate and up rows in pairs, activated as soon as both are computed and placed at
            // their neurons.
            let pairs: Vec<(usize, usize)> = (0..n)
                .map(|i| {
                    let (g, u, ..) = item(i);
                    (computed(i), g.row_bytes() + u.row_bytes())
                })
                .collect();
            pass.share(&pairs, ALIGN, |i, at| {
                let (g, u, _, ids, _) = item(i);
                // SAFETY: this thread's rows of item i's gate and up, its own until the sync.
                let (gp, upart) =
                    unsafe { (d.part(gate + i, at.clone()), d.part(up + i, at.clone())) };
                match ids {
                    Some(ids) => {
                        xp.rows_listed(g, &ids[at.clone()], gp);
                        xp.rows_listed(u, &ids[at.clone()], upart);
                    }
                    None => {
                        xp.rows(g, at.clone(), gp);
                        xp.rows(u, at.clone(), upart);
                    }
                }
                activate(act, gp, upart);
                match ids {
                    Some(ids) => {
                        for (&j, &h) in ids[at].iter().zip(gp.iter()) {
                            // SAFETY: neuron j is in this thread's rows alone (the lists are
                            // ascending, so no index repeats across shares).
                            unsafe { d.part(hid + i, j as usize..j as usize + 1)[0] = h };
                        }
                    }
                    // SAFETY: these neurons are this thread's until the sync.
                    None => unsafe { d.part(hid + i, at) }.copy_from_slice(gp),
                }
            });
            pass.sync();
            // Down rows (whole: the neurons not computed are zero), each item's activations
            // prepared once by each thread that needs them.
            let downs: Vec<(usize, usize)> = (0..n)
                .map(|i| match computed(i) {
                    0 => (0, 0),
                    _ => {
                        let (_, _, dn, ..) = item(i);
                        (dn.rows, dn.row_bytes())
                    }
                })
                .collect();
            let mut hs: Vec<Option<PreparedX<'_>>> = (0..n).map(|_| None).collect();
            pass.share(&downs, ALIGN, |i, rows| {
                let (_, _, dn, ..) = item(i);
                let h = hs[i].get_or_insert_with(|| {
                    // SAFETY: the activations are complete (synced) and read-only from here.
                    PreparedX::new(unsafe { d.read(hid + i) }, down_quantized)
                });
                // SAFETY: this thread's rows of item i's output, its own until the sync.
                h.rows(dn, rows.clone(), unsafe { d.part(y + i, rows) });
            });
            pass.sync();
            // This thread's columns of the sum, in route order, then the shared expert.
            let cols = pass.span(dim, COLS);
            // SAFETY: these columns of `out` are this thread's; the outputs are complete.
            let acc = unsafe { d.part(o, cols.clone()) };
            for (i, &(_, wt)) in routes.iter().enumerate() {
                if computed(i) == 0 {
                    continue;
                }
                // SAFETY: as above.
                let yi = unsafe { &d.read(y + i)[cols.clone()] };
                acc.iter_mut().zip(yi).for_each(|(a, v)| *a += wt * v);
            }
            if sh.is_some() {
                // SAFETY: as above.
                let ys = unsafe { &d.read(y + routes.len())[cols.clone()] };
                acc.iter_mut().zip(ys).for_each(|(a, v)| *a += scale * v);
            }
        });
    });
    Ok(())
}
