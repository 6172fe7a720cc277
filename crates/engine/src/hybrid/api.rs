//! What a session sees of a hybrid executor, whatever its backend: the [`Hybrid`] trait, and
//! the sparsity modes every way into the executor refuses before any work
//! ([`refuse_cpu_only`]). Below the executor and [`open`](super::open), which both build on it.

use powerinfer_core::Result;
use powerinfer_cuda::Allocation;

use crate::hybrid::phase_clock::PhaseStats;
use crate::hybrid::transfers::TransferStats;
use crate::kv_cache::KvCache;
use crate::modes::{refuse, Place};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// A hybrid executor on some backend, as a session holds it.
pub trait Hybrid: Send {
    /// The device, e.g. "gpu-sim" or "cuda:0 (NVIDIA H200, sm_90)".
    fn describe(&self) -> String;
    /// Every device allocation made, `(name, bytes)`, in order.
    fn allocations(&self) -> &[Allocation];
    /// Bytes the backend counts as allocated, when it counts.
    fn allocated_bytes(&self) -> Option<usize>;
    /// Kernel launches so far by entry name, when the backend counts them (the emulator does).
    fn kernel_launches(&self) -> Option<std::collections::BTreeMap<String, u64>>;
    /// The counters of the launch batches run as graphs, with graphs on (the CUDA device and the
    /// emulator batch; `powerinfer_cuda::graph`).
    fn graph_stats(&self) -> Option<powerinfer_cuda::graph::GraphStats>;
    /// (free, total) device memory.
    fn mem_info(&self) -> Result<(usize, usize)>;
    /// Transfers so far.
    fn transfers(&self) -> &TransferStats;
    /// Each decode step's wall time by layer and phase, since the last reset.
    fn phases(&self) -> &PhaseStats;
    /// Zero the transfer counts and the phase times.
    fn reset_transfers(&mut self);
    /// Adopt a sparsity mode (predictor mode writes the predictors into their GPU buffers).
    fn set_mode(&mut self, mode: &Sparsity) -> Result<()>;
    /// One token at position `cache.len()`: its logits (vocab); the cache grows by one.
    fn decode(
        &mut self,
        model: &ModelWeights,
        mode: &Sparsity,
        cache: &mut KvCache,
        token: u32,
    ) -> Result<Vec<f32>>;
    /// Bring the CPU cache's rows of GPU layers up to date before a batched CPU pass.
    fn before_cpu_pass(&mut self, cache: &mut KvCache) -> Result<()>;
    /// A CPU pass left `len` positions in the cache, every layer's rows written on the CPU.
    fn after_cpu_pass(&mut self, len: usize);
    /// The context was cut to `len` positions.
    fn truncate(&mut self, len: usize);
}

/// Refuse the modes the GPU side does not run (the `gpu` column of [`crate::modes::MODE_TABLE`],
/// and for a mixture of experts, `moe`, its `moe_gpu` column). Every way into the hybrid
/// executor asks this first (opening it, and the session switching the mode of an open one),
/// before any work.
pub(crate) fn refuse_cpu_only(mode: &Sparsity, moe: bool) -> Result<()> {
    refuse(mode.mode(), Place::Gpu)?;
    if moe {
        refuse(mode.mode(), Place::MoeGpu)?;
    }
    Ok(())
}
