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

use std::ops::Range;

use powerinfer_core::{ensure, MoeFeatures, Result, Weight};
use powerinfer_cpu::{in_pass, Disjoint, Interleaved, Pass, PreparedX};

use crate::ffn::activate;
use crate::layer::FfnKind;
use crate::moe_weights::{route, shared_scale, ExpertBias, MoeWeights, SharedExpert};

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
    let (w, m, dim) = (p.w, p.m, p.dim);
    ensure!(
        out.len() == dim,
        Shape,
        "the experts' output is {} long, want {dim}",
        out.len()
    );
    let k = m.n_expert_used.min(m.n_expert);
    let sh = w.shared.as_ref().filter(|_| p.shared);
    let xp = PreparedX::new(p.xn, true);
    check_pass(p, &xp, k, sh)?;
    // Every expert is a row block of the same tensors: the first one's shapes are all of them.
    let (ef, sh_ef) = (w.gate[0].rows, sh.map_or(0, |s| s.gate.rows));
    let at = BufIndex::new(k + usize::from(sh.is_some()));
    at.size(bufs, k, ef, sh_ef, m.n_expert, dim);
    let mut slices: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    slices.push(out);
    let d = Disjoint::new(&mut slices);
    let run = PassRun {
        p,
        sh,
        scale: sh.map_or(0.0, |sh| shared_scale(sh, p.xn)),
        down_quantized: w.down[0].dtype.is_quantized()
            || sh.is_some_and(|s| s.down.dtype.is_quantized()),
        ef,
        sh_ef,
        xp,
        o: d.len() - 1,
        d,
        at,
    };
    in_pass(|pass| run.thread(pass));
    Ok(())
}

/// The pass's inputs against its weights: the given routes, early logits or the router; the
/// experts' (and the shared expert's) shapes; the row lists.
fn check_pass(
    p: &ExpertsPass<'_>,
    xp: &PreparedX<'_>,
    k: usize,
    sh: Option<&SharedExpert>,
) -> Result<()> {
    let (w, m, dim) = (p.w, p.m, p.dim);
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
    Ok(())
}

/// Where the pass's buffers are: the logits; per item (route i's expert up to top-k, then the
/// shared expert) its gate and up values (compact, one per computed row), its activations (all
/// its neurons, zero where not computed) and its output; then `out`.
#[derive(Clone, Copy)]
struct BufIndex {
    items: usize,
    lg: usize,
    gate: usize,
    up: usize,
    hid: usize,
    y: usize,
}

impl BufIndex {
    /// The buffers of `items` items.
    fn new(items: usize) -> BufIndex {
        BufIndex {
            items,
            lg: 0,
            gate: 1,
            up: 1 + items,
            hid: 1 + 2 * items,
            y: 1 + 3 * items,
        }
    }

    /// Size and zero `bufs` for `k` routed experts of `ef` neurons and a shared expert of
    /// `sh_ef`, `n_expert` logits and outputs of `dim`.
    fn size(
        &self,
        bufs: &mut Vec<Vec<f32>>,
        k: usize,
        ef: usize,
        sh_ef: usize,
        n_expert: usize,
        dim: usize,
    ) {
        let width = |i: usize| if i < k { ef } else { sh_ef };
        bufs.resize_with(1 + 4 * self.items, Vec::new);
        for (i, b) in bufs.iter_mut().enumerate() {
            let len = match i {
                0 => n_expert,
                i if i < self.hid => width((i - self.gate) % self.items),
                i if i < self.y => width(i - self.hid),
                _ => dim,
            };
            b.clear();
            b.resize(len, 0.0);
        }
    }
}

/// One of an item's matrices: its rows, and where the layer is packed
/// ([`crate::moe_weights::PackedExperts`]) the interleaved tensor that holds them from a row on.
#[derive(Clone, Copy)]
struct Mat<'w> {
    w: &'w Weight,
    packed: Option<(&'w Interleaved, usize)>,
}

impl<'w> Mat<'w> {
    /// `w`, interleaved as rows `at..` of `packed` where there is one.
    fn new(w: &'w Weight, packed: Option<&'w std::sync::Arc<Interleaved>>, at: usize) -> Self {
        Mat {
            w,
            packed: packed.map(|p| (&**p, at)),
        }
    }

    /// `out` = its rows `rows` dotted with `x` (a share of a pass: eight-aligned, or to the end).
    fn rows(&self, x: &PreparedX<'_>, rows: Range<usize>, out: &mut [f32]) {
        match self.packed {
            Some((il, at)) => x.rows_interleaved(il, at + rows.start..at + rows.end, out),
            None => x.rows(self.w, rows, out),
        }
    }
}

/// A layer without packed experts: every matrix read in rows.
static UNPACKED: [Option<std::sync::Arc<Interleaved>>; 3] = [None, None, None];

/// One item of a thread's pass: an expert's gate, up and down, the rows computed (None: all)
/// and its neurons.
type Item<'w> = (Mat<'w>, Mat<'w>, Mat<'w>, Option<&'w [u32]>, usize);

