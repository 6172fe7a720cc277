//! The CUDA device (feature `cuda`): a context and stream on one GPU, the kernel registry that
//! compiles every module with NVRTC when the device opens (a cubin for the device's compute
//! capability, through the disk cache; PTX only for a GPU newer than NVRTC) and loads it, its typed buffers ([`CudaBuffer`]), and the
//! [`Backend`] implementation: allocation (counted), copies (small ones through pinned staging,
//! see [`crate::staging`]) and launches (`cuda_launch.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr,
};
use cudarc::nvrtc::Ptx;
use powerinfer_core::{ensure, Error, Result};

use crate::backend::{Backend, Checked, DeviceSlice, Elem, Kernel};
use crate::cuda_graph::CudaGraph;
use crate::driver::driver_err;
use crate::graph::{graphs_from_env, GraphQueue, GraphStats, GRAPHS_ENV};
use crate::kernels::KernelSource;
use crate::launch_spec::LaunchSpec;
use crate::layout::{align, RowLayout};
use crate::nvrtc;
use crate::staging::{DownloadStaging, UploadStaging, STAGING_BYTES};

/// The oldest compute capability the kernels run on: sm_61 (Pascal GP10x), the first with
/// `__dp4a`, which the quantized formats' integer dots use.
pub const MIN_ARCH: u32 = 61;

// SAFETY: RowLayout is #[repr(C)] plain old data (two i64 then two i32, no padding), the same
// layout as `struct RowLayout` in common.cuh, so it can be passed to a kernel by value.
unsafe impl DeviceRepr for RowLayout {}

/// Whether the CUDA driver library (libcuda) can be loaded. Never panics.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen libcuda's candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Number of CUDA devices; 0 when there is no driver or no device. Never panics.
pub fn device_count() -> usize {
    if !driver_available() {
        return 0;
    }
    std::panic::catch_unwind(CudaContext::device_count)
        .ok()
        .and_then(|r| r.ok())
        .map_or(0, |n| n.max(0) as usize)
}

/// True when at least one CUDA device can be used.
pub fn is_available() -> bool {
    device_count() > 0
}

/// One GPU: a context, the stream every launch goes to, and the lazily loaded kernels.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

struct Inner {
    /// Launches queued for the next batch, and the graphs kept, with graphs on
    /// ([`crate::graph`]). First: dropped (the graphs destroyed) before the modules their nodes
    /// run are unloaded.
    graphs: Mutex<GraphQueue<CudaGraph>>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    arch: u32,
    name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// Bytes of the live buffers made by `zeros` (each rounded up to 256), shared with them.
    allocated: Arc<AtomicUsize>,
    /// Pinned ring for writes of at most [`STAGING_BYTES`].
    upload: Mutex<UploadStaging>,
    /// Pinned buffer for reads of at most [`STAGING_BYTES`].
    download: Mutex<DownloadStaging>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaDevice(cuda:{}, {}, sm_{})",
            self.inner.ordinal, self.inner.name, self.inner.arch
        )
    }
}

