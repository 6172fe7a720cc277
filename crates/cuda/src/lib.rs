//! The CUDA side of powerinfer-rs: our own CUDA C kernels for the work the plan puts on the GPU
//! (row-sparse gate/up over the hot neurons' slabs, accumulation over their down_t rows, the
//! activation predictor, RMSNorm, LayerNorm, RoPE, decode attention over an f16 or f32 KV cache,
//! elementwise ops, a mixture of experts' routing), compiled by NVRTC to cubins for the
//! device's architecture when a device is opened (cached on disk) and launched through cudarc.
//!
//! The executor sees a GPU through [`Backend`] (typed buffers, copies, one checked launch entry
//! taking any [`Kernel`]) and the operations of [`ops`]: one folder per kernel family, each with
//! its `*Ops` trait (every operation, shape-checked once for all backends;
//! [`ops::prelude`] brings them all), its kernels' launches and their contracts on host memory.
//! [`CudaDevice`] implements [`Backend`] with the kernels; [`HostBackend`] (always built) runs
//! every kernel's host contract, for `device="gpu-sim"` and tests without a GPU.
//!
//! libcuda (cudarc, dynamic loading) and libnvrtc (our loader in `nvrtc`, CUDA 12 or 13) are
//! opened only when a device is requested, so a build with the `cuda` feature still runs
//! everywhere, and [`CudaDevice::new`] returns `Error::Cuda` where there is no driver or GPU.
//! Without the feature, the device queries answer "none" and `CudaDevice::new` returns
//! `Error::Unsupported` ("built without CUDA"); `CudaDevice` is then no backend.
//!
//! Kernel sources live in `kernels/*.cu` (one per op family, see [`ops::SOURCES`]); host-side
//! layouts shared by both builds (row addressing, hot-neuron slabs) in [`layout`], and the list
//! of device allocations a plan implies (the engine's side of the VRAM accounting) in
//! [`alloc_plan`].

pub mod alloc_plan;
pub mod backend;
pub mod convert;
pub mod graph;
pub mod host;
pub mod kernels;
pub mod launch_spec;
pub mod layout;
pub mod ops;
pub mod repack;

#[cfg(feature = "emu")]
pub mod emu;

#[cfg(feature = "cuda")]
mod cuda_graph;
#[cfg(feature = "cuda")]
mod cuda_launch;
#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod driver;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod staging;
#[cfg(not(feature = "cuda"))]
mod stub;

#[cfg(feature = "cuda")]
pub use device::{device_count, driver_available, is_available, CudaBuffer, CudaDevice};
#[cfg(not(feature = "cuda"))]
pub use stub::{device_count, driver_available, is_available, CudaDevice};

pub use alloc_plan::{gpu_allocations, Allocation, LayerTensors, ModelTensors};
pub use backend::{Backend, Checked, DeviceSlice, DeviceWeight, Elem, HostMem, HotFfn, Kernel};
pub use convert::{device_dtype, device_rows, is_converted};
#[cfg(feature = "emu")]
pub use emu::{emu_entries, EmuBackend, GPU_EMU};
pub use host::{HostBackend, HostBuf};
pub use kernels::{is_gpu_dtype, GPU_DTYPES};
pub use layout::{
    align, pack_hot_rows, pack_hot_slabs, slab_bytes, slab_geometry, Act, AttnParams, FfnAct,
    RowLayout, RowSpace, SlabGeometry, SlabLayout, MAX_HEAD_DIM, MAX_RANK, MAX_X_BYTES, XQ_BLOCK,
};
pub use ops::attention::{KvCaches, KvCachesMut, KvElem};
pub use ops::axpy::{down_splits, live_splits, part_len, SPLIT_ROWS};
pub use ops::compact::Compacted;
pub use ops::norm_rope::{QkNorms, MAX_ROPE_PAIRS};
pub use ops::rows::{XArg, XIn};
pub use repack::{is_repacked, repack_rows, unpack_row};

/// True when this build can drive a GPU (the `cuda` feature); a device may still be absent.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");
/// True when this build has the emulator (`device="gpu-emu"`, the `emu` feature).
pub const BUILT_WITH_EMU: bool = cfg!(feature = "emu");
/// The sanitizer the emulator's kernels were built under (`POWERINFER_EMU_SANITIZE` at build
/// time: "address" or "thread"; `benchmarks/gpu/emu.sh --sanitize`), None for a plain build or
/// one without the emulator. The kernel tests size their sanitized runs by it.
pub const EMU_SANITIZER: Option<&str> = match option_env!("POWERINFER_EMU_SANITIZER") {
    Some(s) if !s.is_empty() => Some(s),
    _ => None,
};