/// The pass's items once the token is routed: route i's expert, then the shared expert.
struct Items<'r> {
    routes: &'r [(u32, f32)],
    w: &'r MoeWeights,
    sh: Option<&'r SharedExpert>,
    rows: Option<&'r [Vec<u32>]>,
    ef: usize,
    sh_ef: usize,
}

impl<'r> Items<'r> {
    /// The routes, then the shared expert where it runs.
    fn len(&self) -> usize {
        self.routes.len() + usize::from(self.sh.is_some())
    }

    /// Item i's weights and the rows it computes (None: all).
    fn item(&self, i: usize) -> Item<'r> {
        let (w, ef) = (self.w, self.ef);
        match (self.routes.get(i), self.sh) {
            (Some(&(e, _)), _) => {
                let e = e as usize;
                // A list of every row is the contiguous rows.
                let ids = listed(self.rows, e).filter(|v| v.len() < ef);
                let [g, u, d] = w.packed.as_ref().map_or(&UNPACKED, |p| &p.experts);
                let dim = w.down[e].rows;
                (
                    Mat::new(&w.gate[e], g.as_ref(), e * ef),
                    Mat::new(&w.up[e], u.as_ref(), e * ef),
                    Mat::new(&w.down[e], d.as_ref(), e * dim),
                    ids,
                    ef,
                )
            }
            (None, Some(sh)) => {
                let [g, u, d] = w.packed.as_ref().map_or(&UNPACKED, |p| &p.shared);
                (
                    Mat::new(&sh.gate, g.as_ref(), 0),
                    Mat::new(&sh.up, u.as_ref(), 0),
                    Mat::new(&sh.down, d.as_ref(), 0),
                    None,
                    self.sh_ef,
                )
            }
            (None, None) => unreachable!("item {i} beyond the routes"),
        }
    }

    /// Route i's expert and the layer's expert biases, where it has them (the shared expert
    /// has none).
    fn bias(&self, i: usize) -> Option<(usize, &'r ExpertBias)> {
        let &(e, _) = self.routes.get(i)?;
        Some((e as usize, self.w.expert_bias.as_ref()?))
    }

    /// Rows of item i computed.
    fn computed(&self, i: usize) -> usize {
        let (.., ids, width) = self.item(i);
        ids.map_or(width, |v| v.len())
    }
}

/// `out` (a thread's share `rows` of expert `e`'s values, or of its listed rows `ids[rows]`)
/// += the expert's part of `bias` (`width` values per expert).
fn add_bias(
    out: &mut [f32],
    bias: &[f32],
    e: usize,
    ids: Option<&[u32]>,
    rows: std::ops::Range<usize>,
    width: usize,
) {
    let b = ExpertBias::of(bias, e, width);
    match ids {
        Some(ids) => {
            for (o, &j) in out.iter_mut().zip(&ids[rows]) {
                *o += b[j as usize];
            }
        }
        None => out.iter_mut().zip(&b[rows]).for_each(|(o, b)| *o += b),
    }
}

/// One pass over the pool: what every thread shares.
struct PassRun<'a> {
    p: &'a ExpertsPass<'a>,
    sh: Option<&'a SharedExpert>,
    /// The shared expert's scale.
    scale: f32,
    /// Whether some down product is quantized (its activations are prepared quantized).
    down_quantized: bool,
    ef: usize,
    sh_ef: usize,
    xp: PreparedX<'a>,
    d: Disjoint<'a>,
    /// `out`'s index in `d`.
    o: usize,
    at: BufIndex,
}

