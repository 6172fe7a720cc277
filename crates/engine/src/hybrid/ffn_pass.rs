//! A layer's FFN block split between the GPU's hot neurons and the CPU's cold ones for one
//! token ([`FfnPass`]): the GPU's part of each step is queued first, the CPU's part runs while
//! it computes, and its sum crosses once and is added on the GPU. What the block does for the
//! token (dense rows, a predictor and on which side, a threshold) is decided first
//! ([`FfnChoices`]).

use powerinfer_core::{ensure, LayerTable, Result, Side};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{down_splits, Act, Backend, FfnAct};

use crate::ffn::{rows_ffn, DenseDown, FfnScratch};
use crate::forward::{norm_bias, norm_rows_with, Scratch};
use crate::hybrid::experts::{cold_experts, token_weights};
use crate::hybrid::gpu_model::{GpuFfn, GpuPredictor, GpuScratch};
use crate::hybrid::phase_clock::HybridPhase;
use crate::hybrid::quantized_x::{Block, NormWeights, XbSite};
use crate::hybrid::transfers::Link;
use crate::layer::{FfnKind, FfnStep, NormKind};
use crate::moe::router_logits;
use crate::moe_weights::{route, MoeWeights};
use crate::sparsity::{
    predicted_active, LayerPredictor, PredictorInput, PredictorScratch, Sparsity,
};
use crate::weights::ModelWeights;

/// The GPU kernels' form of an FFN step's activation.
fn gpu_act(k: FfnKind) -> FfnAct {
    FfnAct {
        act: Act::from(k.act),
        relu_threshold: k.relu_threshold,
        up_act: k.up_act,
        swiglu_limit: k.swiglu_limit.unwrap_or(0.0),
    }
}

/// What a layer's FFN block does for one token, decided before its steps run (from the mode,
/// the plan's split and the token's position).
#[derive(Clone, Copy)]
pub struct FfnChoices<'a> {
    /// Whether the token's rows are dense whatever the mode (threshold mode's first position).
    pub dense: bool,
    /// Predictor mode: the layer's predictor and what it reads.
    pub predictor: Option<(&'a LayerPredictor, PredictorInput)>,
    /// Whether the predictor runs on the GPU (its weights are there and filled).
    pub gpu_predictor: bool,
    /// Whether the block reads a parallel block's saved input instead of the residual.
    pub saved: bool,
    /// Whether the CPU takes part (cold neurons, a CPU predictor, a router).
    pub host_needed: bool,
    /// Whether the block's output goes straight into the residual (no post-norm between).
    pub direct: bool,
    /// Whether the hot FFN runs over lists gathered on the GPU.
    pub gather: bool,
    /// Threshold mode's threshold for this layer and token.
    pub threshold: Option<f32>,
}

impl<'a> FfnChoices<'a> {
    /// Layer `l`'s choices for the token at `pos` under `mode`: `table` is the plan's split,
    /// `gpu_filled` whether the layer's GPU predictor holds its weights, `gather` whether the
    /// executor gathers lists on the GPU in the sparse modes.
    pub fn new(
        model: &ModelWeights,
        mode: &'a Sparsity,
        table: &LayerTable,
        l: usize,
        pos: usize,
        gpu_filled: bool,
        gather: bool,
    ) -> Self {
        let dense = mode.dense_rows(pos, 1) > 0;
        let predictor = match mode {
            Sparsity::Predictor { layers, input, .. } if !dense => Some((&layers[l], *input)),
            _ => None,
        };
        let gpu_predictor = predictor.is_some() && gpu_filled;
        let cpu_predictor = predictor.is_some() && !gpu_predictor;
        let prog = &model.program.layers[l];
        FfnChoices {
            dense,
            predictor,
            gpu_predictor,
            saved: prog.save_residual,
            // A mixture of experts routes on the CPU.
            host_needed: !table.cold.is_empty() || cpu_predictor || model.config.is_moe_layer(l),
            // Its output goes straight into the residual unless a post-norm comes between.
            direct: !prog.ffn.contains(&FfnStep::PostNorm),
            // Dense rows hold almost no exact zeros: gathering would only add a launch.
            gather: gather && !dense && !matches!(mode, Sparsity::Dense),
            threshold: match mode {
                Sparsity::Threshold(t) if !dense => Some(t[l]),
                _ => None,
            },
        }
    }
}

