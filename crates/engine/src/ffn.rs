//! The FFN block in every sparsity mode.
//!
//! Decoding one token in a sparse mode reads only the active neurons' rows (gate fully for
//! exact-relu/threshold, nothing before the predictor in predictor mode). Batches (prefill,
//! scoring, profiling) run dense matrix-matrix products and apply the same mode as a mask, so
//! every mode computes the same function whether tokens come one by one or in a batch.

use powerinfer_core::{swiglu_oai, Result, Weight};
use powerinfer_cpu::{
    axpy_rows, compact_kept, matmul, matvec, matvec_matrices, matvec_matrices_tokens, matvec_rows,
    sparse_ffn, GateRows, MatrixRef, SparseFfn,
};
use rayon::prelude::*;

use crate::input_sparse::{InputScratch, Site};
use crate::layer::FfnKind;
use crate::layer_weights::LayerWeights;
use crate::neuron_store::store::{Active, NeuronStore};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::sparsity::{
    mask_unpredicted, predicted_active, PredictorInput, PredictorScratch, Sparsity,
};
use crate::weights::ModelWeights;

/// How a pass over several tokens multiplies: as prefill does (matrix products, each weight
/// row decoded once for all tokens) or with the one-token matvec's arithmetic for every token
/// (bit-identical to decode steps: speculative verification).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arith {
    /// Matrix products (prefill, scoring).
    #[default]
    Batch,
    /// Each token as a decode step computes it, over shared weight reads.
    Steps,
}

/// `y = W x` for n tokens: a matvec for one token, a batched matmul (or, with
/// [`Arith::Steps`], the per-token matvecs) for more. `w` in either layout (a [`Weight`] or a
/// [`powerinfer_cpu::Matrix`]).
pub fn project<'a>(
    w: impl Into<MatrixRef<'a>>,
    x: &[f32],
    n: usize,
    y: &mut Vec<f32>,
    a: Arith,
) -> Result<()> {
    let w = w.into();
    y.resize(n * w.rows(), 0.0);
    match (n, a) {
        (1, _) => matvec_matrices(&[w], x, &mut [y]),
        (_, Arith::Steps) => matvec_matrices_tokens(&[w], x, n, &mut [&mut y[..]]),
        (_, Arith::Batch) => matmul(w, x, n, y),
    }
}

/// `ys[i] = ws[i] x` for n tokens; one parallel region for all weights of a layout when
/// decoding.
pub fn project_many<'a, W: Into<MatrixRef<'a>>, const K: usize>(
    ws: [W; K],
    x: &[f32],
    n: usize,
    ys: [&mut Vec<f32>; K],
    a: Arith,
) -> Result<()> {
    let ws: [MatrixRef<'a>; K] = ws.map(Into::into);
    if n > 1 && a == Arith::Batch {
        for (w, y) in ws.into_iter().zip(ys) {
            project(w, x, n, y, a)?;
        }
        return Ok(());
    }
    let mut outs: Vec<&mut [f32]> = Vec::with_capacity(K);
    for (w, y) in ws.iter().zip(ys) {
        y.resize(n * w.rows(), 0.0);
        outs.push(y.as_mut_slice());
    }
    match n {
        1 => matvec_matrices(&ws, x, &mut outs),
        _ => matvec_matrices_tokens(&ws, x, n, &mut outs),
    }
}

/// Elementwise over chunks, in parallel only when there is enough work.
fn par_rows(a: &mut [f32], b: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    const CHUNK: usize = 16 * 1024;
    let apply = |a: &mut [f32], b: &[f32]| a.iter_mut().zip(b).for_each(|(a, b)| f(a, *b));
    if a.len() <= CHUNK {
        apply(a, b);
    } else {
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .for_each(|(a, b)| apply(a, b));
    }
}

/// Add layer `lw`'s bias of the activated projection (OPT's fc1 bias) to gate values: every
/// neuron of each row (`ids` None), or the neurons `ids` in that order.
pub(crate) fn add_gate_bias(lw: &LayerWeights, ids: Option<&[u32]>, gate: &mut [f32]) {
    let Some([b, _]) = &lw.ffn_bias else {
        return;
    };
    match ids {
        None => gate
            .chunks_exact_mut(b.len())
            .for_each(|r| r.iter_mut().zip(b).for_each(|(g, b)| *g += b)),
        Some(ids) => gate
            .iter_mut()
            .zip(ids)
            .for_each(|(g, &i)| *g += b[i as usize]),
    }
}

/// The gate (and, with one, the up) projection of `n` tokens into `gate` and `up`.
pub(crate) fn gate_and_up(
    act: FfnKind,
    lw: &LayerWeights,
    xn: &[f32],
    n: usize,
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    a: Arith,
) -> Result<()> {
    match act.gated {
        false => project(&lw.w_gate, xn, n, gate, a)?,
        true => project_many([&lw.w_gate, &lw.w_up], xn, n, [gate, up], a)?,
    }
    add_gate_bias(lw, None, gate);
    Ok(())
}

/// Scratch buffers of the FFN.
#[derive(Default)]
pub struct FfnScratch {
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    predictor: PredictorScratch,
    predicted: Vec<u32>,
    /// The next layer's neurons to read ahead from a neuron store.
    ahead: Vec<u32>,
    idx: Vec<u32>,
    vals: Vec<f32>,
    /// The input mode's masked FFN input (batched) and its decode scratch.
    pub(crate) xm: Vec<f32>,
    pub(crate) input: InputScratch,
}

/// Everything one layer's FFN call needs.
pub struct FfnCall<'a> {
    pub model: &'a ModelWeights,
    pub layer: usize,
    pub mode: &'a Sparsity,
    /// Residual stream before the FFN norm (n × dim): PowerInfer predictors read it.
    pub x_res: &'a [f32],
    /// FFN input after the norm (n × dim).
    pub xn: &'a [f32],
    pub n: usize,
    /// Position of the first token in the context.
    pub start: usize,
    /// How several tokens multiply (the dense FFN's products).
    pub arith: Arith,
}