impl PassRun<'_> {
    /// One thread's pass: its share of the router, after a barrier the token's routes, its
    /// share of the gate and up rows, after a barrier of the down rows, after a last barrier
    /// its columns of the sum.
    fn thread(&self, pass: &Pass<'_>) {
        let (p, d, m) = (self.p, &self.d, self.p.m);
        if p.routes.is_none() && p.early.is_none() {
            let router = [(m.n_expert, p.w.router.row_bytes())];
            pass.share(&router, 1, |_, rows| {
                // SAFETY: this thread's rows of the logits, written by it alone before the sync.
                let part = unsafe { d.part(self.at.lg, rows.clone()) };
                self.xp.rows(&p.w.router, rows.clone(), part);
                if let Some(b) = &p.w.expert_bias {
                    part.iter_mut()
                        .zip(&b.router[rows])
                        .for_each(|(l, b)| *l += b);
                }
            });
            pass.sync();
        }
        ROUTES.with_borrow_mut(|own| {
            let routes: &[(u32, f32)] = match p.routes {
                Some(r) => r,
                None => {
                    // SAFETY: the logits are complete (synced) and nobody writes them any more.
                    let logits = p.early.unwrap_or_else(|| unsafe { d.read(self.at.lg) });
                    route(m, p.w.score_bias.as_deref(), logits, own);
                    own
                }
            };
            let items = Items {
                routes,
                w: p.w,
                sh: self.sh,
                rows: p.rows,
                ef: self.ef,
                sh_ef: self.sh_ef,
            };
            self.gate_up(pass, &items);
            pass.sync();
            self.down(pass, &items);
            pass.sync();
            self.sum(pass, &items);
        });
    }

    /// This thread's share of the items' gate and up rows, in pairs, activated as soon as
    /// both are computed and placed at their neurons.
    fn gate_up(&self, pass: &Pass<'_>, items: &Items<'_>) {
        let (d, at) = (&self.d, self.at);
        let pairs: Vec<(usize, usize)> = (0..items.len())
            .map(|i| {
                let (g, u, ..) = items.item(i);
                (items.computed(i), g.w.row_bytes() + u.w.row_bytes())
            })
            .collect();
        pass.share(&pairs, ALIGN, |i, rows| {
            let (g, u, _, ids, _) = items.item(i);
            // SAFETY: this thread's rows of item i's gate and up, its own until the sync.
            let (gp, upart) = unsafe {
                (
                    d.part(at.gate + i, rows.clone()),
                    d.part(at.up + i, rows.clone()),
                )
            };
            match ids {
                Some(ids) => {
                    self.xp.rows_listed(g.w, &ids[rows.clone()], gp);
                    self.xp.rows_listed(u.w, &ids[rows.clone()], upart);
                }
                None => {
                    g.rows(&self.xp, rows.clone(), gp);
                    u.rows(&self.xp, rows.clone(), upart);
                }
            }
            if let Some((e, b)) = items.bias(i) {
                add_bias(gp, &b.gate, e, ids, rows.clone(), self.ef);
                add_bias(upart, &b.up, e, ids, rows.clone(), self.ef);
            }
            activate(self.p.act, gp, upart);
            match ids {
                Some(ids) => {
                    for (&j, &h) in ids[rows].iter().zip(gp.iter()) {
                        // SAFETY: neuron j is in this thread's rows alone (the lists are
                        // ascending, so no index repeats across shares).
                        unsafe { d.part(at.hid + i, j as usize..j as usize + 1)[0] = h };
                    }
                }
                // SAFETY: these neurons are this thread's until the sync.
                None => unsafe { d.part(at.hid + i, rows) }.copy_from_slice(gp),
            }
        });
    }

    /// This thread's share of the items' down rows (whole: the neurons not computed are
    /// zero), each item's activations prepared once by each thread that needs them.
    fn down(&self, pass: &Pass<'_>, items: &Items<'_>) {
        let (d, at) = (&self.d, self.at);
        let downs: Vec<(usize, usize)> = (0..items.len())
            .map(|i| match items.computed(i) {
                0 => (0, 0),
                _ => {
                    let (_, _, dn, ..) = items.item(i);
                    (dn.w.rows, dn.w.row_bytes())
                }
            })
            .collect();
        let mut hs: Vec<Option<PreparedX<'_>>> = (0..items.len()).map(|_| None).collect();
        pass.share(&downs, ALIGN, |i, rows| {
            let (_, _, dn, ..) = items.item(i);
            let h = hs[i].get_or_insert_with(|| {
                // SAFETY: the activations are complete (synced) and read-only from here.
                PreparedX::new(unsafe { d.read(at.hid + i) }, self.down_quantized)
            });
            // SAFETY: this thread's rows of item i's output, its own until the sync.
            let y = unsafe { d.part(at.y + i, rows.clone()) };
            dn.rows(h, rows.clone(), y);
            if let Some((e, b)) = items.bias(i) {
                add_bias(y, &b.down, e, None, rows, self.p.dim);
            }
        });
    }

    /// This thread's columns of `out`: the routed experts' outputs times their weights, in
    /// route order (a biased expert with no row computed: its down bias), then the shared
    /// expert's times its scale.
    fn sum(&self, pass: &Pass<'_>, items: &Items<'_>) {
        let (d, at, routes) = (&self.d, self.at, items.routes);
        let cols = pass.span(self.p.dim, COLS);
        // SAFETY: these columns of `out` are this thread's; the outputs are complete.
        let acc = unsafe { d.part(self.o, cols.clone()) };
        for (i, &(_, wt)) in routes.iter().enumerate() {
            if items.computed(i) == 0 {
                // No row computed: a biased expert's output is its down bias (gpt-oss).
                if let Some((e, b)) = items.bias(i) {
                    let bd = &ExpertBias::of(&b.down, e, self.p.dim)[cols.clone()];
                    acc.iter_mut().zip(bd).for_each(|(a, v)| *a += wt * v);
                }
                continue;
            }
            // SAFETY: as above.
            let yi = unsafe { &d.read(at.y + i)[cols.clone()] };
            acc.iter_mut().zip(yi).for_each(|(a, v)| *a += wt * v);
        }
        if self.sh.is_some() {
            // SAFETY: as above.
            let ys = unsafe { &d.read(at.y + routes.len())[cols.clone()] };
            acc.iter_mut()
                .zip(ys)
                .for_each(|(a, v)| *a += self.scale * v);
        }
    }
}
