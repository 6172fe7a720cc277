//! The mixture-of-experts FFN on the CPU, as llama.cpp's `build_moe_ffn` computes it: the
//! router's logits, its gating (softmax or sigmoid), the top-k experts by probability, their
//! weights (renormalised and scaled where the family says), each routed expert's
//! `down(act(gate x)·up x)` times its weight, plus the shared expert (times
//! `sigmoid(gate_inp_shexp · x)` where it has that gate).
//!
//! Only routed experts are read. The experts stay in the file's merged 3-D tensors (memory
//! mapped, in their block format): expert `e` is one contiguous block of rows of each, viewed
//! here without a copy. One token runs every selected expert's gate and up (and the shared
//! expert's) in one parallel region and their down projections in a second; a batch groups its
//! tokens by expert and runs one matrix product per expert over its tokens.

use powerinfer_core::{ensure, MoeFeatures, Result, Weight};
use powerinfer_cpu::{
    axpy_rows_many, matvec_many, sparse_ffn_many, GateRows, SparseFfn, SparsePart,
};
use rayon::prelude::*;

use crate::ffn::{activate, project, project_many, Arith};
use crate::layer::FfnKind;
use crate::moe_pass::{experts_pass, ExpertsPass};
use crate::moe_weights::{route, shared_scale, ExpertBias, MoeWeights};
use crate::neuron_store::store::{Active, NeuronStore};
use crate::profiler::Profiler;
use crate::sparsity::{mask_unpredicted, predicted_active, LayerPredictor, PredictorScratch};

/// Scratch buffers of the MoE FFN.
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>,
    /// Router logits computed before the attention block (families whose router reads the
    /// layer input: [`MoeFeatures::router_on_residual`]).
    pub(crate) early: Vec<f32>,
    routes: Vec<Vec<(u32, f32)>>,
    pub(crate) bufs: Vec<Vec<f32>>,
    xe: Vec<f32>,
    ye: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    shared: Vec<f32>,
    /// Per routed expert in predictor mode: its predictor's scratch and the neurons it names.
    pred: Vec<PredictorScratch>,
    predicted: Vec<Vec<u32>>,
    /// Per routed expert in threshold mode: the neurons that pass and their coefficients.
    idx: Vec<Vec<u32>>,
    vals: Vec<Vec<f32>>,
    /// A neuron store's token: the routed experts' neurons (flattened ids) and coefficients.
    flat_ids: Vec<u32>,
    flat_vals: Vec<f32>,
    /// The batch's activations inside experts for the profiler's capture: per token its
    /// routed experts' rows, in route order (n × n_expert_used × expert_ffn).
    capture: Vec<f32>,
}

/// Everything one layer's MoE call needs.
pub struct MoeCall<'a> {
    pub m: &'a MoeFeatures,
    pub w: &'a MoeWeights,
    pub act: FfnKind,
    /// The FFN input after the norm (n × dim).
    pub xn: &'a [f32],
    pub n: usize,
    pub dim: usize,
    /// Every expert's transposed down projection: one token then reads only the up and down
    /// rows of the neurons that fire in each routed expert (exact-relu), or the down rows of
    /// those whose |act(gate)·up| passes the threshold; None: dense experts.
    pub down_t: Option<&'a [Weight]>,
    /// Threshold mode's threshold on |act(gate)·up| inside experts (None: every neuron).
    pub threshold: Option<f32>,
    /// Leading tokens computed densely whatever the mode (threshold mode's first position).
    pub dense_rows: usize,
    /// The layer (for the profiler and the neuron store).
    pub layer: usize,
    /// A neuron store holding the routed experts' rows (one token, dense or exact-relu):
    /// `store_decode` reads them from it.
    pub store: Option<&'a NeuronStore>,
    /// Exact-relu inside the experts (with a store: the gates come from the mapped rows).
    pub exact: bool,
    /// Predictor mode: this layer's predictor per expert (an expert without one, or beyond
    /// the slice, runs exact-relu). One token reads the gate, up and down_t rows of the
    /// neurons its routed experts' predictors name; a batch masks the same neurons.
    pub predictors: Option<&'a [Option<LayerPredictor>]>,
}

impl MoeCall<'_> {
    /// Expert `e`'s predictor in predictor mode, if it has one.
    fn predictor(&self, e: usize) -> Option<&LayerPredictor> {
        self.predictors?.get(e)?.as_ref()
    }

    /// Whether the experts are gpt-oss's: biased, or with the clamped SwiGLU, whose neurons do
    /// not fire by their gate alone (no exact-relu pass of gate rows first).
    fn biased(&self) -> bool {
        self.w.expert_bias.is_some() || self.act.swiglu_limit.is_some()
    }
}

