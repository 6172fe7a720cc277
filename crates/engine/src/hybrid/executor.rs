//! The hybrid decode step over one backend: per layer it walks the layer program (see
//! [`crate::layer`]), the attention block where the plan put it, then the FFN block split
//! between the GPU's hot neurons and the CPU's cold ones, computed at the same time (the GPU
//! work is queued first, then the CPU part runs, then its partial sum crosses once and is added
//! on the GPU). A block on the CPU runs the CPU forward pass's own code for it. The residual
//! stream (and a parallel block's saved input) moves between host and device only when the
//! next step runs on the other side.

use std::sync::Arc;

use powerinfer_core::{ensure, LayerTable, Result, Side};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{down_splits, Act, Allocation, AttnParams, Backend, FfnAct, KvElem, XIn};

use crate::ffn::{rows_ffn, DenseDown, FfnScratch};
use crate::forward::{
    attention_block, embed, ffn_block, norm_bias, norm_rows_with, output_block, Angles, Kv, Rows,
    Scratch,
};
use crate::hybrid::api::{refuse_cpu_only, Hybrid};
use crate::hybrid::experts::{cold_by_expert, cold_experts, token_weights};
use crate::hybrid::gpu_model::{GpuFfn, GpuLayer, GpuModel, GpuPredictor, GpuScratch, KvBufs};
use crate::hybrid::kv_sync::KvSync;
use crate::hybrid::phase_clock::{HybridPhase, PhaseClock, PhaseStats};
use crate::hybrid::transfers::{Link, TransferStats};
use crate::kv_cache::KvCache;
use crate::layer::{AttnStep, FfnKind, FfnStep, NormKind};
use crate::moe::{early_logits, router_logits};
use crate::moe_weights::{route, MoeWeights};
use crate::placement::Placement;
use crate::sparsity::{
    predicted_active, LayerPredictor, PredictorInput, PredictorScratch, Sparsity,
};
use crate::weights::ModelWeights;

/// Where a vector's current value is (the residual stream, or a parallel block's saved input).
#[derive(Clone, Copy, Debug, Default)]
struct Residency {
    on_host: bool,
    on_device: bool,
}

/// The GPU kernels' form of an FFN step's activation.
fn gpu_act(k: FfnKind) -> FfnAct {
    FfnAct {
        act: Act::from(k.act),
        relu_threshold: k.relu_threshold,
        up_act: k.up_act,
    }
}

/// `sc.xb = norm(x)` on the device: RMSNorm, or LayerNorm with its bias. With `quantize` (a
/// quantized matvec reads `xb` next), `sc.xq` gets `xb` quantized in the same launch.
#[allow(clippy::too_many_arguments)]
fn norm_into_xb<B: Backend>(
    dev: &B,
    kind: NormKind,
    x: &B::Buf<f32>,
    w: &B::Buf<f32>,
    b: Option<&B::Buf<f32>>,
    eps: f32,
    quantize: bool,
    xb: &mut B::Buf<f32>,
    xq: &mut B::Buf<u8>,
    xq_of_xb: &mut bool,
) -> Result<()> {
    // Cleared first: a failed launch leaves no claim on xq.
    *xq_of_xb = false;
    let bias = match (kind, b) {
        (NormKind::Rms, _) => None,
        (NormKind::Layer, Some(b)) => Some(b),
        (NormKind::Layer, None) => {
            powerinfer_core::bail!(Other, "a LayerNorm step without its bias on the GPU")
        }
    };
    dev.norm(x, w, bias, 1, eps, xb, quantize.then_some(xq))?;
    *xq_of_xb = quantize;
    Ok(())
}

/// `x` (not `sc.xb`: see [`xb_input`]) as the row operations read it: with its quantized copy,
/// made now in `xq`, when `quantized` (some weight reading it is in a quantized format).
fn row_input<'a, B: Backend>(
    dev: &B,
    quantized: bool,
    x: &'a B::Buf<f32>,
    xq: &'a mut B::Buf<u8>,
    xq_of_xb: &mut bool,
) -> Result<XIn<'a, B>> {
    if !quantized {
        return Ok(XIn::floats(x));
    }
    *xq_of_xb = false;
    dev.quantize_x(x, xq)?;
    Ok(XIn::quantized(x, xq))
}

/// `sc.xb` as the row operations read it: with its quantized copy when `quantized`, the one
/// its norm wrote when there is one (no launch), else made now.
fn xb_input<'a, B: Backend>(
    dev: &B,
    quantized: bool,
    xb: &'a B::Buf<f32>,
    xq: &'a mut B::Buf<u8>,
    xq_of_xb: &mut bool,
) -> Result<XIn<'a, B>> {
    if !quantized {
        return Ok(XIn::floats(xb));
    }
    if !*xq_of_xb {
        dev.quantize_x(xb, xq)?;
        *xq_of_xb = true;
    }
    Ok(XIn::quantized(xb, xq))
}

/// Store the position's keys and values in a layer's caches (of element `T`) and attend over
/// them: `sc.att` from `sc.q`.
fn attend<B: Backend, T: KvElem>(
    dev: &B,
    sc: &mut GpuScratch<B>,
    cache_k: &mut B::Buf<T>,
    cache_v: &mut B::Buf<T>,
    pos: usize,
    p: &AttnParams,
) -> Result<()> {
    dev.kv_store(&sc.k, &sc.v, pos, cache_k, cache_v)?;
    dev.attention(
        &sc.q,
        cache_k,
        cache_v,
        pos + 1,
        p,
        &mut sc.attp,
        &mut sc.att,
    )
}