/// The FFN output (n × dim) into `out` in every mode but the input mode's (see
/// [`ffn_in_mode`](crate::input_ffn::ffn_in_mode)); returns the phase the time since the last mark belongs
/// to ([`Phase::Ffn`] where one fused region ran the whole FFN, else [`Phase::Down`]).
pub fn ffn(
    call: &FfnCall<'_>,
    s: &mut FfnScratch,
    profiler: Option<&mut Profiler>,
    out: &mut Vec<f32>,
) -> Result<Phase> {
    let dim = call.model.config.dim;
    out.resize(call.n * dim, 0.0);
    let call = &FfnCall {
        mode: call.mode.for_dense_layer(call.layer),
        ..*call
    };
    powerinfer_core::ensure!(
        !matches!(call.mode, Sparsity::Input(_)),
        Other,
        "the input mode's FFN is input_ffn's"
    );
    let sparse = !matches!(call.mode, Sparsity::Dense) && call.mode.dense_rows(call.start, 1) == 0;
    if call.n == 1 && profiler.is_none() && sparse {
        return sparse_decode(call, s, out);
    }
    batched(call, s, profiler, out)?;
    Ok(Phase::Down)
}

/// The neurons among `ids` (gate values `gate`, in the same order) whose activation is not 0,
/// into `idx`, with their activations into `vals`.
fn keep_firing(
    act: FfnKind,
    ids: impl Iterator<Item = u32>,
    gate: &[f32],
    idx: &mut Vec<u32>,
    vals: &mut Vec<f32>,
) {
    idx.clear();
    vals.clear();
    for (i, &g) in ids.zip(gate) {
        let a = act.apply(g);
        if a != 0.0 {
            idx.push(i);
            vals.push(a);
        }
    }
}

/// One token's FFN over the gate rows `rows` in one parallel region (see
/// [`powerinfer_cpu::sparse_ffn`]): gate rows, then the up and down_t rows of the neurons that
/// fire. Its time is charged to [`Phase::Ffn`] (by the caller: see [`ffn`]).
/// Returns how many neurons fired.
fn fused(
    act: FfnKind,
    lw: &LayerWeights,
    down_t: &Weight,
    xn: &[f32],
    rows: GateRows<'_>,
    out: &mut [f32],
) -> Result<usize> {
    let ffn = SparseFfn {
        gate: lw.w_gate.indexed()?,
        up: act.gated.then(|| lw.w_up.indexed()).transpose()?,
        down_t,
    };
    let bias = lw.ffn_bias.as_ref().map(|[b, _]| b.as_slice());
    let fire = |i: u32, g: f32| act.apply(g + bias.map_or(0.0, |b| b[i as usize]));
    sparse_ffn(&ffn, xn, rows, fire, |a, u| act.times_up(a, u), out)
}

