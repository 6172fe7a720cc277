//! The GPU backend interface: what the hybrid executor needs of a GPU, implemented twice — by
//! [`CudaDevice`](crate::CudaDevice) (cudarc, the kernels of `kernels/*.cu` compiled by NVRTC)
//! and by [`HostBackend`](crate::HostBackend) (always built: buffers in host memory, every
//! kernel's contract in plain Rust), so that everything but the kernels themselves runs and is
//! tested on machines without a GPU (`device="gpu-sim"`).
//!
//! A backend provides typed buffers, copies in and out, and one entry point, [`Backend::launch`],
//! taking any [`Kernel`]: a struct per `extern "C"` kernel, its fields the kernel's parameters
//! in order, which knows its entry name, its launch (grid, shared memory, packed arguments) and
//! its contract on host memory. The kernels live with their family in `crate::ops::<family>`,
//! and launches are made only by that family's checked operations (the `*Ops` traits every
//! backend gets, [`crate::ops::prelude`]), which validate shapes on the host first: a
//! [`Checked`] token, constructible only inside this crate, proves it. This file knows no
//! family.

use powerinfer_core::{DType, Result};

use crate::launch_spec::LaunchSpec;
use crate::layout::{RowLayout, SlabLayout};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// What a CUDA buffer's element type must be (cudarc's plain-old-data traits); nothing without
/// the `cuda` feature.
#[cfg(feature = "cuda")]
pub trait CudaRepr: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
#[cfg(feature = "cuda")]
impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> CudaRepr for T {}
/// What a CUDA buffer's element type must be; nothing without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub trait CudaRepr {}
#[cfg(not(feature = "cuda"))]
impl<T> CudaRepr for T {}

/// Element types a device buffer holds: f32 activations (and f32 KV caches), i32 indices and
/// flags, u16 (f16 bits) KV caches, u8 weight bytes.
pub trait Elem:
    sealed::Sealed + CudaRepr + Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
}
impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for u16 {}
impl Elem for u8 {}

/// A typed buffer of a backend: `len` elements.
pub trait DeviceSlice: Send + Sync {
    /// Elements.
    fn len(&self) -> usize;
    /// True when it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Proof that a launch's arguments were checked by [`crate::ops`]; only this crate makes one.
#[derive(Clone, Copy, Debug)]
pub struct Checked(pub(crate) ());

/// A GPU as the executor sees it.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A buffer of `T` in this backend's memory.
    type Buf<T: Elem>: DeviceSlice;

    /// Names the device for messages and reports: "cuda:0 (NVIDIA H200, sm_90)", "gpu-sim".
    fn describe(&self) -> String;

    /// (free, total) device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;

    /// Bytes this backend has allocated and not yet freed, each allocation rounded up to 256
    /// bytes as the plan counts them, when the backend keeps count (the host backend does).
    fn allocated_bytes(&self) -> Option<usize>;

    /// A zero-filled buffer of `len` elements; `Error::VramBudget` when it does not fit.
    fn zeros<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;

    /// Copy `host` into `dst[at..at + host.len()]` (queued after earlier work; `host` may be
    /// reused as soon as this returns).
    fn write<T: Elem>(&self, host: &[T], dst: &mut Self::Buf<T>, at: usize) -> Result<()>;

    /// Copy `src[at..at + out.len()]` into `out`, after all queued work has finished.
    fn read<T: Elem>(&self, src: &Self::Buf<T>, at: usize, out: &mut [T]) -> Result<()>;

    /// Wait until all queued work has finished.
    fn synchronize(&self) -> Result<()>;

    /// Queue one kernel launch whose arguments [`crate::ops`] has checked.
    fn launch<K: Kernel<Self>>(&self, kernel: K, checked: Checked) -> Result<()>;

    /// The address a kernel receives for `buf` (a device pointer; for the backends in host
    /// memory, the host address of its first element), for a buffer the kernel only reads.
    fn addr<T: Elem>(&self, buf: &Self::Buf<T>) -> u64;

    /// [`Backend::addr`] of a buffer the kernel writes.
    fn addr_mut<T: Elem>(&self, buf: &mut Self::Buf<T>) -> u64;

    /// Launches so far by kernel entry, when the backend counts them (the emulator does).
    fn kernel_launches(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        None
    }

    /// Run the launches queued since the host last interacted with the device, where the
    /// backend batches them into graphs ([`crate::graph`]; a copy, an allocation or
    /// [`Backend::synchronize`] does it too); nothing elsewhere. The executor calls it before
    /// CPU work that should overlap the queued GPU work.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// A decode step begins: what is queued runs, and batches are numbered from 0 again (graphs
    /// are kept per number).
    fn begin_step(&self) -> Result<()> {
        Ok(())
    }

    /// The counters of the launch batches run as graphs, where the backend batches and graphs
    /// are on.
    fn graph_stats(&self) -> Option<crate::graph::GraphStats> {
        None
    }
}