/// The router's logits (n × n_expert) of the `n` rows of `x` into `out`.
pub fn router_logits(w: &MoeWeights, x: &[f32], n: usize, out: &mut Vec<f32>) -> Result<()> {
    project(&w.router, x, n, out, Arith::Batch)?;
    w.bias_logits(out);
    Ok(())
}

/// The MoE FFN output of `call.n` tokens (n × dim) into `out`; router logits come from
/// `s.early` when the family computes them before attention, else from `call.xn`. With a
/// profiler every token takes the grouped dense products, which count each routed expert and
/// its active neurons.
pub fn moe_ffn(
    call: &MoeCall<'_>,
    s: &mut MoeScratch,
    profiler: Option<&mut Profiler>,
    out: &mut Vec<f32>,
) -> Result<()> {
    let (n, dim, m, w) = (call.n, call.dim, call.m, call.w);
    out.clear();
    out.resize(n * dim, 0.0);
    let threshold = call.threshold.filter(|_| call.dense_rows == 0);
    // One token through dense experts (not a neuron store's): one parallel pass, routing
    // included.
    let from_store = call.store.is_some() && threshold.is_none();
    if n == 1 && profiler.is_none() && call.down_t.is_none() && !from_store {
        return decode_pass(call, s, out);
    }
    let logits: &[f32] = match m.router_on_residual {
        true => &s.early,
        false => {
            router_logits(w, call.xn, n, &mut s.logits)?;
            &s.logits
        }
    };
    ensure!(
        logits.len() == n * m.n_expert,
        Other,
        "router logits for {} values, want {n} tokens x {} experts",
        logits.len(),
        m.n_expert
    );
    s.routes.resize_with(n, Vec::new);
    for (t, r) in s.routes.iter_mut().enumerate() {
        let lg = &logits[t * m.n_expert..(t + 1) * m.n_expert];
        route(m, w.score_bias.as_deref(), lg, r);
    }
    if let (1, Some(store), None, None) = (n, call.store, threshold, &profiler) {
        store_decode(call, store, s, out)?;
        return shared(call, s, out);
    }
    match (n, call.down_t, threshold, profiler) {
        (1, Some(down_t), Some(t), None) => threshold_decode(call, down_t, t, s, out)?,
        (1, Some(_), None, None) if call.biased() => listed_decode(call, s, out)?,
        (1, Some(down_t), None, None) => sparse_decode(call, down_t, s, out)?,
        (_, _, _, profiler) => batch(call, s, profiler, out)?,
    }
    shared(call, s, out)
}

/// The token's routed experts and shared expert (dense experts, the CPU engine's decode):
/// `out` (dim, zero) += each routed expert's output times its weight, then the shared expert's
/// times its scale.
fn decode_pass(call: &MoeCall<'_>, s: &mut MoeScratch, out: &mut [f32]) -> Result<()> {
    let early = call.m.router_on_residual.then_some(&s.early[..]);
    let pass = ExpertsPass {
        m: call.m,
        w: call.w,
        act: call.act,
        xn: call.xn,
        dim: call.dim,
        early,
        routes: None,
        rows: None,
        shared: true,
    };
    experts_pass(&pass, &mut s.bufs, out)
}

/// `bufs` resized to `k` buffers of `len` (reusing their memory), as output slices.
fn slices(bufs: &mut [Vec<f32>], len: usize) -> Vec<&mut [f32]> {
    bufs.iter_mut()
        .map(|b| {
            b.resize(len, 0.0);
            b.as_mut_slice()
        })
        .collect()
}

/// Every routed expert's gate and up of one token in one parallel region: `bufs[2i]` and
/// `bufs[2i + 1]` (resized to expert_ffn) for the i-th route.
fn routed_gate_up(
    w: &MoeWeights,
    route: &[(u32, f32)],
    xn: &[f32],
    bufs: &mut [Vec<f32>],
) -> Result<()> {
    let ws: Vec<&Weight> = route
        .iter()
        .flat_map(|&(e, _)| [&w.gate[e as usize], &w.up[e as usize]])
        .collect();
    matvec_many(&ws, xn, &mut slices(&mut bufs[..ws.len()], w.gate[0].rows))
}