/// Bytes of `n` rows of `w`.
fn rows_bytes<'a>(w: impl Into<MatrixRef<'a>>, n: usize) -> u64 {
    let w = w.into();
    (w.dtype().row_bytes(w.cols()).unwrap_or(0) * n) as u64
}

/// Predictor mode's active neurons of one token into `s.predicted` (its time charged to
/// [`Phase::Predictor`]).
fn predict(
    call: &FfnCall<'_>,
    p: &crate::sparsity::LayerPredictor,
    input: PredictorInput,
    s: &mut FfnScratch,
) -> Result<()> {
    let x = match input {
        PredictorInput::FfnNorm => call.xn,
        PredictorInput::FfnInp => call.x_res,
    };
    predicted_active(p, x, &mut s.predictor, &mut s.predicted)?;
    mark(Phase::Predictor);
    Ok(())
}

/// One token's exact-relu or predictor FFN over a neuron store: exact-relu computes every gate
/// from the resident rows and reads the up and down_t rows of the neurons that fire, predictor
/// mode reads the gate, up and down_t rows of the predicted neurons. None for the other modes.
fn store_decode(
    call: &FfnCall<'_>,
    store: &NeuronStore,
    s: &mut FfnScratch,
    out: &mut [f32],
) -> Result<Option<Phase>> {
    let m = call.model;
    let lw: &LayerWeights = &m.layers[call.layer];
    let act = m.program.layers[call.layer].ffn_kind();
    let bias = lw.ffn_bias.as_ref().map(|[b, _]| b.as_slice());
    match call.mode {
        Sparsity::ExactRelu => {
            s.gate.resize(lw.w_gate.rows(), 0.0);
            matvec(&lw.w_gate, call.xn, &mut s.gate)?;
            add_gate_bias(lw, None, &mut s.gate);
            keep_firing(
                act,
                0..s.gate.len() as u32,
                &s.gate,
                &mut s.idx,
                &mut s.vals,
            );
            mark(Phase::Gate);
            let active = Active::Firing(&s.idx, &s.vals);
            store.ffn(call.layer, act, None, call.xn, active, None, out)?;
            Ok(Some(Phase::Down))
        }
        Sparsity::Predictor { layers, input, .. } => {
            predict(call, &layers[call.layer], *input, s)?;
            // The next layer's predictor on this layer's input names the clusters to read
            // ahead: the residual stream changes little from one layer to the next.
            let next = match layers.get(call.layer + 1) {
                Some(p) if store.read_ahead() => {
                    let x = match input {
                        PredictorInput::FfnNorm => call.xn,
                        PredictorInput::FfnInp => call.x_res,
                    };
                    predicted_active(p, x, &mut s.predictor, &mut s.ahead)?;
                    Some(s.ahead.as_slice())
                }
                _ => None,
            };
            let active = Active::Listed(&s.predicted);
            store.ffn(call.layer, act, bias, call.xn, active, next, out)?;
            Ok(Some(Phase::Ffn))
        }
        _ => Ok(None),
    }
}

/// One token, reading only active rows; returns the phase its tail belongs to (see [`ffn`]).
fn sparse_decode(call: &FfnCall<'_>, s: &mut FfnScratch, out: &mut [f32]) -> Result<Phase> {
    let m = call.model;
    if let Some(store) = m.neuron_store() {
        if let Some(phase) = store_decode(call, &store, s, out)? {
            return Ok(phase);
        }
    }
    let lw: &LayerWeights = &m.layers[call.layer];
    let act = m.program.layers[call.layer].ffn_kind();
    let down_t = &m.down_t()?[call.layer];
    match call.mode {
        Sparsity::ExactRelu => {
            fused(act, lw, down_t, call.xn, GateRows::All, out)?;
            Ok(Phase::Ffn)
        }
        Sparsity::Threshold(t) => {
            let t = t[call.layer];
            gate_and_up(act, lw, call.xn, 1, &mut s.gate, &mut s.up, Arith::Batch)?;
            mark(Phase::Gate); // gate and up in one pass
                               // h = act(gate)·up in place, as the batched path computes it (whole-vector passes
                               // the compiler vectorises, apart from the activation's exp).
            apply_activation(act, &mut s.gate);
            match (act.gated, act.up_act) {
                (false, _) => {}
                (true, false) => s.gate.iter_mut().zip(&s.up).for_each(|(h, u)| *h *= u),
                (true, true) => s
                    .gate
                    .iter_mut()
                    .zip(&s.up)
                    .for_each(|(h, &u)| *h = act.times_up(*h, u)),
            }
            let ffn = s.gate.len();
            let n = s.gate.iter().filter(|h| h.abs() >= t).count();
            if n as f32 > m.down_crossover_at(call.layer)? * ffn as f32 {
                // So many neurons pass that the dense product over the masked values is
                // cheaper than an axpy over their down_t rows (the same function).
                zero_below(&mut s.gate, t);
                matvec(&lw.w_down, &s.gate, out)?;
                return Ok(Phase::Down);
            }
            compact_kept(&s.gate, t, &mut s.idx, &mut s.vals);
            out.fill(0.0);
            axpy_rows(down_t, &s.idx, &s.vals, out)?;
            Ok(Phase::Down)
        }
        Sparsity::Predictor { layers, input, .. } => {
            predict(call, &layers[call.layer], *input, s)?;
            fused(
                act,
                lw,
                down_t,
                call.xn,
                GateRows::Listed(&s.predicted),
                out,
            )?;
            Ok(Phase::Ffn)
        }
        Sparsity::Dense | Sparsity::Input(_) => {
            unreachable!("dense decoding takes the batched path, input mode its own")
        }
    }
}