/// The CPU side's buffers of a hybrid FFN block (kept across tokens).
#[derive(Default)]
struct CpuFfnScratch {
    /// The cold rows' scratch ([`rows_ffn`]).
    rows: FfnScratch,
    /// The CPU predictor's scratch, and the neurons it names.
    predictor: PredictorScratch,
    predicted: Vec<u32>,
    /// Predictor mode: the token's active cold neurons, and a flag per neuron (1: active).
    cold_active: Vec<u32>,
    flags: Vec<i32>,
    /// The block's normed input on the host.
    xn: Vec<f32>,
    /// The cold neurons' output (dim), one upload.
    part: Vec<f32>,
    /// Each routed expert's cold output before its weight.
    cold_bufs: Vec<Vec<f32>>,
    /// Mixture of experts: the token's router logits, routes and expert weights.
    moe_logits: Vec<f32>,
    routes: Vec<(u32, f32)>,
    expert_w: Vec<f32>,
}

/// One layer's hybrid FFN block for one token: what was decided before its steps run (the
/// plan's split, the mode's choices), and the two sides' buffers the steps work in. The GPU's
/// part of each step is queued first; the CPU's part runs while it computes, and its sum
/// crosses once and is added on the GPU.
struct FfnPass<'a, B: Backend> {
    model: &'a ModelWeights,
    mode: &'a Sparsity,
    l: usize,
    /// The plan's split of the layer's neurons.
    table: &'a LayerTable,
    /// The layer's hot neurons (with its norms and biases) on the GPU, and its GPU predictor.
    f: &'a GpuFfn<B>,
    gpu_pred: Option<&'a GpuPredictor<B>>,
    /// Whether the token's rows are dense whatever the mode (threshold mode's first position).
    dense: bool,
    /// Predictor mode: the layer's predictor and what it reads.
    predictor: Option<(&'a LayerPredictor, PredictorInput)>,
    /// Whether the predictor runs on the GPU (its weights are there and filled).
    gpu_predictor: bool,
    /// Whether the block reads a parallel block's saved input instead of the residual.
    saved: bool,
    /// Whether the CPU takes part (cold neurons, a CPU predictor, a router).
    host_needed: bool,
    /// Whether the block's output goes straight into the residual (no post-norm between).
    direct: bool,
    /// Whether the hot FFN runs over lists gathered on the GPU.
    gather: bool,
    /// Threshold mode's threshold for this layer and token.
    threshold: Option<f32>,
    dev: &'a B,
    link: Link<'a, B>,
    sc: &'a mut GpuScratch<B>,
    /// The CPU side's residual and saved input (current where `host_needed`).
    host: &'a Scratch,
    cpu: &'a mut CpuFfnScratch,
    /// Mixture of experts: each expert's cold neurons in this layer.
    moe_cold: &'a [Vec<u32>],
}

