//! The hybrid CPU+GPU executor (PowerInfer's decode loop): the plan puts attention, predictors
//! and hot neurons on a GPU; per layer of a decode step the GPU computes its part while the CPU
//! computes the cold neurons that fire, and the two halves meet once. Both sides walk the same
//! layer program ([`crate::layer`]), so every family the CPU engine runs runs here too: every
//! step has a GPU op (`powerinfer_cuda::ops`), matched exhaustively in the executor, so a new
//! step cannot reach a GPU without one. It is generic over the
//! GPU backend, so the same code runs on `device="cuda"`, on `device="gpu-emu"` (the real
//! kernels run on the CPU by the emulator, feature `emu`) and on `device="gpu-sim"` (each
//! kernel's contract in plain Rust), where all of it is tested without a GPU.
//!
//! Batched passes (prefill, scoring, profiling) stay on the CPU; their K/V rows are uploaded to
//! the GPU layers' caches before the next decode step ([`kv_sync`]).

pub mod api;
pub mod attention;
pub mod executor;
pub mod experts;
pub mod ffn_pass;
pub mod gpu_model;
pub mod knobs;
pub mod kv_sync;
pub mod mirrored;
pub mod output;
pub mod phase_clock;
pub mod quantized_x;
pub mod transfers;

use std::sync::Arc;

use powerinfer_core::{bail, ensure, Device, Result};
use powerinfer_cuda::HostBackend;

use crate::kv_cache::KvTypes;
use crate::placement::Placement;
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

use api::refuse_cpu_only;
pub use api::Hybrid;
pub use executor::Executor;
pub use phase_clock::{HybridPhase, PhaseStats};
pub use transfers::{TransferStats, Transfers};

/// Open `device` and upload what `placement` puts on it. `capacity` limits the device memory
/// the plan may use (the VRAM budget; for "gpu-sim" also the simulated device's size).
/// [`Error::VramBudget`](powerinfer_core::Error::VramBudget) when the plan needs more than the
/// device has free or the budget allows; [`Error::Plan`](powerinfer_core::Error::Plan) for a
/// plan that puts nothing on the GPU.
pub fn open(
    device: Device,
    model: &ModelWeights,
    placement: Arc<Placement>,
    mode: &Sparsity,
    kv: KvTypes,
    capacity: Option<usize>,
) -> Result<Box<dyn Hybrid>> {
    ensure!(
        !kv.is_quantized() && kv.k == kv.v,
        Unsupported,
        "a {} KV cache on the hybrid executor (device {device}): its GPU attention reads f16 or \
         f32 caches, keys and values alike; run it with kv_cache=\"f16\", or on device=\"cpu\"",
        kv.name()
    );
    let planned = placement.file.kv_cache;
    ensure!(
        planned == kv || !placement.file.attention.iter().any(|&a| a),
        Plan,
        "the plan sizes its GPU KV caches for {} values and this engine holds {}: pass \
         kv_cache=\"{}\", or plan again with --kv-cache {}",
        planned.name(),
        kv.name(),
        planned.name(),
        kv.name()
    );
    ensure!(
        placement.file.uses_gpu(),
        Plan,
        "the plan puts nothing on the GPU; run it with device=\"cpu\""
    );
    model.config.refuse_non_flat("the GPU hybrid")?;
    refuse_cpu_only(mode, model.config.moe.is_moe())?;
    crate::device::check_available(device)?;
    match device {
        Device::Cpu => bail!(Plan, "the CPU device runs no plan's GPU side"),
        Device::GpuSim => {
            let dev = match capacity {
                Some(bytes) => HostBackend::with_capacity(bytes),
                None => HostBackend::new(),
            };
            build(dev, model, placement, mode, capacity)
        }
        #[cfg(feature = "emu")]
        Device::GpuEmu => build(
            powerinfer_cuda::EmuBackend::new(capacity),
            model,
            placement,
            mode,
            capacity,
        ),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => build(
            powerinfer_cuda::CudaDevice::new(n)?,
            model,
            placement,
            mode,
            capacity,
        ),
        // What this build lacks, `check_available` refused above.
        #[allow(unreachable_patterns)]
        _ => bail!(Other, "{device}: not in this build"),
    }
}

fn build<B: powerinfer_cuda::Backend>(
    dev: B,
    model: &ModelWeights,
    placement: Arc<Placement>,
    mode: &Sparsity,
    capacity: Option<usize>,
) -> Result<Box<dyn Hybrid>> {
    let need = placement.file.gpu_bytes;
    let (free, total) = dev.mem_info()?;
    let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
    if let Some(budget) = capacity {
        ensure!(
            need <= budget,
            VramBudget,
            "the plan needs {:.1} MiB of GPU memory, more than the budget of {:.1} MiB",
            mib(need),
            mib(budget)
        );
    }
    if need > free {
        bail!(
            VramBudget,
            "the plan needs {:.1} MiB of GPU memory but {} has {:.1} MiB free (of {:.1} MiB); \
             plan again with a smaller --vram-budget",
            mib(need),
            dev.describe(),
            mib(free),
            mib(total)
        );
    }
    let mut ex = Executor::new(dev, model, placement)?;
    ex.set_mode(mode)?;
    Ok(Box::new(ex))
}