/// One token's routed experts from a neuron store, each neuron's activation times its expert's
/// weight: in exact-relu, every routed expert's gate from the mapped rows,
/// then the up and down_t rows of the neurons that fire from the store; else (dense experts)
/// the whole clusters of every routed expert's neurons, gate rows included.
fn store_decode(
    call: &MoeCall<'_>,
    store: &NeuronStore,
    s: &mut MoeScratch,
    out: &mut [f32],
) -> Result<()> {
    let (w, act) = (call.w, call.act);
    let route = &s.routes[0];
    let ef = w.gate[0].rows;
    let (ids, vals) = (&mut s.flat_ids, &mut s.flat_vals);
    ids.clear();
    vals.clear();
    if call.exact {
        let k = route.len();
        s.bufs.resize_with(k.max(s.bufs.len()), Vec::new);
        let gates: Vec<&Weight> = route.iter().map(|&(e, _)| &w.gate[e as usize]).collect();
        matvec_many(&gates, call.xn, &mut slices(&mut s.bufs[..k], ef))?;
        for (g, &(e, wt)) in s.bufs.iter().zip(route) {
            for (j, &g) in g.iter().enumerate() {
                let a = act.apply(g);
                if a != 0.0 {
                    ids.push((e as usize * ef + j) as u32);
                    vals.push(wt * a);
                }
            }
        }
        let active = Active::Firing(ids, vals);
        return store.ffn(call.layer, act, None, call.xn, active, None, out);
    }
    for &(e, wt) in route {
        ids.extend((0..ef).map(|j| (e as usize * ef + j) as u32));
        vals.resize(ids.len(), wt);
    }
    let active = Active::Scaled(ids, vals);
    store.ffn(call.layer, act, None, call.xn, active, None, out)
}

/// One token in exact-relu: each routed expert's gate rows, then the up and down_t rows of
/// its neurons that fire, every routed expert's tasks in one parallel pass
/// ([`sparse_ffn_many`]: each expert cut as it alone would be, one fork-join for all), summed
/// with their weights. In predictor mode an expert with a predictor reads the gate rows of the
/// neurons it predicts only (then their up and down_t rows where they fire); the predictors of
/// the routed experts run first, in one parallel region.
fn sparse_decode(
    call: &MoeCall<'_>,
    down_t: &[Weight],
    s: &mut MoeScratch,
    out: &mut [f32],
) -> Result<()> {
    let (w, act, dim) = (call.w, call.act, call.dim);
    let route = &s.routes[0];
    let k = route.len();
    s.pred.resize_with(k, PredictorScratch::default);
    s.predicted.resize_with(k, Vec::new);
    let predicted = route
        .iter()
        .any(|&(e, _)| call.predictor(e as usize).is_some());
    if predicted {
        s.pred[..k]
            .par_iter_mut()
            .zip(&mut s.predicted[..k])
            .zip(route)
            .try_for_each(
                |((scratch, ids), &(e, _))| match call.predictor(e as usize) {
                    Some(p) => predicted_active(p, call.xn, scratch, ids),
                    None => Ok(()),
                },
            )?;
    }
    let parts: Vec<SparsePart<'_>> = route
        .iter()
        .zip(&s.predicted)
        .map(|(&(e, _), ids)| {
            let e = e as usize;
            SparsePart {
                ffn: SparseFfn {
                    gate: &w.gate[e],
                    up: Some(&w.up[e]),
                    down_t: &down_t[e],
                },
                rows: match call.predictor(e) {
                    Some(_) => GateRows::Listed(ids),
                    None => GateRows::All,
                },
            }
        })
        .collect();
    s.bufs.resize_with(k.max(s.bufs.len()), Vec::new);
    let mut ys = slices(&mut s.bufs[..k], dim);
    let fire = |_: usize, _: u32, g: f32| act.apply(g);
    sparse_ffn_many(&parts, call.xn, fire, |a, u| act.times_up(a, u), &mut ys)?;
    for (y, &(_, wt)) in s.bufs.iter().zip(route) {
        out.iter_mut().zip(y).for_each(|(o, v)| *o += wt * v);
    }
    Ok(())
}