impl<B: Backend> FfnPass<'_, B> {
    /// Whether the norm quantizes xb in its launch: when a quantized matvec reads xb, the hot
    /// gate/up rows or the GPU predictor's fc1 over the FFN norm's output; not when a
    /// quantized fc1 reads the FFN's input instead (its quantize_x would overwrite xq before
    /// gate/up reads it).
    fn xb_quantized(&self) -> bool {
        let fc1_reads_xb = match (self.predictor, self.gpu_pred) {
            (Some((_, PredictorInput::FfnNorm)), Some(gp)) => {
                self.gpu_predictor && gp.fc1.dtype.is_quantized()
            }
            _ => false,
        };
        let fc1_reads_input = match (self.predictor, self.gpu_pred) {
            (Some((_, PredictorInput::FfnInp)), Some(gp)) => {
                self.gpu_predictor && gp.fc1.dtype.is_quantized()
            }
            _ => false,
        };
        (self.f.hot.layout.gate_dtype.is_quantized() && !fc1_reads_input) || fc1_reads_xb
    }

    /// The output the block's products add into: the residual, or (before a post-norm) xb2.
    fn out(&mut self) -> &mut B::Buf<f32> {
        match self.direct {
            true => &mut self.sc.x,
            false => &mut self.sc.xb2,
        }
    }

    /// One step of the block's program.
    fn step(&mut self, step: &FfnStep, xb_quant: bool) -> Result<()> {
        let (l, f) = (self.l, self.f);
        match step {
            FfnStep::Norm(kind, _) => self.norm(*kind, xb_quant)?,
            FfnStep::Moe(kind) => self.experts(*kind)?,
            FfnStep::Ffn(kind) => {
                if self.predictor.is_some() {
                    self.predict()?;
                }
                self.hot_ffn(*kind)?;
                self.cold_ffn()?;
            }
            FfnStep::DownBias => {
                let Some(b) = &f.down_bias else {
                    powerinfer_core::bail!(Other, "layer {l}: no GPU down bias");
                };
                let dev = self.dev;
                dev.add(self.out(), b)?;
            }
            FfnStep::PostNorm => {
                let Some(post) = &f.post_norm else {
                    powerinfer_core::bail!(Other, "layer {l}: no GPU post-FFN norm");
                };
                let sc = &mut *self.sc;
                sc.xq_of_xb = false;
                let eps = self.model.config.rms_eps;
                self.dev.rms_norm(&sc.xb2, post, 1, eps, &mut sc.xb)?;
                std::mem::swap(&mut sc.xb, &mut sc.xb2);
            }
            FfnStep::Residual => {
                if !self.direct {
                    self.dev.add(&mut self.sc.x, &self.sc.xb2)?;
                }
            }
        }
        Ok(())
    }

    /// The FFN norm: on the GPU into xb (quantized in the same launch with `xb_quant`), and
    /// where the CPU takes part on the host into its xn, after the GPU's queued work starts.
    fn norm(&mut self, kind: NormKind, xb_quant: bool) -> Result<()> {
        let (model, l, f) = (self.model, self.l, self.f);
        let c = &model.config;
        let sc = &mut *self.sc;
        let input = match (self.saved, sc.saved.as_ref()) {
            (true, Some(s)) => s,
            _ => &sc.x,
        };
        norm_into_xb(
            self.dev,
            kind,
            input,
            &f.norm,
            f.norm_bias.as_ref(),
            c.rms_eps,
            xb_quant,
            &mut sc.xb,
            &mut sc.xq,
            &mut sc.xq_of_xb,
        )?;
        if self.host_needed {
            // The GPU's queued work (with graphs on, a batch) starts now, while the CPU
            // normalises, predicts, routes and computes its cold neurons.
            self.dev.flush()?;
            self.link.enter(l, HybridPhase::CpuNorm);
            let x_in = match self.saved {
                true => &self.host.par_in,
                false => &self.host.x,
            };
            let lw = &model.layers[l];
            let b = norm_bias(lw, kind, 1)?;
            norm_rows_with(x_in, &lw.ffn_norm, b, c.rms_eps, &mut self.cpu.xn);
            self.link.enter(l, HybridPhase::GpuSubmit);
        }
        Ok(())
    }

    /// A mixture of experts' FFN: routed on the CPU, the routed experts' hot neurons (and the
    /// shared expert) on the GPU, their cold neurons on the CPU.
    fn experts(&mut self, kind: FfnKind) -> Result<()> {
        let (model, l) = (self.model, self.l);
        let (Some(m), true) = (&model.layers[l].moe, self.sc.expert_w.is_some()) else {
            powerinfer_core::bail!(Other, "layer {l}: an MoE step without experts");
        };
        self.route(m)?;
        self.hot_experts(kind)?;
        self.cold_experts(m, kind)
    }

    /// Route the token on the CPU: its experts and one weight per expert (`cpu.expert_w`).
    fn route(&mut self, m: &MoeWeights) -> Result<()> {
        let (model, l) = (self.model, self.l);
        let mf = &model.config.moe;
        let cpu = &mut *self.cpu;
        self.link.enter(l, HybridPhase::CpuRoute);
        let logits: &[f32] = match mf.router_on_residual {
            true => &self.host.moe.early,
            false => {
                router_logits(m, &cpu.xn, 1, &mut cpu.moe_logits)?;
                &cpu.moe_logits
            }
        };
        ensure!(
            logits.len() == mf.n_expert,
            Other,
            "layer {l}: {} router logits for {} experts",
            logits.len(),
            mf.n_expert
        );
        route(mf, logits, &mut cpu.routes);
        token_weights(mf, m, &cpu.routes, &cpu.xn, &mut cpu.expert_w);
        self.link.enter(l, HybridPhase::GpuSubmit);
        Ok(())
    }

    /// Queue the routed experts' hot neurons (and the shared expert) on the GPU, the experts'
    /// weights uploaded first; the down pass adds into the block's output.
    fn hot_experts(&mut self, kind: FfnKind) -> Result<()> {
        let (model, l, dev, f) = (self.model, self.l, self.dev, self.f);
        let (c, hot) = (&model.config, &f.hot);
        let mf = &c.moe;
        let sc = &mut *self.sc;
        let Some(ew) = sc.expert_w.as_mut() else {
            powerinfer_core::bail!(Other, "layer {l}: an MoE step without experts");
        };
        self.link.up(l, &self.cpu.expert_w, ew, 0)?;
        let (ef, routed) = (mf.expert_ffn(c.ffn_dim), c.n_routed_neurons());
        dev.expert_flags(ew, ef, routed, &mut sc.active)?;
        let act = gpu_act(kind);
        let quant = hot.layout.gate_dtype.is_quantized();
        let x = xb_input(dev, quant, &sc.xb, &mut sc.xq, &mut sc.xq_of_xb)?;
        dev.hot_gate_up(hot, x, Some(&sc.active), act, None, &mut sc.hb)?;
        if let Some(t) = self.threshold {
            // The routed experts' slots: the shared expert (all of it hot, the largest ids)
            // runs dense, as on the CPU, in the last slots.
            let n = hot.layout.n_hot.saturating_sub(mf.shared_ffn_dim);
            dev.threshold_mask(&mut sc.hb, n, t)?;
        }
        dev.expert_scale(hot, ew, ef, routed, &mut sc.hb)?;
        // The down pass over the nonzero activations only, gathered on the GPU.
        if self.gather {
            dev.nonzero_rows(hot, &sc.hb, None, &mut sc.rows)?;
        }
        self.hot_down()
    }

    /// The hot neurons' down pass into the block's output (the residual directly, or the
    /// cleared FFN buffer): over the rows gathered in `sc.rows`, or over every hot slot's `sc.hb`.
    fn hot_down(&mut self) -> Result<()> {
        let (dev, hot) = (self.dev, &self.f.hot);
        let sc = &mut *self.sc;
        let out = match self.direct {
            true => &mut sc.x,
            false => {
                dev.fill(&mut sc.xb2, 0.0)?;
                &mut sc.xb2
            }
        };
        let splits = down_splits(hot.layout.n_hot);
        match self.gather {
            true => dev.hot_down_listed(hot, &sc.rows, &mut sc.part, out, splits),
            false => dev.hot_down(hot, &sc.hb, &mut sc.part, out, splits),
        }
    }

    /// The routed experts' cold neurons on the CPU while the GPU computes, one upload of their
    /// sum added into the block's output.
    fn cold_experts(&mut self, m: &MoeWeights, kind: FfnKind) -> Result<()> {
        let (model, l) = (self.model, self.l);
        let cpu = &mut *self.cpu;
        cpu.part.resize(model.config.dim, 0.0);
        let down_t = &model.expert_down_t()?[l];
        self.dev.flush()?;
        self.link.enter(l, HybridPhase::ColdFfn);
        let dense_mode = matches!(self.mode, Sparsity::Dense);
        let read = cold_experts(
            &model.config.moe,
            m,
            down_t,
            kind,
            self.threshold,
            dense_mode,
            &cpu.xn,
            &cpu.routes,
            self.moe_cold,
            &mut cpu.cold_bufs,
            &mut cpu.part,
        )?;
        self.link.enter(l, HybridPhase::GpuSubmit);
        if let Some(read) = read {
            self.link.cold_read(l, read);
            self.link.up(l, &self.cpu.part, &mut self.sc.xfer, 0)?;
            let dev = self.dev;
            let sc = &mut *self.sc;
            let out = if self.direct { &mut sc.x } else { &mut sc.xb2 };
            dev.add(out, &sc.xfer)?;
        }
        Ok(())
    }

    /// Predictor mode's active set: which hot slots the GPU computes (`sc.active`, a flag per
    /// neuron) and which cold neurons the CPU does (`cpu.cold_active`), by the GPU's predictor
    /// or the CPU's.
    fn predict(&mut self) -> Result<()> {
        let Some((p, input)) = self.predictor else {
            return Ok(());
        };
        let (model, l, dev, table) = (self.model, self.l, self.dev, self.table);
        let c = &model.config;
        let (sc, cpu) = (&mut *self.sc, &mut *self.cpu);
        if let (true, Some(gp)) = (self.gpu_predictor, self.gpu_pred) {
            let quant = gp.fc1.dtype.is_quantized();
            let of_xb = &mut sc.xq_of_xb;
            let x = match (input, self.saved, sc.saved.as_ref()) {
                (PredictorInput::FfnNorm, ..) => xb_input(dev, quant, &sc.xb, &mut sc.xq, of_xb)?,
                (PredictorInput::FfnInp, true, Some(s)) => {
                    row_input(dev, quant, s, &mut sc.xq, of_xb)?
                }
                (PredictorInput::FfnInp, ..) => row_input(dev, quant, &sc.x, &mut sc.xq, of_xb)?,
            };
            dev.predictor(
                &gp.fc1,
                &gp.fc2_t,
                gp.threshold,
                x,
                &mut sc.pred,
                &mut sc.active,
                None,
            )?;
            // Cleared whether or not the layer has cold neurons: a layer all hot computes none
            // (not those the previous layer left).
            cpu.cold_active.clear();
            if !table.cold.is_empty() {
                cpu.flags.resize(c.ffn_dim, 0);
                self.link.down(l, &sc.active, 0, &mut cpu.flags)?;
                self.link.enter(l, HybridPhase::CpuPredictor);
                let on = &cpu.flags;
                cpu.cold_active
                    .extend(table.cold.iter().filter(|&&i| on[i as usize] != 0));
            }
        } else {
            self.link.enter(l, HybridPhase::CpuPredictor);
            let x = match (input, self.saved) {
                (PredictorInput::FfnNorm, _) => &cpu.xn,
                (PredictorInput::FfnInp, true) => &self.host.par_in,
                (PredictorInput::FfnInp, false) => &self.host.x,
            };
            predicted_active(p, x, &mut cpu.predictor, &mut cpu.predicted)?;
            self.link.predictor_read(l, cpu.predictor.bytes_read(p));
            cpu.flags.clear();
            cpu.flags.resize(c.ffn_dim, 0);
            cpu.cold_active.clear();
            for &i in &cpu.predicted {
                cpu.flags[i as usize] = 1;
                if table.place[i as usize].0 == Side::Cpu {
                    cpu.cold_active.push(i);
                }
            }
            self.link.up(l, &cpu.flags, &mut sc.active, 0)?;
        }
        self.link.enter(l, HybridPhase::GpuSubmit);
        Ok(())
    }

    /// Queue the hot neurons on the GPU; it runs them while the CPU computes its part. With
    /// flags (predictor mode) gate/up runs over the active slots only, gathered on the GPU;
    /// the down pass over the nonzero activations only.
    fn hot_ffn(&mut self, kind: FfnKind) -> Result<()> {
        let (dev, f) = (self.dev, self.f);
        let hot = &f.hot;
        let flags = self.predictor.is_some();
        let sc = &mut *self.sc;
        let bias = f.in_bias.as_ref();
        let quant = hot.layout.gate_dtype.is_quantized();
        let x = xb_input(dev, quant, &sc.xb, &mut sc.xq, &mut sc.xq_of_xb)?;
        let act = gpu_act(kind);
        if flags && self.gather {
            dev.active_slots(hot, &sc.active, &mut sc.slots)?;
            dev.hot_gate_up_listed(hot, x, &sc.slots, act, bias, &mut sc.hb)?;
            dev.nonzero_rows(hot, &sc.hb, Some(&sc.slots), &mut sc.rows)?;
        } else {
            let active = flags.then_some(&sc.active);
            dev.hot_gate_up(hot, x, active, act, bias, &mut sc.hb)?;
            if let Some(t) = self.threshold {
                dev.threshold_mask(&mut sc.hb, hot.layout.n_hot, t)?;
            }
            if self.gather {
                dev.nonzero_rows(hot, &sc.hb, None, &mut sc.rows)?;
            }
        }
        self.hot_down()
    }

    /// The cold neurons on the CPU (all of the plan's, or predictor mode's active ones), then
    /// one upload of their sum, added on the GPU.
    fn cold_ffn(&mut self) -> Result<()> {
        let (model, l, mode, dense, table) =
            (self.model, self.l, self.mode, self.dense, self.table);
        // The hot FFN's launches run while the CPU computes the cold neurons (a flush wherever
        // the layer has cold neurons, whether or not this token activates any: the step's
        // batches keep their numbers from token to token).
        if !table.cold.is_empty() {
            self.dev.flush()?;
        }
        let cpu = &mut *self.cpu;
        let cold: &[u32] = match self.predictor {
            Some(_) => &cpu.cold_active,
            None => &table.cold,
        };
        if cold.is_empty() {
            return Ok(());
        }
        self.link.enter(l, HybridPhase::ColdFfn);
        cpu.part.resize(model.config.dim, 0.0);
        let dense_down = match mode {
            Sparsity::Dense => DenseDown::Always,
            Sparsity::Threshold(_) if dense => DenseDown::Always,
            Sparsity::Threshold(_) => DenseDown::AboveCrossover,
            _ => DenseDown::Never,
        };
        let read = rows_ffn(
            model,
            l,
            self.threshold,
            dense_down,
            &cpu.xn,
            cold,
            &mut cpu.rows,
            &mut cpu.part,
        )?;
        self.link.cold_read(l, read);
        self.link.enter(l, HybridPhase::GpuSubmit);
        self.link.up(l, &cpu.part, &mut self.sc.xfer, 0)?;
        let sc = &mut *self.sc;
        let out = if self.direct { &mut sc.x } else { &mut sc.xb2 };
        self.dev.add(out, &sc.xfer)?;
        Ok(())
    }
}

