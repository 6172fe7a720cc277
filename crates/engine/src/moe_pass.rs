//! One token through a routed layer with dense experts, as one parallel pass
//! ([`powerinfer_cpu::in_pass`]): every thread of the pool takes its share of the router's rows;
//! after a barrier each routes the token itself (the same top-k from the same logits, a few
//! hundred nanoseconds); then its byte share of one work list, the routed experts' gate and up
//! rows (and the shared expert's), pairs of rows computed together and activated on the spot;
//! after a barrier its share of all their down rows; after a last barrier its columns of the
//! output, the experts' outputs summed with the routes' weights in route order, then the shared
//! expert's times its gate. One fork-join per layer instead of three (router, gate/up, down)
//! plus the serial steps between them, and every value the one the separate products give:
//! the same kernels on the same prepared inputs, the same sums in the same order.

use std::cell::RefCell;

use powerinfer_core::{ensure, Result, Weight};
use powerinfer_cpu::{in_pass, Disjoint, PreparedX};

use crate::ffn::activate;
use crate::moe::{route, shared_scale, MoeCall, MoeScratch};

/// Rows per piece of a thread's share of a product (the matvec kernels' row groups).
const ALIGN: usize = 8;
/// Columns per piece of a thread's share of the output sum (a cache line of f32).
const COLS: usize = 16;

thread_local! {
    /// The token's routes, as each thread of a pass computes them.
    static ROUTES: RefCell<Vec<(u32, f32)>> = const { RefCell::new(Vec::new()) };
}

/// The token's routed experts and shared expert: `out` (dim, zero) += each routed expert's
/// output times its weight, then the shared expert's times its scale. Router logits from
/// `early` where the family computes them before attention, else from the router's rows here.
pub(crate) fn decode_pass(call: &MoeCall<'_>, s: &mut MoeScratch, out: &mut [f32]) -> Result<()> {
    let (w, m, act, dim) = (call.w, call.m, call.act, call.dim);
    let k = m.n_expert_used.min(m.n_expert);
    let sh = w.shared.as_ref();
    let items = k + usize::from(sh.is_some());
    let xp = PreparedX::new(call.xn, true);
    let early = m.router_on_residual;
    if early {
        ensure!(
            s.early.len() == m.n_expert,
            Other,
            "router logits for {} values, want {} experts",
            s.early.len(),
            m.n_expert
        );
    } else {
        xp.check(&w.router)?;
    }
    // Every expert is a row block of the same tensors: the first one's shapes are all of them.
    let (ef, sh_ef) = (w.gate[0].rows, sh.map_or(0, |s| s.gate.rows));
    for g in [&w.gate[0], &w.up[0]]
        .into_iter()
        .chain(sh.map(|s| [&s.gate, &s.up]).into_iter().flatten())
    {
        xp.check(g)?;
    }
    let shapes =
        std::iter::once((&w.up[0], &w.down[0], ef)).chain(sh.map(|s| (&s.up, &s.down, sh_ef)));
    for (u, dn, rows) in shapes {
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
    let scale = sh.map_or(0.0, |sh| shared_scale(sh, call.xn));
    let down_quantized =
        w.down[0].dtype.is_quantized() || sh.is_some_and(|s| s.down.dtype.is_quantized());
    // Buffers: the logits, per item its gate (then activation), up and output, and `out`.
    let (lg, gate, up, y) = (0, 1, 1 + items, 1 + 2 * items);
    s.bufs.resize_with(1 + 3 * items, Vec::new);
    for (i, b) in s.bufs.iter_mut().enumerate() {
        let len = match i {
            0 => m.n_expert,
            i if i < up => width(i - gate, k, ef, sh_ef),
            i if i < y => width(i - up, k, ef, sh_ef),
            _ => dim,
        };
        b.resize(len, 0.0);
    }
    let mut bufs: Vec<&mut [f32]> = s.bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    bufs.push(out);
    let d = Disjoint::new(&mut bufs);
    let o = d.len() - 1;
    let early_logits = &s.early;
    in_pass(|p| {
        if !early {
            let router = [(m.n_expert, w.router.row_bytes())];
            p.share(&router, 1, |_, rows| {
                // SAFETY: this thread's rows of the logits, written by it alone before the sync.
                let part = unsafe { d.part(lg, rows.clone()) };
                xp.rows(&w.router, rows, part);
            });
            p.sync();
        }
        ROUTES.with_borrow_mut(|routes| {
            // SAFETY: the logits are complete (synced) and nobody writes them any more.
            let logits = if early {
                &early_logits[..]
            } else {
                unsafe { d.read(lg) }
            };
            route(m, logits, routes);
            let weights = |i: usize| -> (&Weight, &Weight, &Weight) {
                match (routes.get(i), sh) {
                    (Some(&(e, _)), _) => {
                        let e = e as usize;
                        (&w.gate[e], &w.up[e], &w.down[e])
                    }
                    (None, Some(sh)) => (&sh.gate, &sh.up, &sh.down),
                    (None, None) => unreachable!("item {i} beyond the routes"),
                }
            };
            let n = routes.len() + usize::from(sh.is_some());
            // Gate and up rows in pairs, activated as soon as both are computed.
            let pairs: Vec<(usize, usize)> = (0..n)
                .map(|i| {
                    let (g, u, _) = weights(i);
                    (g.rows, g.row_bytes() + u.row_bytes())
                })
                .collect();
            p.share(&pairs, ALIGN, |i, rows| {
                let (g, u, _) = weights(i);
                // SAFETY: this thread's rows of item i's gate and up, its own until the sync.
                let (gp, upart) =
                    unsafe { (d.part(gate + i, rows.clone()), d.part(up + i, rows.clone())) };
                xp.rows(g, rows.clone(), gp);
                xp.rows(u, rows, upart);
                activate(act, gp, upart);
            });
            p.sync();
            // Down rows, each item's activation prepared once by each thread that needs it.
            let downs: Vec<(usize, usize)> = (0..n)
                .map(|i| {
                    let (_, _, dn) = weights(i);
                    (dn.rows, dn.row_bytes())
                })
                .collect();
            let mut hs: Vec<Option<PreparedX<'_>>> = (0..n).map(|_| None).collect();
            p.share(&downs, ALIGN, |i, rows| {
                let (_, _, dn) = weights(i);
                let h = hs[i].get_or_insert_with(|| {
                    // SAFETY: the activations are complete (synced) and read-only from here.
                    PreparedX::new(unsafe { d.read(gate + i) }, down_quantized)
                });
                // SAFETY: this thread's rows of item i's output, its own until the sync.
                h.rows(dn, rows.clone(), unsafe { d.part(y + i, rows) });
            });
            p.sync();
            // This thread's columns of the sum, in route order, then the shared expert.
            let cols = p.span(dim, COLS);
            // SAFETY: these columns of `out` are this thread's; the outputs are complete.
            let acc = unsafe { d.part(o, cols.clone()) };
            for (i, &(_, wt)) in routes.iter().enumerate() {
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

/// Rows of item `i`'s gate: a routed expert's, or past the `k` routes the shared expert's.
fn width(i: usize, k: usize, ef: usize, sh_ef: usize) -> usize {
    if i < k {
        ef
    } else {
        sh_ef
    }
}