/// Dense products with the mode applied as a mask on the activated gate values.
fn batched(
    call: &FfnCall<'_>,
    s: &mut FfnScratch,
    profiler: Option<&mut Profiler>,
    out: &mut Vec<f32>,
) -> Result<()> {
    let m = call.model;
    let lw = &m.layers[call.layer];
    let (n, ffn) = (call.n, m.config.ffn_dim);
    let act = m.program.layers[call.layer].ffn_kind();
    gate_and_up(act, lw, call.xn, n, &mut s.gate, &mut s.up, call.arith)?;
    mark(Phase::Gate); // gate and up in one pass
    match call.arith {
        Arith::Batch => activate(act, &mut s.gate, &s.up),
        // Row by row, as one token's pass splits the work.
        Arith::Steps => {
            for (t, g) in s.gate.chunks_exact_mut(ffn).enumerate() {
                let u = match act.gated {
                    true => &s.up[t * ffn..(t + 1) * ffn],
                    false => &[][..],
                };
                activate(act, g, u);
            }
        }
    }
    // s.gate now holds h = act(gate)·up; the mode zeroes the neurons it skips.
    match call.mode {
        Sparsity::Dense | Sparsity::ExactRelu | Sparsity::Input(_) => {}
        Sparsity::Threshold(t) => {
            let t = t[call.layer];
            let keep = call.mode.dense_rows(call.start, n) * ffn;
            zero_below(&mut s.gate[keep..], t);
        }
        Sparsity::Predictor { layers, input, .. } => {
            let dim = m.config.dim;
            let source = match input {
                PredictorInput::FfnNorm => call.xn,
                PredictorInput::FfnInp => call.x_res,
            };
            for (t, row) in s.gate.chunks_exact_mut(ffn).enumerate() {
                let x = &source[t * dim..(t + 1) * dim];
                mask_unpredicted(&layers[call.layer], x, row, &mut s.predictor)?;
            }
            mark(Phase::Predictor);
        }
    }
    if let Some(p) = profiler {
        let dense = call.mode.dense_rows(call.start, n);
        p.record(call.layer, call.xn, &s.gate, ffn, dense);
        p.record_site(call.layer, Site::FfnIn, call.xn);
        p.record_site(call.layer, Site::DownIn, &s.gate);
    }
    project(&lw.w_down, &s.gate, n, out, call.arith)
}

/// h = act(gate)·up in place in `gate` (the gated families' product, or act(gate) alone;
/// gpt-oss's clamped SwiGLU where the kind has its limit).
pub(crate) fn activate(act: FfnKind, gate: &mut [f32], up: &[f32]) {
    if let Some(limit) = act.swiglu_limit {
        return par_rows(gate, up, |g, u| *g = swiglu_oai(*g, u, limit));
    }
    apply_activation(act, gate);
    match (act.gated, act.up_act) {
        (false, _) => {}
        (true, false) => par_rows(gate, up, |a, u| *a *= u),
        (true, true) => par_rows(gate, up, |a, u| *a = act.times_up(*a, u)),
    }
}

/// Threshold mode's mask: zero every value with |h| < t.
fn zero_below(h: &mut [f32], t: f32) {
    h.iter_mut()
        .for_each(|v| *v = if v.abs() < t { 0.0 } else { *v });
}