/// The hybrid executor on backend `B`.
pub struct Executor<B: Backend> {
    dev: B,
    gpu: GpuModel<B>,
    placement: Arc<Placement>,
    kv: KvSync,
    stats: TransferStats,
    /// Each decode step's time by layer and phase.
    clock: PhaseClock,
    /// The CPU side's buffers: `host.x` is the residual stream on the host, `host.par_in` a
    /// parallel block's saved input.
    host: Scratch,
    /// The CPU side's buffers of the FFN blocks.
    cpu: CpuFfnScratch,
    /// Mixture of experts: per layer each expert's cold neurons (empty for a layer without hot
    /// neurons).
    moe_cold: Vec<Vec<Vec<u32>>>,
    /// Whether the model is a mixture of experts.
    moe: bool,
    /// RoPE's angle per position of each rotated pair: the global layers' and, for families
    /// whose sliding layers have their own base, theirs.
    inv_freqs: [Vec<f64>; 2],
    saved: Residency,
    /// Whether the hot FFN runs over lists gathered on the GPU (the default; see
    /// [`GATHER_ENV`]) in the sparse modes (dense rows gather nothing).
    gather: bool,
    /// How long the CPU pool's threads spin, woken as a layer with cold neurons starts, waiting
    /// for its CPU part (see [`POOL_SPIN_ENV`]).
    pool_spin: std::time::Duration,
}