/// One token in threshold mode: every routed expert's gate and up in one parallel region, then
/// the transposed down rows of each expert's neurons with |act(gate)·up| >= `t`, all experts in
/// a second ([`axpy_rows_many`]), summed with their weights.
fn threshold_decode(
    call: &MoeCall<'_>,
    down_t: &[Weight],
    t: f32,
    s: &mut MoeScratch,
    out: &mut [f32],
) -> Result<()> {
    let (w, act) = (call.w, call.act);
    let route = &s.routes[0];
    let k = route.len();
    s.bufs.resize_with(3 * k, Vec::new);
    let (inner, ys) = s.bufs.split_at_mut(2 * k);
    routed_gate_up(w, route, call.xn, inner)?;
    s.idx.resize_with(k, Vec::new);
    s.vals.resize_with(k, Vec::new);
    let ef = w.gate[0].rows;
    let lists = inner.chunks_exact_mut(2).zip(&mut s.idx).zip(&mut s.vals);
    for (((pair, idx), vals), &(e, _)) in lists.zip(route) {
        let (g, u) = pair.split_at_mut(1);
        if let Some(b) = &w.expert_bias {
            add_each_row(&mut g[0], ExpertBias::of(&b.gate, e as usize, ef));
            add_each_row(&mut u[0], ExpertBias::of(&b.up, e as usize, ef));
        }
        activate(act, &mut g[0], &u[0]);
        idx.clear();
        vals.clear();
        for (j, &h) in g[0].iter().enumerate() {
            if h.abs() >= t {
                idx.push(j as u32);
                vals.push(h);
            }
        }
    }
    let parts: Vec<(&Weight, &[u32], &[f32])> = route
        .iter()
        .zip(s.idx.iter().zip(&s.vals))
        .map(|(&(e, _), (i, v))| (&down_t[e as usize], &i[..], &v[..]))
        .collect();
    let mut outs = slices(ys, call.dim);
    outs.iter_mut().for_each(|y| y.fill(0.0));
    axpy_rows_many(&parts, &mut outs)?;
    // A biased expert adds its down bias whatever passed (gpt-oss).
    for ((y, &(e, wt)), idx) in outs.iter_mut().zip(route).zip(&s.idx) {
        match &w.expert_bias {
            Some(b) => add_each_row(y, ExpertBias::of(&b.down, e as usize, call.dim)),
            None if idx.is_empty() => continue,
            None => {}
        }
        out.iter_mut().zip(y.iter()).for_each(|(o, v)| *o += wt * v);
    }
    Ok(())
}

/// One token through biased experts (gpt-oss) outside threshold mode: each routed expert's
/// gate and up rows of the neurons its predictor names (every neuron without a predictor, or
/// outside predictor mode), their biases, the clamped SwiGLU, then the expert's down product
/// over those activations (the others zero) and its down bias, every routed expert in one
/// parallel pass ([`experts_pass`] with the rows listed), summed with their weights.
fn listed_decode(call: &MoeCall<'_>, s: &mut MoeScratch, out: &mut [f32]) -> Result<()> {
    let (w, ef) = (call.w, call.w.gate[0].rows);
    let route = &s.routes[0];
    s.predicted.resize_with(call.m.n_expert, Vec::new);
    s.pred.resize_with(1, PredictorScratch::default);
    s.predicted.iter_mut().for_each(Vec::clear);
    for &(e, _) in route {
        let ids = &mut s.predicted[e as usize];
        match call.predictor(e as usize) {
            Some(p) => predicted_active(p, call.xn, &mut s.pred[0], ids)?,
            None => ids.extend(0..ef as u32),
        }
    }
    let pass = ExpertsPass {
        m: call.m,
        w,
        act: call.act,
        xn: call.xn,
        dim: call.dim,
        early: None,
        routes: Some(route),
        rows: Some(&s.predicted),
        shared: false,
    };
    experts_pass(&pass, &mut s.bufs, out)
}

