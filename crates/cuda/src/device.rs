//! The CUDA device (feature `cuda`): a context and stream on one GPU, the kernel registry that
//! compiles each module with NVRTC on first use (for the device's compute capability, through
//! the PTX disk cache) and loads it lazily, device buffers, and weight uploads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, DriverError,
};
use cudarc::nvrtc::Ptx;
use powerinfer_core::{ensure, DType, Error, Result, Weight};

use crate::kernels::KernelSource;
use crate::layout::{pack_hot_slabs, parse_device, RowLayout, SlabLayout};
use crate::nvrtc;
use crate::DeviceElem;

// SAFETY: RowLayout is #[repr(C)] plain old data (two i64 then two i32, no padding), the same
// layout as `struct RowLayout` in common.cuh, so it can be passed to a kernel by value.
unsafe impl DeviceRepr for RowLayout {}

/// Map a driver error to `Error::Cuda`, saying what was being done.
pub(crate) fn driver_err(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

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
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    arch: u32,
    name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
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
        Ok(CudaDevice {
            inner: Arc::new(Inner {
                ctx,
                stream,
                ordinal,
                arch: (major * 10 + minor) as u32,
                name,
                modules: Mutex::new(HashMap::new()),
                functions: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Open a device by name: "cuda" (= "cuda:0") or "cuda:N".
    pub fn from_name(name: &str) -> Result<CudaDevice> {
        CudaDevice::new(parse_device(name)?)
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

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.inner
            .ctx
            .mem_get_info()
            .map_err(driver_err("reading device memory"))
    }

    /// Wait until every launch on this device's stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner
            .stream
            .synchronize()
            .map_err(driver_err("synchronizing the stream"))
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
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
        let ptx = nvrtc::compile_cached(src.name, &src.program(), self.inner.arch)?;
        let module = self
            .inner
            .ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| {
                let hint = if e.0
                    == cudarc::driver::sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                {
                    " (the NVRTC library is newer than the GPU driver: update the driver or use an \
                 NVRTC no newer than the driver's CUDA version)"
                } else {
                    ""
                };
                Error::Cuda(format!("loading module {}: {e:?}{hint}", src.name))
            })?;
        Ok(lock(&self.inner.modules)
            .entry(src.name)
            .or_insert(module)
            .clone())
    }

    /// A zero-filled device buffer of `len` elements.
    pub fn zeros<T: DeviceElem>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let data = self
            .stream()
            .alloc_zeros::<T>(len.max(1))
            .map_err(driver_err("allocating device memory"))?;
        Ok(DeviceBuffer { data, len })
    }

    /// Copy `host` to a new device buffer.
    pub fn upload<T: DeviceElem>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        let mut buf = self.zeros::<T>(host.len())?;
        self.write(host, &mut buf)?;
        Ok(buf)
    }

    /// Copy `host` into the start of `dst` (which must be at least as long).
    pub fn write<T: DeviceElem>(&self, host: &[T], dst: &mut DeviceBuffer<T>) -> Result<()> {
        ensure!(
            host.len() <= dst.len,
            Shape,
            "writing {} values into a device buffer of {}",
            host.len(),
            dst.len
        );
        if host.is_empty() {
            return Ok(());
        }
        let mut view = dst.data.slice_mut(0..host.len());
        self.stream()
            .memcpy_htod(host, &mut view)
            .map_err(driver_err("copying to the device"))
    }

    /// Copy a device buffer back (waits for the stream).
    pub fn download<T: DeviceElem>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let mut out = vec![T::default(); src.len];
        if src.len > 0 {
            self.stream()
                .memcpy_dtoh(&src.data.slice(0..src.len), &mut out)
                .map_err(driver_err("copying from the device"))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// Upload a whole weight matrix (rows as stored).
    pub fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight> {
        let all: Vec<u32> = (0..w.rows as u32).collect();
        self.upload_rows(w, &all)
    }

    /// Upload rows `ids` of `w` (in that order) as a compact matrix: row k on the device is row
    /// ids[k] of `w`.
    pub fn upload_rows(&self, w: &Weight, ids: &[u32]) -> Result<DeviceWeight> {
        let rb = w.dtype.row_bytes(w.cols)?;
        ensure!(
            w.n_bytes() == rb * w.rows,
            Shape,
            "{} weight of {} x {} has {} bytes",
            w.dtype,
            w.rows,
            w.cols,
            w.n_bytes()
        );
        let mut bytes = Vec::with_capacity(rb * ids.len());
        for &i in ids {
            ensure!((i as usize) < w.rows, Shape, "row {i} of {} rows", w.rows);
            bytes.extend_from_slice(w.row(i as usize));
        }
        Ok(DeviceWeight {
            dtype: w.dtype,
            rows: ids.len(),
            cols: w.cols,
            layout: RowLayout::dense(ids.len(), rb)?,
            data: self.upload(&bytes)?,
        })
    }

    /// Pack one layer's hot neurons into slabs of `bucket` (see [`crate::pack_hot_slabs`]) and
    /// upload them: exactly `n_slabs · slab_bytes` bytes, the plan's `ffn_hot`.
    pub fn upload_hot_ffn(
        &self,
        gate: &Weight,
        up: &Weight,
        down_t: &Weight,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn> {
        let (layout, bytes) = pack_hot_slabs(gate, up, down_t, ids, bucket)?;
        Ok(HotFfn {
            layout,
            data: self.upload(&bytes)?,
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A device allocation of `len` elements of `T` (f32 activations, i32 indices/flags, u16 f16 KV
/// cache, u8 weight bytes).
pub struct DeviceBuffer<T> {
    pub(crate) data: CudaSlice<T>,
    pub(crate) len: usize,
}

impl<T> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({})",
            std::any::type_name::<T>(),
            self.len
        )
    }
}

/// A weight matrix in device memory.
#[derive(Debug)]
pub struct DeviceWeight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub layout: RowLayout,
    pub(crate) data: DeviceBuffer<u8>,
}

impl DeviceWeight {
    /// Device bytes.
    pub fn n_bytes(&self) -> usize {
        self.data.len
    }
}

/// One layer's hot neurons in device memory, in slabs.
#[derive(Debug)]
pub struct HotFfn {
    pub layout: SlabLayout,
    pub(crate) data: DeviceBuffer<u8>,
}

impl HotFfn {
    /// Device bytes (== `layout.total_bytes()`).
    pub fn n_bytes(&self) -> usize {
        self.data.len
    }
}