/// `POWERINFER_RS_POOL_SPIN_US`: microseconds the CPU pool's threads spin for a layer's CPU part,
/// woken as the layer starts (default [`POOL_SPIN_US`]; 0: they sleep between layers and wake
/// when the work arrives, tens of microseconds later on a VM whose idle vCPU halts).
pub const POOL_SPIN_ENV: &str = "POWERINFER_RS_POOL_SPIN_US";
/// Default of [`POOL_SPIN_ENV`]: longer than a layer's GPU part on the GPUs we plan for (about
/// 0.2 ms for a 7B layer at 40% of its bytes on an H200), so the threads are running when the
/// CPU's part begins; a bound on the core time a layer without CPU work wastes.
pub const POOL_SPIN_US: u64 = 1000;

/// `POWERINFER_RS_GPU_GATHER=0` runs the hot FFN without the lists gathered on the GPU: gate/up
/// over every hot slot testing its flag, the down pass over every hot row testing its
/// coefficient (the path before compact.cu), for measuring one against the other on a GPU.
pub const GATHER_ENV: &str = "POWERINFER_RS_GPU_GATHER";

impl<B: Backend> Executor<B> {
    /// Upload what `placement` puts on the GPU of `model` to `dev`.
    pub fn new(dev: B, model: &ModelWeights, placement: Arc<Placement>) -> Result<Executor<B>> {
        let gpu = GpuModel::upload(&dev, model, &placement)?;
        let c = &model.config;
        let ef = c.moe.expert_ffn(c.ffn_dim);
        let moe_cold = placement
            .file
            .table
            .layers
            .iter()
            .map(|t| match c.moe.is_moe() && !t.hot.is_empty() {
                true => cold_by_expert(&t.hot, c.moe.n_expert, ef),
                false => Vec::new(),
            })
            .collect();
        Ok(Executor {
            dev,
            gpu,
            placement,
            kv: KvSync::default(),
            stats: TransferStats::new(c.n_layers),
            clock: PhaseClock::new(c.n_layers),
            host: Scratch::default(),
            cpu: CpuFfnScratch::default(),
            moe_cold,
            moe: c.moe.is_moe(),
            inv_freqs: [c.rope_inv_freqs(false), c.rope_inv_freqs(true)],
            saved: Residency::default(),
            gather: std::env::var(GATHER_ENV).map_or(true, |v| v != "0"),
            pool_spin: std::time::Duration::from_micros(
                std::env::var(POOL_SPIN_ENV)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(POOL_SPIN_US),
            ),
        })
    }

    fn scratch(gpu: &mut GpuModel<B>) -> Result<&mut GpuScratch<B>> {
        gpu.scratch
            .as_mut()
            .ok_or_else(|| powerinfer_core::Error::Other("no GPU scratch buffers".into()))
    }
}

impl<B: Backend> Hybrid for Executor<B> {
    fn describe(&self) -> String {
        self.dev.describe()
    }

    fn allocations(&self) -> &[Allocation] {
        &self.gpu.registry.allocations
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.dev.allocated_bytes()
    }

    fn kernel_launches(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        self.dev.kernel_launches()
    }

    fn graph_stats(&self) -> Option<powerinfer_cuda::graph::GraphStats> {
        self.dev.graph_stats()
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.dev.mem_info()
    }

    fn transfers(&self) -> &TransferStats {
        &self.stats
    }

    fn phases(&self) -> &PhaseStats {
        self.clock.stats()
    }

    fn reset_transfers(&mut self) {
        self.stats = TransferStats::new(self.stats.layers.len().saturating_sub(1));
        self.clock.reset();
    }

    fn set_mode(&mut self, mode: &Sparsity) -> Result<()> {
        refuse_cpu_only(mode, self.moe)?;
        if let Sparsity::Predictor { layers, .. } = mode {
            for (i, layer) in self.gpu.layers.iter_mut().enumerate() {
                if let Some(p) = &mut layer.predictor {
                    p.fill(&self.dev, i, &layers[i])?;
                }
            }
        }
        Ok(())
    }

    fn before_cpu_pass(&mut self, cache: &mut KvCache) -> Result<()> {
        let mut link = Link::new(&self.dev, &mut self.stats, &mut self.clock);
        self.kv.to_cpu(&mut link, &self.gpu, cache)
    }