/// One kernel launch with its arguments: a struct per `extern "C"` entry of `kernels/*.cu`, or
/// per group of entries with the same parameters (in `crate::ops::<family>::launch`), its fields
/// the kernel's parameters in order (per-format kernels take the weight format as `dtype`, the
/// KV-cache kernels one layer's two caches, whose element type picks the entry, and a group the
/// field that names its member; lengths as `usize`). The meaning of each is the comment above
/// the kernel in its `.cu` file and on its struct; [`Kernel::host`] implements exactly that.
pub trait Kernel<B: Backend>: Sized {
    /// The kernel's entry name, e.g. "sparse_matvec_q4_0" (for messages and the launch tests).
    fn entry(&self) -> String;

    /// What the launch does besides its own kernel's work, for the launch counts the tests read
    /// (the emulator's [`Backend::kernel_launches`]): "quantize_x (in rms_norm)" for a norm
    /// that quantizes its output in the same launch, and the like.
    fn fused(&self) -> Option<&'static str> {
        None
    }

    /// Its module, entry, grid, block, dynamic shared bytes and packed arguments, the buffers
    /// as `dev`'s addresses: what a GPU launches and the emulator runs.
    fn spec(self, dev: &B) -> Result<LaunchSpec>;

    /// The kernel's contract in plain Rust, on a backend in host memory (`device="gpu-sim"`):
    /// whatever the CUDA kernel would fault on (indices out of range, short buffers) is
    /// `Error::Shape`, never a panic.
    fn host(self) -> Result<()>
    where
        B: HostMem;
}

/// Declares one kernel's launch struct (its fields the kernel's parameters in order, all public)
/// and its [`Kernel`] implementation from what differs per kernel: the entry name (a name, or
/// an expression of the struct), what it fuses (optional), its spec (given the struct, the
/// device and empty [`KernelArgs`](crate::launch_spec::KernelArgs) to pack) and its host
/// contract, each given the struct by a name of the caller's.
///
/// ```ignore
/// kernel! {
///     /// `fill`: `y[i] = v`.
///     struct Fill<'a, B> { y: &'a mut B::Buf<f32>, n: usize, v: f32 }
///     entry = "fill";
///     spec(k, dev, a) { /* a.ptr(..)...; the LaunchSpec of k on dev */ }
///     host(k) { /* the contract on B::data_mut(k.y) */ }
/// }
/// ```
macro_rules! kernel {
    (
        $(#[$doc:meta])*
        struct $name:ident<$lt:lifetime, $b:ident> {
            $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)?
        }
        entry $(($es:pat))? = $entry:expr;
        $( fused($fs:pat) $fused:expr; )?
        spec($ss:pat, $dev:ident, $args:ident) $spec:block
        host($hs:pat) $host:block
    ) => {
        $(#[$doc])*
        pub struct $name<$lt, $b: $crate::backend::Backend> {
            $( $(#[$fdoc])* pub $field: $ty, )*
        }

        impl<$lt, $b: $crate::backend::Backend> $crate::backend::Kernel<$b> for $name<$lt, $b> {
            fn entry(&self) -> String {
                $( let $es = self; )?
                String::from($entry)
            }

            $(
                fn fused(&self) -> Option<&'static str> {
                    let $fs = self;
                    $fused
                }
            )?

            fn spec(self, $dev: &$b) -> powerinfer_core::Result<$crate::launch_spec::LaunchSpec> {
                let $ss = self;
                let mut $args = $crate::launch_spec::KernelArgs::default();
                $spec
            }

            fn host(self) -> powerinfer_core::Result<()>
            where
                $b: $crate::backend::HostMem,
            {
                let $hs = self;
                $host
            }
        }
    };
}
pub(crate) use kernel;

/// A backend whose buffers are host memory (the host backend): the elements of
/// a buffer as a slice, for the kernels' host contracts ([`Kernel::host`]).
pub trait HostMem: Backend {
    /// The elements of `buf`.
    fn data<T: Elem>(buf: &Self::Buf<T>) -> &[T];

    /// The elements of `buf`, to write.
    fn data_mut<T: Elem>(buf: &mut Self::Buf<T>) -> &mut [T];
}

/// A weight matrix in a backend's memory.
pub struct DeviceWeight<B: Backend> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub layout: RowLayout,
    pub data: B::Buf<u8>,
}

impl<B: Backend> DeviceWeight<B> {
    /// Device bytes.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}

/// One layer's hot neurons in a backend's memory, in slabs ([`crate::pack_hot_slabs`]).
pub struct HotFfn<B: Backend> {
    pub layout: SlabLayout,
    pub data: B::Buf<u8>,
}

impl<B: Backend> HotFfn<B> {
    /// Device bytes (== `layout.total_bytes()`).
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}