impl CudaDevice {
    /// Open GPU `ordinal`; `Error::Cuda` when the driver, or that device, is missing.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        if !driver_available() {
            return Err(Error::Cuda(
                "no CUDA driver (libcuda.so) on this machine; use device=\"cpu\"".into(),
            ));
        }
        let count = device_count();
        ensure!(
            ordinal < count,
            Cuda,
            "cuda:{ordinal} requested but {count} CUDA device(s) found"
        );
        let ctx = CudaContext::new(ordinal).map_err(driver_err("creating the CUDA context"))?;
        // SAFETY: every allocation, copy, launch and free of this device goes through its one
        // stream (`Inner::stream`), so no buffer is used on two streams and cudarc's per-use
        // events (recorded on every launch argument once a second stream exists) order nothing.
        // Called before any buffer is created, as disable_event_tracking requires.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(driver_err("creating a CUDA stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("reading the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let arch = (major * 10 + minor) as u32;
        ensure!(
            arch >= MIN_ARCH,
            Unsupported,
            "cuda:{ordinal} ({name}) is sm_{arch}; the GPU kernels need sm_{MIN_ARCH} or newer \
             (their integer dots use __dp4a): run on device=\"cpu\""
        );
        // CUDA graphs' kernel-node calls (the _v2 entry points) came with CUDA 12.0: an older
        // driver runs every kernel as its own launch, said once.
        let mut driver = 0;
        // SAFETY: an out-pointer to a local int; the driver library is loaded (driver_available).
        // A failed call leaves 0: graphs off.
        let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
        let graphs = graphs_from_env() && driver >= 12000;
        if graphs_from_env() && !graphs {
            eprintln!(
                "powerinfer-rs: {GRAPHS_ENV}=1 ignored: the CUDA driver's version ({driver}: \
                 unknown, or before 12000) lacks CUDA 12.0's graph calls"
            );
        }
        let upload = Mutex::new(UploadStaging::new(&stream)?);
        let download = Mutex::new(DownloadStaging::new(&stream)?);
        let dev = CudaDevice {
            inner: Arc::new(Inner {
                graphs: Mutex::new(GraphQueue::new(graphs)),
                ctx,
                stream,
                ordinal,
                arch,
                name,
                modules: Mutex::new(HashMap::new()),
                functions: Mutex::new(HashMap::new()),
                allocated: Arc::new(AtomicUsize::new(0)),
                upload,
                download,
            }),
        };
        // Every module now (compiled, or read from the disk cache, and loaded), so a missing
        // NVRTC or a driver that refuses the image fails here and not at the first token.
        for src in &crate::ops::SOURCES {
            dev.module(src)?;
        }
        Ok(dev)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The GPU's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Compute capability as one number (major · 10 + minor: 80, 86, 90, ...).
    pub fn compute_capability(&self) -> u32 {
        self.inner.arch
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The device's context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// Run the queued batch before a copy, an allocation or a synchronisation.
    fn submit(&self) -> Result<()> {
        self.run_batch(false, false)
    }

    /// The queued launches and the graphs kept, with graphs on ([`crate::graph`]).
    pub(crate) fn graphs(&self) -> std::sync::MutexGuard<'_, GraphQueue<CudaGraph>> {
        lock(&self.inner.graphs)
    }

    /// Queue `spec` for the next batch when graphs are on; else hand it back to launch now.
    pub(crate) fn queue(&self, spec: LaunchSpec) -> Option<LaunchSpec> {
        lock(&self.inner.graphs).queue(spec)
    }

    /// Make this device's context current on the calling thread (raw driver calls need it).
    pub(crate) fn bind(&self) -> Result<()> {
        self.inner
            .ctx
            .bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))
    }

    /// The kernel `entry` of module `src`, compiling and loading the module on first use.
    pub(crate) fn function(&self, src: &KernelSource, entry: &str) -> Result<CudaFunction> {
        let key = format!("{}::{entry}", src.name);
        if let Some(f) = lock(&self.inner.functions).get(&key) {
            return Ok(f.clone());
        }
        let module = self.module(src)?;
        let f = module
            .load_function(entry)
            .map_err(driver_err(&format!("loading kernel {key}")))?;
        lock(&self.inner.functions).insert(key, f.clone());
        Ok(f)
    }

    fn module(&self, src: &KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = lock(&self.inner.modules).get(src.name) {
            return Ok(m.clone());
        }
        // Compiled outside the lock: NVRTC takes a while, and two threads racing here only cost
        // one redundant compile.
        let image = nvrtc::compile_cached(src.name, &src.program(), self.inner.arch)?;
        let kind = image.describe();
        let code = match image {
            nvrtc::Image::Cubin { data, .. } => Ptx::from_binary(data),
            nvrtc::Image::Ptx { text, .. } => Ptx::from_src(text),
        };
        let module = self.inner.ctx.load_module(code).map_err(|e| {
            let hint = if e.0 == CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                " (the NVRTC library is newer than the GPU driver: update the driver or use an \
                 NVRTC no newer than the driver's CUDA version)"
            } else {
                ""
            };
            Error::Cuda(format!("loading module {} ({kind}): {e:?}{hint}", src.name))
        })?;
        Ok(lock(&self.inner.modules)
            .entry(src.name)
            .or_insert(module)
            .clone())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A buffer of `len` elements of `T` in one device's memory (f32 activations, i32 indices and
/// flags, u16 f16 KV cache, u8 weight bytes); freed, and uncounted, on drop.
pub struct CudaBuffer<T> {
    pub(crate) data: CudaSlice<T>,
    len: usize,
    /// Bytes counted in the device's total (len · size rounded up to 256).
    counted: usize,
    allocated: Arc<AtomicUsize>,
    ctx: Arc<CudaContext>,
}

impl<T> DeviceSlice for CudaBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
}

impl<T> Drop for CudaBuffer<T> {
    fn drop(&mut self) {
        // The free that follows (cudarc's drop of `data`) runs in this thread's current
        // context: make it this buffer's, whichever device this thread used last.
        let _ = self.ctx.bind_to_thread();
        self.allocated.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

impl<T> std::fmt::Debug for CudaBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBuffer<{}>({})",
            std::any::type_name::<T>(),
            self.len
        )
    }
}

/// `values` as bytes.
fn as_bytes<T: Elem>(values: &[T]) -> &[u8] {
    // SAFETY: Elem is sealed to f32, i32, u16 and u8: no padding, so every byte of the slice is
    // initialised, and u8 has alignment 1; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// `values` as writable bytes.
fn as_bytes_mut<T: Elem>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; moreover every bit pattern is a valid f32, i32, u16 or u8, so
    // any bytes written leave valid values.
    unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values))
    }
}