/// `a = act(a)` in place.
fn apply_activation(act: FfnKind, a: &mut [f32]) {
    const CHUNK: usize = 16 * 1024;
    if a.len() <= CHUNK {
        a.iter_mut().for_each(|v| *v = act.apply(*v));
    } else {
        a.par_chunks_mut(CHUNK)
            .for_each(|c| c.iter_mut().for_each(|v| *v = act.apply(*v)));
    }
}

/// When the CPU side's down product is the dense one (see [`rows_ffn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DenseDown {
    Never,
    Always,
    AboveCrossover,
}

/// The FFN sum over the neurons `ids` alone for one token (the hybrid executor's CPU side: its
/// cold neurons, or the cold ones the predictor marked): gate rows of `ids`, then, in ReLU
/// semantics (`threshold` None) the up rows of those whose activation is not 0, or, in
/// threshold semantics, those with |act(gate)·up| >= t; then their down product, as the CPU
/// decode of the same mode takes it (`dense_down`): always over the transposed rows
/// (exact-relu, predictor), always the dense product over the masked values (dense mode,
/// which reads the original `ffn_down`), or the dense one above the model's crossover share
/// (threshold mode). `out` (dim) is overwritten. Returns the bytes of weight rows it read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_ffn(
    model: &ModelWeights,
    layer: usize,
    threshold: Option<f32>,
    dense_down: DenseDown,
    xn: &[f32],
    ids: &[u32],
    s: &mut FfnScratch,
    out: &mut [f32],
) -> Result<u64> {
    let lw = &model.layers[layer];
    let act = model.program.layers[layer].ffn_kind();
    let up = |n: usize| match act.gated {
        true => rows_bytes(&lw.w_up, n),
        false => 0,
    };
    if threshold.is_none() && dense_down == DenseDown::Never {
        let down_t = &model.down_t()?[layer];
        let fired = fused(act, lw, down_t, xn, GateRows::Listed(ids), out)?;
        return Ok(rows_bytes(&lw.w_gate, ids.len()) + up(fired) + rows_bytes(down_t, fired));
    }

    s.gate.resize(ids.len(), 0.0);
    matvec_rows(lw.w_gate.indexed()?, xn, ids, &mut s.gate)?;
    add_gate_bias(lw, Some(ids), &mut s.gate);
    match threshold {
        None => {
            keep_firing(act, ids.iter().copied(), &s.gate, &mut s.idx, &mut s.vals);
            if act.gated {
                s.up.resize(s.idx.len(), 0.0);
                matvec_rows(lw.w_up.indexed()?, xn, &s.idx, &mut s.up)?;
                s.vals
                    .iter_mut()
                    .zip(&s.up)
                    .for_each(|(a, &u)| *a = act.times_up(*a, u));
            }
        }
        Some(t) => {
            s.up.clear();
            match act.gated {
                false => s.up.resize(ids.len(), 1.0),
                true => {
                    s.up.resize(ids.len(), 0.0);
                    matvec_rows(lw.w_up.indexed()?, xn, ids, &mut s.up)?;
                }
            }
            s.idx.clear();
            s.vals.clear();
            for ((&i, &g), &u) in ids.iter().zip(&s.gate).zip(&s.up) {
                let h = act.times_up(act.apply(g), u);
                if h.abs() >= t {
                    s.idx.push(i);
                    s.vals.push(h);
                }
            }
        }
    }
    // ReLU semantics read the up rows of the neurons that fire, threshold semantics all of them.
    let up_rows = if threshold.is_none() {
        s.idx.len()
    } else {
        ids.len()
    };
    let gate_up = rows_bytes(&lw.w_gate, ids.len()) + up(up_rows);
    let ffn = lw.w_gate.rows();
    let dense = match dense_down {
        DenseDown::Never => false,
        DenseDown::Always => true,
        DenseDown::AboveCrossover => {
            s.idx.len() as f32 > model.down_crossover_at(layer)? * ffn as f32
        }
    };
    if dense {
        s.gate.clear();
        s.gate.resize(ffn, 0.0);
        for (&i, &v) in s.idx.iter().zip(&s.vals) {
            s.gate[i as usize] = v;
        }
        matvec(&lw.w_down, &s.gate, out)?;
        return Ok(gate_up + lw.w_down.n_bytes() as u64);
    }
    out.fill(0.0);
    let down_t = &model.down_t()?[layer];
    axpy_rows(down_t, &s.idx, &s.vals, out)?;
    Ok(gate_up + rows_bytes(down_t, s.idx.len()))
}