    fn after_cpu_pass(&mut self, len: usize) {
        self.kv.cpu_wrote(len);
    }

    fn truncate(&mut self, len: usize) {
        self.kv.truncate(len);
    }

    fn decode(
        &mut self,
        model: &ModelWeights,
        mode: &Sparsity,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<Vec<f32>> {
        self.clock.begin_step();
        let out = self.step(model, mode, cache, token);
        self.clock.end_step(out.is_ok());
        out
    }
}

impl<B: Backend> Executor<B> {
    /// One decode step (see [`Hybrid::decode`]), timed by its caller.
    fn step(
        &mut self,
        model: &ModelWeights,
        mode: &Sparsity,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<Vec<f32>> {
        let c = &model.config;
        let pos = cache.len();
        let plan = &self.placement.file;
        let gpu_attention = plan.attention.iter().any(|&a| a);
        ensure!(
            !gpu_attention || pos < plan.context,
            ContextOverflow,
            "position {pos} is past the plan's context of {} positions (the size of its GPU KV \
             caches); plan again with a larger --context",
            plan.context
        );
        ensure!(
            (token as usize) < c.vocab_size,
            Token,
            "token id {token} is outside the vocabulary 0..{}",
            c.vocab_size
        );
        cache.reserve(1)?;
        {
            self.clock.enter(0, HybridPhase::KvSync);
            let mut link = Link::new(&self.dev, &mut self.stats, &mut self.clock);
            self.kv.to_gpu(&mut link, &mut self.gpu, cache)?;
            self.clock.enter(0, HybridPhase::Other);
        }
        if let Some(sc) = self.gpu.scratch.as_mut() {
            sc.xq_of_xb = false;
        }
        // With graphs on, the step's launch batches are numbered from here (a graph each).
        self.dev.begin_step()?;
        embed(model, &[token], pos, &mut self.host.x)?;
        let mut res = Residency {
            on_host: true,
            on_device: false,
        };
        let angles = Angles::new(c, pos, 1);
        for l in 0..c.n_layers {
            self.clock.enter(l, HybridPhase::Other);
            if !self.placement.file.table.layers[l].cold.is_empty() {
                // The pool's threads start now, while the GPU's part of the layer is queued.
                powerinfer_cpu::warm_pool(self.pool_spin);
            }
            if model.program.layers[l].save_residual {
                self.save_residual(res)?;
            }
            // A router that reads the layer's input (SmallThinker) runs on the CPU before the
            // attention block.
            if let (true, Some(m)) = (model.program.layers[l].early_router, &model.layers[l].moe) {
                self.clock.enter(l, HybridPhase::CpuRoute);
                self.host_x(l, &mut res)?;
                early_logits(m, &self.host.x, 1, &mut self.host.moe)?;
            }
            if self.gpu.layers[l].attention.is_some() {
                self.gpu_attention(model, l, pos, &mut res)?;
            } else {
                self.clock.enter(l, HybridPhase::CpuAttention);
                self.host_x(l, &mut res)?;
                let kv = &mut Kv::Run { cache, start: pos };
                attention_block(model, l, mode, kv, &mut self.host, None, 1, &angles)?;
                res.on_device = false;
            }
            if self.gpu.layers[l].ffn.is_some() {
                self.hybrid_ffn(model, mode, l, pos, &mut res)?;
            } else {
                self.clock.enter(l, HybridPhase::CpuFfn);
                self.host_x(l, &mut res)?;
                if model.program.layers[l].save_residual {
                    self.host_saved(l)?;
                }
                let rows = Rows::Run { mode, start: pos };
                ffn_block(model, l, &rows, &mut self.host, None, 1)?;
                res.on_device = false;
            }
        }
        let logits = self.output(model, &mut res)?;
        self.clock.enter(c.n_layers, HybridPhase::Other);
        cache.set_len(pos + 1);
        self.kv.gpu_wrote(pos + 1);
        self.stats.steps += 1;
        Ok(logits)
    }

    /// Make the host's copy of the residual current (a download when the device has it).
    fn host_x(&mut self, slot: usize, res: &mut Residency) -> Result<()> {
        if !res.on_host {
            let sc = Self::scratch(&mut self.gpu)?;
            Link::new(&self.dev, &mut self.stats, &mut self.clock).down(
                slot,
                &sc.x,
                0,
                &mut self.host.x,
            )?;
            res.on_host = true;
        }
        Ok(())
    }

    /// Make the device's copy of the residual current (an upload when the host has it).
    fn device_x(&mut self, slot: usize, res: &mut Residency) -> Result<()> {
        if !res.on_device {
            let sc = Self::scratch(&mut self.gpu)?;
            Link::new(&self.dev, &mut self.stats, &mut self.clock).up(
                slot,
                &self.host.x,
                &mut sc.x,
                0,
            )?;
            res.on_device = true;
        }
        Ok(())
    }

    /// A parallel block starts: keep the residual as its FFN's input, on each side that has it
    /// (a copy, no transfer).
    fn save_residual(&mut self, res: Residency) -> Result<()> {
        self.saved = res;
        if res.on_host {
            self.host.par_in.clone_from(&self.host.x);
        }
        if res.on_device {
            let sc = Self::scratch(&mut self.gpu)?;
            let Some(saved) = sc.saved.as_mut() else {
                powerinfer_core::bail!(Other, "no GPU buffer for a parallel block's input");
            };
            self.dev.copy(saved, &sc.x)?;
        }
        Ok(())
    }

    /// Make the host's copy of the saved input current.
    fn host_saved(&mut self, slot: usize) -> Result<()> {
        if !self.saved.on_host {
            let sc = Self::scratch(&mut self.gpu)?;
            let Some(saved) = sc.saved.as_ref() else {
                powerinfer_core::bail!(Other, "no GPU buffer for a parallel block's input");
            };
            self.host.par_in.resize(self.host.x.len(), 0.0);
            Link::new(&self.dev, &mut self.stats, &mut self.clock).down(
                slot,
                saved,
                0,
                &mut self.host.par_in,
            )?;
            self.saved.on_host = true;
        }
        Ok(())
    }

    /// Make the device's copy of the saved input current.
    fn device_saved(&mut self, slot: usize) -> Result<()> {
        if !self.saved.on_device {
            let sc = Self::scratch(&mut self.gpu)?;
            let Some(saved) = sc.saved.as_mut() else {
                powerinfer_core::bail!(Other, "no GPU buffer for a parallel block's input");
            };
            Link::new(&self.dev, &mut self.stats, &mut self.clock).up(
                slot,
                &self.host.par_in,
                saved,
                0,
            )?;
            self.saved.on_device = true;
        }
        Ok(())
    }

    /// Layer `l`'s attention block on the GPU: its program's steps, each one kernel or a few.
    fn gpu_attention(
        &mut self,
        model: &ModelWeights,
        l: usize,
        pos: usize,
        res: &mut Residency,
    ) -> Result<()> {
        let c = &model.config;
        self.clock.enter(l, HybridPhase::GpuSubmit);
        self.device_x(l, res)?;
        let dev = &self.dev;
        let GpuModel {
            layers, scratch, ..
        } = &mut self.gpu;
        let (Some(sc), Some(a)) = (scratch.as_mut(), layers[l].attention.as_mut()) else {
            powerinfer_core::bail!(Other, "layer {l}: no GPU attention buffers");
        };
        let eps = c.rms_eps;
        let qkv_quant = [&a.wq, &a.wk, &a.wv].iter().any(|w| w.dtype.is_quantized());
        let steps = &model.program.layers[l].attention;
        // A per-head q/k norm right before RoPE runs inside RoPE's launch.
        let mut qk_norm_pending = false;
        // The o projection added itself into the residual (the Residual step then adds nothing).
        let mut residual_added = false;
        for (i, step) in steps.iter().enumerate() {
            match step {
                AttnStep::Norm(kind) => norm_into_xb(
                    dev,
                    *kind,
                    &sc.x,
                    &a.norm,
                    a.norm_bias.as_ref(),
                    eps,
                    qkv_quant,
                    &mut sc.xb,
                    &mut sc.xq,
                    &mut sc.xq_of_xb,
                )?,
                AttnStep::Qkv { bias } => {
                    let x = xb_input(dev, qkv_quant, &sc.xb, &mut sc.xq, &mut sc.xq_of_xb)?;
                    dev.matvec_rows(&a.wq, x, None, c.q_dim(), Act::None, &mut sc.q)?;
                    dev.matvec_rows(&a.wk, x, None, c.kv_dim(), Act::None, &mut sc.k)?;
                    dev.matvec_rows(&a.wv, x, None, c.kv_dim(), Act::None, &mut sc.v)?;
                    if let (true, Some([bq, bk, bv])) = (bias, &a.qkv_bias) {
                        dev.add(&mut sc.q, bq)?;
                        dev.add(&mut sc.k, bk)?;
                        dev.add(&mut sc.v, bv)?;
                    }
                }
                AttnStep::QkNorm
                    if !c.arch.qk_norm_full
                        && matches!(steps.get(i + 1), Some(AttnStep::Rope { .. })) =>
                {
                    qk_norm_pending = true;
                }
                AttnStep::QkNorm => {
                    let (Some([nq, nk]), Some(kn)) = (&a.qk_norm, sc.kn.as_mut()) else {
                        powerinfer_core::bail!(Other, "layer {l}: no GPU q/k norm buffers");
                    };
                    // Per head, or over the whole vector (OLMoE).
                    let (hq, hk) = match c.arch.qk_norm_full {
                        true => (1, 1),
                        false => (c.n_heads, c.n_kv_heads),
                    };
                    dev.rms_norm(&sc.q, nq, hq, eps, &mut sc.att)?;
                    std::mem::swap(&mut sc.q, &mut sc.att);
                    dev.rms_norm(&sc.k, nk, hk, eps, kn)?;
                    std::mem::swap(&mut sc.k, kn);
                }
                AttnStep::Rope { local } => {
                    // Queries and keys in one launch, each head normed first when the q/k norm
                    // was left for it.
                    let inv = &self.inv_freqs[usize::from(*local)];
                    let norms = match (qk_norm_pending, &a.qk_norm) {
                        (false, _) => None,
                        (true, Some([nq, nk])) => Some((nq, nk, eps)),
                        (true, None) => {
                            powerinfer_core::bail!(Other, "layer {l}: no GPU q/k norm buffers")
                        }
                    };
                    qk_norm_pending = false;
                    let (hd, style) = (c.head_dim, c.rope_style);
                    dev.rope(&mut sc.q, Some(&mut sc.k), hd, pos, inv, style, norms)?;
                }
                AttnStep::Attend(p) => {
                    let params = AttnParams {
                        n_heads: c.n_heads,
                        n_kv_heads: c.n_kv_heads,
                        head_dim: c.head_dim,
                        window: p.window,
                        scale: p.scale,
                        softcap: p.softcap,
                    };
                    match &mut a.cache {
                        KvBufs::F16(k, v) => attend(dev, sc, k, v, pos, &params)?,
                        KvBufs::F32(k, v) => attend(dev, sc, k, v, pos, &params)?,
                    }
                }
                AttnStep::Output { bias } => {
                    let quant = a.wo.dtype.is_quantized();
                    let x = row_input(dev, quant, &sc.att, &mut sc.xq, &mut sc.xq_of_xb)?;
                    if !bias && matches!(steps.get(i + 1), Some(AttnStep::Residual)) {
                        // Straight into the residual, in the projection's launch.
                        dev.matvec_add(&a.wo, x, c.dim, &mut sc.x)?;
                        residual_added = true;
                        continue;
                    }
                    dev.matvec_rows(&a.wo, x, None, c.dim, Act::None, &mut sc.xb2)?;
                    if let (true, Some(b)) = (bias, &a.out_bias) {
                        dev.add(&mut sc.xb2, b)?;
                    }
                }
                AttnStep::PostNorm => {
                    let Some(post) = &a.post_norm else {
                        powerinfer_core::bail!(Other, "layer {l}: no GPU post-attention norm");
                    };
                    sc.xq_of_xb = false;
                    dev.rms_norm(&sc.xb2, post, 1, eps, &mut sc.xb)?;
                    std::mem::swap(&mut sc.xb, &mut sc.xb2);
                }
                AttnStep::Residual if residual_added => {}
                AttnStep::Residual => dev.add(&mut sc.x, &sc.xb2)?,
            }
        }
        res.on_host = false;
        Ok(())
    }

    /// Layer `l`'s FFN block with hot neurons on the GPU and cold ones on the CPU, at the same
    /// time: its program's steps, the FFN core split by the plan (see [`FfnPass`]).
    fn hybrid_ffn(
        &mut self,
        model: &ModelWeights,
        mode: &Sparsity,
        l: usize,
        pos: usize,
        res: &mut Residency,
    ) -> Result<()> {
        let prog = &model.program.layers[l];
        let placement = Arc::clone(&self.placement);
        let table = &placement.file.table.layers[l];
        let dense = mode.dense_rows(pos, 1) > 0;
        let predictor = match mode {
            Sparsity::Predictor { layers, input, .. } if !dense => Some((&layers[l], *input)),
            _ => None,
        };
        let gpu_predictor = predictor.is_some()
            && self.gpu.layers[l]
                .predictor
                .as_ref()
                .is_some_and(|p| p.filled);
        let cpu_predictor = predictor.is_some() && !gpu_predictor;
        // A mixture of experts routes on the CPU.
        let host_needed = !table.cold.is_empty() || cpu_predictor || model.config.moe.is_moe();
        let saved = prog.save_residual;
        self.ffn_inputs(l, saved, host_needed, res)?;
        let GpuModel {
            layers, scratch, ..
        } = &mut self.gpu;
        let Some(sc) = scratch.as_mut() else {
            powerinfer_core::bail!(Other, "no GPU scratch buffers");
        };
        let GpuLayer {
            predictor: gpu_pred,
            ffn,
            ..
        } = &layers[l];
        let Some(f) = ffn else {
            powerinfer_core::bail!(Other, "layer {l}: no hot neurons on the GPU");
        };
        let mut pass = FfnPass {
            model,
            mode,
            l,
            table,
            f,
            gpu_pred: gpu_pred.as_ref(),
            dense,
            predictor,
            gpu_predictor,
            saved,
            host_needed,
            // Its output goes straight into the residual unless a post-norm comes between.
            direct: !prog.ffn.contains(&FfnStep::PostNorm),
            // Dense rows hold almost no exact zeros: gathering would only add a launch.
            gather: self.gather && !dense && !matches!(mode, Sparsity::Dense),
            threshold: match mode {
                Sparsity::Threshold(t) if !dense => Some(t[l]),
                _ => None,
            },
            dev: &self.dev,
            link: Link::new(&self.dev, &mut self.stats, &mut self.clock),
            sc,
            host: &self.host,
            cpu: &mut self.cpu,
            moe_cold: &self.moe_cold[l],
        };
        let xb_quant = pass.xb_quantized();
        for step in &prog.ffn {
            pass.step(step, xb_quant)?;
        }
        res.on_host = false;
        res.on_device = true;
        Ok(())
    }

    /// An FFN block's input on each side it is needed: the residual (or a parallel block's
    /// saved input) on the device, and on the host when the CPU takes part.
    fn ffn_inputs(
        &mut self,
        l: usize,
        saved: bool,
        host_needed: bool,
        res: &mut Residency,
    ) -> Result<()> {
        self.clock.enter(l, HybridPhase::GpuSubmit);
        self.device_x(l, res)?;
        if saved {
            self.device_saved(l)?;
        }
        if host_needed {
            self.host_x(l, res)?;
            if saved {
                self.host_saved(l)?;
            }
        }
        Ok(())
    }
    /// The output steps (final norm, head, soft-cap), where the plan put them.
    fn output(&mut self, model: &ModelWeights, res: &mut Residency) -> Result<Vec<f32>> {
        let c = &model.config;
        let slot = c.n_layers;
        if self.gpu.output.is_none() {
            self.clock.enter(slot, HybridPhase::CpuOutput);
            self.host_x(slot, res)?;
            // The hybrid executor refuses the input mode (set_mode): the output head is dense.
            return output_block(model, &Sparsity::Dense, &mut self.host, 0, 0, 1);
        }
        self.clock.enter(slot, HybridPhase::GpuSubmit);
        self.device_x(slot, res)?;
        let dev = &self.dev;
        let GpuModel {
            output, scratch, ..
        } = &mut self.gpu;
        let (Some(sc), Some(o)) = (scratch.as_mut(), output.as_mut()) else {
            powerinfer_core::bail!(Other, "no GPU output buffers");
        };
        let p = &model.program.output;
        let quant = o.w.dtype.is_quantized();
        norm_into_xb(
            dev,
            p.norm,
            &sc.x,
            &o.norm,
            o.norm_bias.as_ref(),
            c.rms_eps,
            quant,
            &mut sc.xb,
            &mut sc.xq,
            &mut sc.xq_of_xb,
        )?;
        let x = xb_input(dev, quant, &sc.xb, &mut sc.xq, &mut sc.xq_of_xb)?;
        dev.matvec_rows(&o.w, x, None, c.vocab_size, Act::None, &mut o.logits)?;
        if let Some(cap) = p.softcap {
            dev.softcap(&mut o.logits, c.vocab_size, cap)?;
        }
        let mut logits = vec![0.0f32; c.vocab_size];
        Link::new(dev, &mut self.stats, &mut self.clock).down(slot, &o.logits, 0, &mut logits)?;
        Ok(logits)
    }
}