/// Error unless `[at, at + n)` lies inside a buffer of `len` elements.
fn check_range(at: usize, n: usize, len: usize, what: &str) -> Result<()> {
    ensure!(
        at.checked_add(n).is_some_and(|end| end <= len),
        Shape,
        "{what} {n} values at {at} of a device buffer of {len}"
    );
    Ok(())
}

impl Backend for CudaDevice {
    type Buf<T: Elem> = CudaBuffer<T>;

    fn describe(&self) -> String {
        format!(
            "cuda:{} ({}, sm_{})",
            self.inner.ordinal, self.inner.name, self.inner.arch
        )
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.inner
            .ctx
            .mem_get_info()
            .map_err(driver_err("reading device memory"))
    }

    /// Always `Some`: every buffer made by `zeros` is counted until dropped.
    fn allocated_bytes(&self) -> Option<usize> {
        Some(self.inner.allocated.load(Ordering::Relaxed))
    }

    fn zeros<T: Elem>(&self, len: usize) -> Result<CudaBuffer<T>> {
        self.submit()?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Shape(format!("{len} elements overflow")))?;
        let data = self
            .stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(|e| match e.0 {
                CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::VramBudget(format!(
                    "{}: out of device memory allocating {bytes} bytes",
                    self.describe()
                )),
                _ => driver_err("allocating device memory")(e),
            })?;
        let counted = align(bytes);
        self.inner.allocated.fetch_add(counted, Ordering::Relaxed);
        Ok(CudaBuffer {
            data,
            len,
            counted,
            allocated: self.inner.allocated.clone(),
            ctx: self.inner.ctx.clone(),
        })
    }

    /// Writes of at most [`STAGING_BYTES`] are staged in pinned memory and return without
    /// waiting for the copy; larger ones copy from `host` directly. Either way `host` may be
    /// reused when this returns, and the copy runs in stream order (after earlier launches,
    /// before later ones).
    fn write<T: Elem>(&self, host: &[T], dst: &mut CudaBuffer<T>, at: usize) -> Result<()> {
        check_range(at, host.len(), dst.len, "writing")?;
        self.submit()?;
        if host.is_empty() {
            return Ok(());
        }
        let stream = self.stream();
        let mut view = dst.data.slice_mut(at..at + host.len());
        let bytes = as_bytes(host);
        if bytes.len() > STAGING_BYTES {
            return stream
                .memcpy_htod(host, &mut view)
                .map_err(driver_err("copying to the device"));
        }
        let (ptr, _record) = view.device_ptr_mut(stream);
        // SAFETY: `ptr` addresses host.len() elements (bytes.len() bytes) of `dst`, checked
        // above, in this device's context; `dst` is borrowed mutably, and a buffer is freed
        // only on drop, in stream order after this copy.
        unsafe { lock(&self.inner.upload).write(bytes, ptr) }
    }

    /// Reads of at most [`STAGING_BYTES`] go through pinned memory; all queued work finishes
    /// first either way.
    fn read<T: Elem>(&self, src: &CudaBuffer<T>, at: usize, out: &mut [T]) -> Result<()> {
        check_range(at, out.len(), src.len, "reading")?;
        self.submit()?;
        if out.is_empty() {
            return self.synchronize();
        }
        let stream = self.stream();
        let view = src.data.slice(at..at + out.len());
        if std::mem::size_of_val(out) > STAGING_BYTES {
            stream
                .memcpy_dtoh(&view, out)
                .map_err(driver_err("copying from the device"))?;
            return self.synchronize();
        }
        let (ptr, _record) = view.device_ptr(stream);
        // SAFETY: `ptr` addresses out.len() elements of `src` (checked above) in this device's
        // context, and `src` stays borrowed until the read has waited for the copy.
        unsafe { lock(&self.inner.download).read(ptr, as_bytes_mut(out)) }
    }

    fn synchronize(&self) -> Result<()> {
        self.submit()?;
        self.inner
            .stream
            .synchronize()
            .map_err(driver_err("synchronizing the stream"))
    }

    fn launch<K: Kernel<Self>>(&self, kernel: K, _checked: Checked) -> Result<()> {
        self.launch_kernel(kernel)
    }

    /// The queued batch as a graph ([`crate::graph`]), with graphs on.
    fn flush(&self) -> Result<()> {
        self.run_batch(true, false)
    }

    fn begin_step(&self) -> Result<()> {
        self.run_batch(false, true)
    }

    fn graph_stats(&self) -> Option<GraphStats> {
        let q = lock(&self.inner.graphs);
        q.on().then(|| q.stats())
    }

    fn addr<T: Elem>(&self, buf: &CudaBuffer<T>) -> u64 {
        // Event tracking is off (see `new`): the guard records nothing when dropped.
        buf.data.device_ptr(self.stream()).0
    }

    fn addr_mut<T: Elem>(&self, buf: &mut CudaBuffer<T>) -> u64 {
        buf.data.device_ptr_mut(self.stream()).0
    }
}