/// The CPU side's buffers of a hybrid FFN block (kept across tokens).
#[derive(Default)]
pub struct CpuFfnScratch {
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
pub struct FfnPass<'a, B: Backend> {
    pub model: &'a ModelWeights,
    pub mode: &'a Sparsity,
    pub l: usize,
    /// The plan's split of the layer's neurons.
    pub table: &'a LayerTable,
    /// The layer's hot neurons (with its norms and biases) on the GPU, and its GPU predictor.
    pub f: &'a GpuFfn<B>,
    pub gpu_pred: Option<&'a GpuPredictor<B>>,
    /// What was decided for the token before the steps run.
    pub choices: FfnChoices<'a>,
    pub dev: &'a B,
    pub link: Link<'a, B>,
    pub sc: &'a mut GpuScratch<B>,
    /// The CPU side's residual and saved input (current where `host_needed`).
    pub host: &'a Scratch,
    pub cpu: &'a mut CpuFfnScratch,
    /// Mixture of experts: each expert's cold neurons in this layer.
    pub moe_cold: &'a [Vec<u32>],
}

impl<B: Backend> FfnPass<'_, B> {
    /// Run `steps`, the layer's FFN program.
    pub fn run(&mut self, steps: &[FfnStep]) -> Result<()> {
        let xb_quant = self.xb_quantized();
        for step in steps {
            self.step(step, xb_quant)?;
        }
        Ok(())
    }

    /// Where this block's norm writes `xb`.
    fn site(&self) -> XbSite {
        XbSite {
            layer: self.l,
            block: Block::Ffn,
        }
    }

    /// Whether the norm quantizes xb in its launch: when a quantized matvec reads xb, the hot
    /// gate/up rows or the GPU predictor's fc1 over the FFN norm's output; not when a
    /// quantized fc1 reads the FFN's input instead (its quantize_x would overwrite xq before
    /// gate/up reads it).
    fn xb_quantized(&self) -> bool {
        let fc1_reads_xb = match (self.choices.predictor, self.gpu_pred) {
            (Some((_, PredictorInput::FfnNorm)), Some(gp)) => {
                self.choices.gpu_predictor && gp.fc1.dtype.is_quantized()
            }
            _ => false,
        };
        let fc1_reads_input = match (self.choices.predictor, self.gpu_pred) {
            (Some((_, PredictorInput::FfnInp)), Some(gp)) => {
                self.choices.gpu_predictor && gp.fc1.dtype.is_quantized()
            }
            _ => false,
        };
        (self.f.hot.layout.gate_dtype.is_quantized() && !fc1_reads_input) || fc1_reads_xb
    }

    /// The output the block's products add into: the residual, or (before a post-norm) xb2.
    fn out(&mut self) -> &mut B::Buf<f32> {
        match self.choices.direct {
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
                if self.choices.predictor.is_some() {
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
                self.sc
                    .post_norm(self.dev, post, self.model.config.rms_eps)?;
            }
            FfnStep::Residual => {
                if !self.choices.direct {
                    self.dev.add(&mut self.sc.x, &self.sc.xb2)?;
                }
            }
        }
        Ok(())
    }

    /// The FFN norm: on the GPU into xb (quantized in the same launch with `xb_quant`), and
    /// where the CPU takes part on the host into its xn, after the GPU's queued work starts.
    fn norm(&mut self, kind: NormKind, xb_quant: bool) -> Result<()> {
        let (model, l, f, site) = (self.model, self.l, self.f, self.site());
        let c = &model.config;
        let sc = &mut *self.sc;
        let input = match (self.choices.saved, sc.saved.as_ref()) {
            (true, Some(s)) => s,
            _ => &sc.x,
        };
        let norm = NormWeights {
            kind,
            w: &f.norm,
            bias: f.norm_bias.as_ref(),
            eps: c.rms_eps,
        };
        sc.xq
            .norm_into(self.dev, site, &norm, input, &mut sc.xb, xb_quant)?;
        if self.choices.host_needed {
            // The GPU's queued work (with graphs on, a batch) starts now, while the CPU
            // normalises, predicts, routes and computes its cold neurons.
            self.dev.flush()?;
            self.link.enter(l, HybridPhase::CpuNorm);
            let x_in = match self.choices.saved {
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
        route(mf, m.score_bias.as_deref(), logits, &mut cpu.routes);
        token_weights(mf, m, &cpu.routes, &cpu.xn, &mut cpu.expert_w);
        self.link.enter(l, HybridPhase::GpuSubmit);
        Ok(())
    }

    /// Queue the routed experts' hot neurons (and the shared expert) on the GPU, the experts'
    /// weights uploaded first; the down pass adds into the block's output.
    fn hot_experts(&mut self, kind: FfnKind) -> Result<()> {
        let (model, l, dev, f, site) = (self.model, self.l, self.dev, self.f, self.site());
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
        let x = sc.xq.xb(dev, quant, site, &sc.xb)?;
        let bias = f
            .expert_bias
            .as_ref()
            .map_or([None, None], |[g, u]| [Some(g), Some(u)]);
        dev.hot_gate_up_biased(hot, x, Some(&sc.active), act, bias, &mut sc.hb)?;
        if let Some(t) = self.choices.threshold {
            // The routed experts' slots: the shared expert (all of it hot, the largest ids)
            // runs dense, as on the CPU, in the last slots.
            let n = hot.layout.n_hot.saturating_sub(mf.shared_ffn_dim);
            dev.threshold_mask(&mut sc.hb, n, t)?;
        }
        dev.expert_scale(hot, ew, ef, routed, &mut sc.hb)?;
        // The down pass over the nonzero activations only, gathered on the GPU.
        if self.choices.gather {
            dev.nonzero_rows(hot, &sc.hb, None, &mut sc.rows)?;
        }
        self.hot_down()
    }

    /// The hot neurons' down pass into the block's output (the residual directly, or the
    /// cleared FFN buffer): over the rows gathered in `sc.rows`, or over every hot slot's `sc.hb`.
    fn hot_down(&mut self) -> Result<()> {
        let (dev, hot) = (self.dev, &self.f.hot);
        let sc = &mut *self.sc;
        let out = match self.choices.direct {
            true => &mut sc.x,
            false => {
                dev.fill(&mut sc.xb2, 0.0)?;
                &mut sc.xb2
            }
        };
        let splits = down_splits(hot.layout.n_hot);
        match self.choices.gather {
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
            self.choices.threshold,
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
            let out = if self.choices.direct {
                &mut sc.x
            } else {
                &mut sc.xb2
            };
            dev.add(out, &sc.xfer)?;
        }
        Ok(())
    }

    /// Predictor mode's active set: which hot slots the GPU computes (`sc.active`, a flag per
    /// neuron) and which cold neurons the CPU does (`cpu.cold_active`), by the GPU's predictor
    /// or the CPU's.
    fn predict(&mut self) -> Result<()> {
        let Some((p, input)) = self.choices.predictor else {
            return Ok(());
        };
        let (model, l, dev, table, site) = (self.model, self.l, self.dev, self.table, self.site());
        let c = &model.config;
        let (sc, cpu) = (&mut *self.sc, &mut *self.cpu);
        if let (true, Some(gp)) = (self.choices.gpu_predictor, self.gpu_pred) {
            let quant = gp.fc1.dtype.is_quantized();
            let x = match (input, self.choices.saved, sc.saved.as_ref()) {
                (PredictorInput::FfnNorm, ..) => sc.xq.xb(dev, quant, site, &sc.xb)?,
                (PredictorInput::FfnInp, true, Some(s)) => sc.xq.row(dev, quant, s)?,
                (PredictorInput::FfnInp, ..) => sc.xq.row(dev, quant, &sc.x)?,
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
            let x = match (input, self.choices.saved) {
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
        let (dev, f, site) = (self.dev, self.f, self.site());
        let hot = &f.hot;
        let flags = self.choices.predictor.is_some();
        let sc = &mut *self.sc;
        let bias = f.in_bias.as_ref();
        let quant = hot.layout.gate_dtype.is_quantized();
        let x = sc.xq.xb(dev, quant, site, &sc.xb)?;
        let act = gpu_act(kind);
        if flags && self.choices.gather {
            dev.active_slots(hot, &sc.active, &mut sc.slots)?;
            dev.hot_gate_up_listed(hot, x, &sc.slots, act, bias, &mut sc.hb)?;
            dev.nonzero_rows(hot, &sc.hb, Some(&sc.slots), &mut sc.rows)?;
        } else {
            let active = flags.then_some(&sc.active);
            dev.hot_gate_up(hot, x, active, act, bias, &mut sc.hb)?;
            if let Some(t) = self.choices.threshold {
                dev.threshold_mask(&mut sc.hb, hot.layout.n_hot, t)?;
            }
            if self.choices.gather {
                dev.nonzero_rows(hot, &sc.hb, None, &mut sc.rows)?;
            }
        }
        self.hot_down()
    }

    /// The cold neurons on the CPU (all of the plan's, or predictor mode's active ones), then
    /// one upload of their sum, added on the GPU.
    fn cold_ffn(&mut self) -> Result<()> {
        let (model, l, mode, dense, table) = (
            self.model,
            self.l,
            self.mode,
            self.choices.dense,
            self.table,
        );
        // The hot FFN's launches run while the CPU computes the cold neurons (a flush wherever
        // the layer has cold neurons, whether or not this token activates any: the step's
        // batches keep their numbers from token to token).
        if !table.cold.is_empty() {
            self.dev.flush()?;
        }
        let cpu = &mut *self.cpu;
        let cold: &[u32] = match self.choices.predictor {
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
            self.choices.threshold,
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
        let out = if self.choices.direct {
            &mut sc.x
        } else {
            &mut sc.xb2
        };
        self.dev.add(out, &sc.xfer)?;
        Ok(())
    }
}
