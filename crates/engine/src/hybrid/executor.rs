//! The hybrid decode step over one backend: per layer it walks the layer program (see
//! [`crate::layer`]), the attention block where the plan put it ([`crate::hybrid::attention`]),
//! then the FFN block split between the GPU's hot neurons and the CPU's cold ones, computed at
//! the same time ([`crate::hybrid::ffn_pass`]). A block on the CPU runs the CPU forward pass's
//! own code for it. The residual stream (and a parallel block's saved input) is
//! [`Mirrored`](crate::hybrid::mirrored::Mirrored): it moves between host and device only when the next step runs on the other
//! side.

use std::sync::Arc;

use powerinfer_core::{ensure, Result, RopeFreqs, Side};
use powerinfer_cuda::{Allocation, Backend};

use crate::forward::{attention_block, embed, ffn_block, output_block, Angles, Kv, Rows, Scratch};
use crate::hybrid::api::{refuse_cpu_only, Hybrid};
use crate::hybrid::attention::AttnPass;
use crate::hybrid::experts::cold_by_expert;
use crate::hybrid::ffn_pass::{CpuFfnScratch, FfnChoices, FfnPass};
use crate::hybrid::gpu_model::{GpuLayer, GpuModel};
use crate::hybrid::knobs::Knobs;
pub use crate::hybrid::knobs::{GATHER_ENV, POOL_SPIN_ENV, POOL_SPIN_US};
use crate::hybrid::kv_sync::KvSync;
use crate::hybrid::mirrored::{Streams, Vector};
use crate::hybrid::output::gpu_output;
use crate::hybrid::phase_clock::{HybridPhase, PhaseClock, PhaseStats};
use crate::hybrid::transfers::{Link, TransferStats};
use crate::kv_cache::KvCache;
use crate::moe::early_logits;
use crate::placement::Placement;
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

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
    inv_freqs: [RopeFreqs; 2],
    /// Where the residual stream and a parallel block's saved input are current.
    streams: Streams,
    /// The settings from the environment (gathering lists on the GPU, the pool's spin).
    knobs: Knobs,
}

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
            .enumerate()
            .map(|(l, t)| match c.is_moe_layer(l) && !t.hot.is_empty() {
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
            inv_freqs: [c.rope_freqs(false), c.rope_freqs(true)],
            streams: Streams::default(),
            knobs: Knobs::from_env(),
        })
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
        // With graphs on, the step's launch batches are numbered from here (a graph each).
        self.dev.begin_step()?;
        // A new token: no quantized x of the last step's is current (each block's norm
        // quantizes its own; this keeps a block that starts without one from reading a stale
        // copy).
        if let Some(sc) = self.gpu.scratch.as_mut() {
            sc.xq.xb_changed();
        }
        embed(model, &[token], pos, &mut self.host.x)?;
        self.streams.x.wrote(Side::Cpu);
        let angles = Angles::new(c, pos, 1);
        for l in 0..c.n_layers {
            self.clock.enter(l, HybridPhase::Other);
            if !self.placement.file.table.layers[l].cold.is_empty() {
                // The pool's threads start now, while the GPU's part of the layer is queued.
                powerinfer_cpu::warm_pool(self.knobs.pool_spin);
            }
            if model.program.layers[l].save_residual {
                let sc = self.gpu.scratch.as_mut();
                self.streams.save_residual(&self.dev, &mut self.host, sc)?;
            }
            // A router that reads the layer's input (SmallThinker) runs on the CPU before the
            // attention block.
            if let (true, Some(m)) = (model.program.layers[l].early_router, &model.layers[l].moe) {
                self.clock.enter(l, HybridPhase::CpuRoute);
                self.current(Vector::Residual, Side::Cpu, l)?;
                early_logits(m, &self.host.x, 1, &mut self.host.moe)?;
            }
            if self.gpu.layers[l].attention.is_some() {
                self.gpu_attention(model, l, pos)?;
            } else {
                self.clock.enter(l, HybridPhase::CpuAttention);
                self.current(Vector::Residual, Side::Cpu, l)?;
                let kv = &mut Kv::Run { cache, start: pos };
                attention_block(model, l, mode, kv, &mut self.host, None, 1, &angles)?;
                self.streams.x.wrote(Side::Cpu);
            }
            if self.gpu.layers[l].ffn.is_some() {
                self.hybrid_ffn(model, mode, l, pos)?;
            } else {
                self.clock.enter(l, HybridPhase::CpuFfn);
                self.current(Vector::Residual, Side::Cpu, l)?;
                if model.program.layers[l].save_residual {
                    self.current(Vector::Saved, Side::Cpu, l)?;
                }
                let rows = Rows::Run { mode, start: pos };
                ffn_block(model, l, &rows, &mut self.host, None, 1)?;
                self.streams.x.wrote(Side::Cpu);
            }
        }
        let logits = self.output(model)?;
        self.clock.enter(c.n_layers, HybridPhase::Other);
        cache.set_len(pos + 1);
        self.kv.gpu_wrote(pos + 1);
        self.stats.steps += 1;
        Ok(logits)
    }

    /// Make `side`'s copy of `v` current (see [`Streams::current`]).
    fn current(&mut self, v: Vector, side: Side, slot: usize) -> Result<()> {
        let mut link = Link::new(&self.dev, &mut self.stats, &mut self.clock);
        let sc = self.gpu.scratch.as_mut();
        self.streams
            .current(v, side, slot, &mut link, &mut self.host, sc)
    }

    /// Layer `l`'s attention block on the GPU (see [`AttnPass`]).
    fn gpu_attention(&mut self, model: &ModelWeights, l: usize, pos: usize) -> Result<()> {
        self.clock.enter(l, HybridPhase::GpuSubmit);
        self.current(Vector::Residual, Side::Gpu, l)?;
        let GpuModel {
            layers, scratch, ..
        } = &mut self.gpu;
        let (Some(sc), Some(a)) = (scratch.as_mut(), layers[l].attention.as_mut()) else {
            powerinfer_core::bail!(Other, "layer {l}: no GPU attention buffers");
        };
        let mut pass = AttnPass {
            dev: &self.dev,
            c: &model.config,
            l,
            pos,
            sc,
            a,
            inv_freqs: &self.inv_freqs,
        };
        pass.run(&model.program.layers[l].attention)?;
        self.streams.x.wrote(Side::Gpu);
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
    ) -> Result<()> {
        let placement = Arc::clone(&self.placement);
        let table = &placement.file.table.layers[l];
        let gpu_filled = self.gpu.layers[l]
            .predictor
            .as_ref()
            .is_some_and(|p| p.filled);
        let choices = FfnChoices::new(model, mode, table, l, pos, gpu_filled, self.knobs.gather);
        self.ffn_inputs(l, choices.saved, choices.host_needed)?;
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
            choices,
            dev: &self.dev,
            link: Link::new(&self.dev, &mut self.stats, &mut self.clock),
            sc,
            host: &self.host,
            cpu: &mut self.cpu,
            moe_cold: &self.moe_cold[l],
        };
        pass.run(&model.program.layers[l].ffn)?;
        self.streams.x.wrote(Side::Gpu);
        Ok(())
    }

    /// An FFN block's input on each side it is needed: the residual (or a parallel block's
    /// saved input) on the device, and on the host when the CPU takes part.
    fn ffn_inputs(&mut self, l: usize, saved: bool, host_needed: bool) -> Result<()> {
        self.clock.enter(l, HybridPhase::GpuSubmit);
        let sides: &[Side] = match host_needed {
            true => &[Side::Gpu, Side::Cpu],
            false => &[Side::Gpu],
        };
        for &side in sides {
            self.current(Vector::Residual, side, l)?;
            if saved {
                self.current(Vector::Saved, side, l)?;
            }
        }
        Ok(())
    }

    /// The output steps (final norm, head, soft-cap), where the plan put them.
    fn output(&mut self, model: &ModelWeights) -> Result<Vec<f32>> {
        let c = &model.config;
        let slot = c.n_layers;
        if self.gpu.output.is_none() {
            self.clock.enter(slot, HybridPhase::CpuOutput);
            self.current(Vector::Residual, Side::Cpu, slot)?;
            // The hybrid executor refuses the input mode (set_mode): the output head is dense.
            return output_block(model, &Sparsity::Dense, &mut self.host, 0, 0, 1);
        }
        self.clock.enter(slot, HybridPhase::GpuSubmit);
        self.current(Vector::Residual, Side::Gpu, slot)?;
        let GpuModel {
            output, scratch, ..
        } = &mut self.gpu;
        let (Some(sc), Some(o)) = (scratch.as_mut(), output.as_mut()) else {
            powerinfer_core::bail!(Other, "no GPU output buffers");
        };
        let mut link = Link::new(&self.dev, &mut self.stats, &mut self.clock);
        gpu_output(c, &model.program.output, sc, o, &mut link)
    }
}
