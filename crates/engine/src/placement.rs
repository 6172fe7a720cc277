//! A plan file adopted by an engine: read once (here, in Rust), checked against the loaded model
//! (shape, fingerprint, the VRAM budget) and against the engine's own list of the device
//! allocations it would make, which must come to the bytes the planner counted. The neuron table
//! and the placement stay here for the executor; Python gets the figures it reports.

use std::path::Path;

use powerinfer_core::{ensure, PlanFile, Result};
use powerinfer_cuda::{gpu_allocations, Allocation, LayerTensors, ModelTensors};

use crate::weights::ModelWeights;

/// A plan checked against one model.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The plan file: neuron table and placement.
    pub file: PlanFile,
    /// Every device allocation the engine makes to run it, `(name, bytes)`.
    pub allocations: Vec<Allocation>,
}

impl Placement {
    /// Read the plan at `path` for `weights` and list the device allocations the engine would
    /// make for it, without checking them against the plan's count or a budget (see
    /// [`Placement::load`]). [`Error::Plan`](powerinfer_core::Error::Plan) when it is unreadable
    /// or made for another model (other shape, or a fingerprint other than `fingerprint`, when
    /// given).
    pub fn read(
        weights: &ModelWeights,
        path: &Path,
        fingerprint: Option<&str>,
    ) -> Result<Placement> {
        let c = &weights.config;
        let file = PlanFile::load(path, &c.neuron_counts())?;
        if let Some(fp) = fingerprint {
            let theirs = file.model_fingerprint.as_str();
            ensure!(
                theirs == fp,
                Plan,
                "{} was made for model {}, not this one ({fp}); plan again for this model",
                path.display(),
                if theirs.is_empty() {
                    "(unknown)"
                } else {
                    theirs
                }
            );
        }
        Placement::new(weights, file)
    }

    /// A plan already in memory, for `weights`: lists the device allocations the engine would
    /// make for it ([`Error::Plan`](powerinfer_core::Error::Plan) when it does not fit the
    /// model). No fingerprint or byte-count check (see [`Placement::load`]).
    ///
    /// [`Error::Unsupported`](powerinfer_core::Error::Unsupported) when it puts on the GPU a
    /// matrix in a format the GPU kernels do not take (Q2_K, Q3_K: see
    /// [`powerinfer_cuda::GPU_DTYPES`]), or hot neurons of a layer whose gate and up
    /// projections differ in format (the fused gate/up kernel reads both in one).
    pub fn new(weights: &ModelWeights, file: PlanFile) -> Result<Placement> {
        let c = &weights.config;
        file.table.check_model(&c.neuron_counts())?;
        for (i, l) in weights.layers.iter().enumerate() {
            ensure!(
                file.table.layers[i].hot.is_empty() || l.w_gate.dtype() == l.w_up.dtype(),
                Unsupported,
                "the plan puts hot neurons of layer {i} on the GPU, whose gate ({}) and up ({}) \
                 projections differ in format; the GPU's fused gate/up kernel reads one format \
                 (plan again: the planner keeps such layers on the CPU)",
                l.w_gate.dtype(),
                l.w_up.dtype()
            );
        }
        // A mixture of experts' shared expert runs whole on one side: on the GPU with the
        // layer's hot neurons (the planner puts it first), else on the CPU. (A dense layer's
        // neurons are all its own: routed and all agree.)
        for (i, l) in file.table.layers.iter().enumerate() {
            let (routed, all) = (c.layer_routed_neurons(i), c.layer_neurons(i));
            let shared = l.hot.iter().filter(|&&n| n as usize >= routed).count();
            ensure!(
                l.hot.is_empty() || shared == all - routed,
                Plan,
                "the plan puts hot neurons of layer {i} on the GPU with {shared} of its shared \
                 expert's {} neurons; a layer with hot neurons holds its whole shared expert \
                 (neurons {routed}..{all}): plan again",
                all - routed
            );
        }
        let allocations = gpu_allocations(&gpu_view(weights), &file)?;
        Ok(Placement { file, allocations })
    }

    /// [`Placement::read`], then the checks that make it safe to run:
    /// [`Error::Plan`](powerinfer_core::Error::Plan) when the plan counts other GPU bytes than
    /// the engine would allocate, [`Error::VramBudget`](powerinfer_core::Error::VramBudget)
    /// when those bytes exceed `budget` (when given).
    pub fn load(
        weights: &ModelWeights,
        path: &Path,
        fingerprint: Option<&str>,
        budget: Option<usize>,
    ) -> Result<Placement> {
        let p = Placement::read(weights, path, fingerprint)?;
        let shown = path.display();
        let engine_bytes: usize = p.allocations.iter().map(|(_, b)| b).sum();
        ensure!(
            engine_bytes == p.file.gpu_bytes,
            Plan,
            "{shown}: the plan counts {} GPU bytes but this engine would allocate {engine_bytes}; \
             plan again with this version",
            p.file.gpu_bytes
        );
        if let Some(budget) = budget {
            ensure!(
                p.file.gpu_bytes <= budget,
                VramBudget,
                "{shown} needs {} of GPU memory ({} B), more than the budget of {} ({budget} B)",
                mib(p.file.gpu_bytes),
                p.file.gpu_bytes,
                mib(budget)
            );
        }
        Ok(p)
    }

    /// The device bytes the plan needs.
    pub fn gpu_bytes(&self) -> usize {
        self.file.gpu_bytes
    }
}

/// `bytes` in MiB for messages.
fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The GPU executor's view of `w`: every matrix as loaded, `down_t` in the format the engine
/// builds it in.
pub fn gpu_view(w: &ModelWeights) -> ModelTensors<'_> {
    let layers = w
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerTensors {
            wq: l.wq.shape(),
            wk: l.wk.shape(),
            wv: l.wv.shape(),
            wo: l.wo.shape(),
            gate: l.w_gate.shape(),
            up: l.w_up.shape(),
            down_t: w.down_t_dtype(i),
            shared: l.moe.as_ref().and_then(|m| m.shared.as_ref()).map(|s| {
                let down_t = crate::transpose::transposed_dtype(&s.down);
                (&s.gate, &s.up, down_t)
            }),
        })
        .collect();
    ModelTensors {
        config: &w.config,
        layers,
        output: w.output.shape(),
    }
}