/// A batch: the tokens grouped by expert, one product per expert over its tokens.
fn batch(
    call: &MoeCall<'_>,
    s: &mut MoeScratch,
    mut profiler: Option<&mut Profiler>,
    out: &mut [f32],
) -> Result<()> {
    let (w, act, dim) = (call.w, call.act, call.dim);
    let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); call.m.n_expert];
    for (t, r) in s.routes.iter().enumerate() {
        for &(e, wt) in r {
            by_expert[e as usize].push((t, wt));
        }
    }
    if profiler.as_ref().is_some_and(|p| p.capture) {
        s.capture.clear();
    }
    for (e, tokens) in by_expert.iter().enumerate() {
        if tokens.is_empty() {
            continue;
        }
        let m = tokens.len();
        s.xe.clear();
        for &(t, _) in tokens {
            s.xe.extend_from_slice(&call.xn[t * dim..(t + 1) * dim]);
        }
        project_many(
            [&w.gate[e], &w.up[e]],
            &s.xe,
            m,
            [&mut s.gate, &mut s.up],
            Arith::Batch,
        )?;
        let ef = w.gate[e].rows;
        if let Some(b) = &w.expert_bias {
            add_each_row(&mut s.gate, ExpertBias::of(&b.gate, e, ef));
            add_each_row(&mut s.up, ExpertBias::of(&b.up, e, ef));
        }
        activate(act, &mut s.gate, &s.up);
        // Threshold mode masks the activations of the tokens it sparsifies.
        if let Some(t) = call.threshold {
            for (row, &(tok, _)) in s.gate.chunks_exact_mut(ef).zip(tokens) {
                if tok >= call.dense_rows {
                    row.iter_mut()
                        .filter(|h| h.abs() < t)
                        .for_each(|h| *h = 0.0);
                }
            }
        }
        // Predictor mode keeps the neurons the expert's predictor names for each token.
        if let Some(p) = call.predictor(e) {
            let mut scratch = PredictorScratch::default();
            for (row, &(tok, _)) in s.gate.chunks_exact_mut(ef).zip(tokens) {
                let x = &call.xn[tok * dim..(tok + 1) * dim];
                mask_unpredicted(p, x, row, &mut scratch)?;
            }
        }
        if let Some(p) = profiler.as_deref_mut() {
            p.record_expert(call.layer, e, &s.gate, ef);
            if p.capture {
                // Each token's rows in the order of its routes (n_expert_used per token).
                let k = call.m.n_expert_used;
                s.capture.resize(call.n * k * ef, 0.0);
                for (row, &(tok, _)) in s.gate.chunks_exact(ef).zip(tokens) {
                    let j = s.routes[tok]
                        .iter()
                        .position(|r| r.0 as usize == e)
                        .unwrap_or(0);
                    let at = (tok * k + j) * ef;
                    s.capture[at..at + ef].copy_from_slice(row);
                }
            }
        }
        project(&w.down[e], &s.gate, m, &mut s.ye, Arith::Batch)?;
        if let Some(b) = &w.expert_bias {
            add_each_row(&mut s.ye, ExpertBias::of(&b.down, e, dim));
        }
        for (i, &(t, wt)) in tokens.iter().enumerate() {
            let y = &s.ye[i * dim..(i + 1) * dim];
            out[t * dim..(t + 1) * dim]
                .iter_mut()
                .zip(y)
                .for_each(|(o, v)| *o += wt * v);
        }
    }
    if let Some(p) = profiler.filter(|p| p.capture) {
        p.capture_rows(call.layer, call.xn, &s.capture);
        let routes: Vec<u32> = s.routes[..call.n]
            .iter()
            .flat_map(|r| r.iter().map(|&(e, _)| e))
            .collect();
        p.capture_routes(call.layer, &routes);
    }
    Ok(())
}

/// The shared expert of every token, added to `out` (scaled by its sigmoid gate).
fn shared(call: &MoeCall<'_>, s: &mut MoeScratch, out: &mut [f32]) -> Result<()> {
    let Some(sh) = &call.w.shared else {
        return Ok(());
    };
    let (n, dim) = (call.n, call.dim);
    project_many(
        [&sh.gate, &sh.up],
        call.xn,
        n,
        [&mut s.gate, &mut s.up],
        Arith::Batch,
    )?;
    activate(call.act, &mut s.gate, &s.up);
    project(&sh.down, &s.gate, n, &mut s.shared, Arith::Batch)?;
    for t in 0..n {
        let scale = shared_scale(sh, &call.xn[t * dim..(t + 1) * dim]);
        let y = &s.shared[t * dim..(t + 1) * dim];
        out[t * dim..(t + 1) * dim]
            .iter_mut()
            .zip(y)
            .for_each(|(o, v)| *o += scale * v);
    }
    Ok(())
}

/// `rows` (rows of `bias.len()`) += `bias`, row by row.
pub(crate) fn add_each_row(rows: &mut [f32], bias: &[f32]) {
    for r in rows.chunks_exact_mut(bias.len()) {
        r.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// The router's logits of `n` tokens before the attention block (families whose router reads
/// the layer input), into `s.early`.
pub fn early_logits(w: &MoeWeights, x: &[f32], n: usize, s: &mut MoeScratch) -> Result<()> {
    router_logits(w, x, n, &mut s.early)
}
