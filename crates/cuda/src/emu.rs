//! The emulator backend (`device="gpu-emu"`, feature `emu`): the real kernels of
//! `kernels/*.cu`, compiled for the host by `build.rs` after `emu/cuda_emu.h`, run on the CPU
//! by `emu/emu_runtime.cpp`, each CUDA thread a fiber on the launching OS thread. Buffers live in host memory (each its own exact-size
//! allocation, accounted as the plan counts device memory, like the host backend's), and every
//! launch goes through the same [`LaunchSpec`] as a GPU launch:
//! the kernel is called through the `void**` argument array `cuLaunchKernel` would receive,
//! after the emulator has checked the count and byte width of every argument against the
//! kernel's declared parameters.
//!
//! It is slow (one core does every CUDA thread's work) and meant for tests and for checking a plan's kernels
//! without a GPU; under `benchmarks/gpu/emu.sh --sanitize address|thread` the same launches run
//! under the sanitizers. With graphs on ([`crate::graph::GRAPHS_ENV`]) it batches launches as
//! the CUDA device does, and its "graph" is the list of launches the batch was built from with
//! the changed ones patched in as a CUDA graph's nodes are updated: a replay runs that list, not
//! the batch, so a change the bookkeeping missed runs stale arguments here too. What it cannot
//! show: PTX and the driver, streams and events, the CUDA graph calls, whether GPU work
//! overlaps CPU work, the GPU's weak memory ordering and speed.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Mutex;

use powerinfer_core::{Error, Result};

use crate::backend::{Backend, Checked, Elem, Kernel};
use crate::graph::{graphs_from_env, GraphQueue, GraphRunner, GraphStats};
use crate::host::{HostBackend, HostBuf};
use crate::launch_spec::LaunchSpec;

extern "C" {
    fn powerinfer_emu_launch(
        entry: *const c_char,
        grid: *const u32,
        block: *const u32,
        smem: usize,
        args: *mut *mut c_void,
        sizes: *const usize,
        nargs: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn powerinfer_emu_entries(out: *mut c_char, len: usize) -> usize;
}

/// The device name of the emulator.
pub const GPU_EMU: &str = "gpu-emu";

/// The CUDA kernels run on the CPU: host memory (optionally capped, as the simulated VRAM)
/// and the kernels' own code.
#[derive(Debug)]
pub struct EmuBackend {
    mem: HostBackend,
    /// Launches so far, by kernel entry.
    launched: Mutex<BTreeMap<String, u64>>,
    /// Work done inside another kernel's launch so far ([`Kernel::fused`]).
    fused: Mutex<BTreeMap<String, u64>>,
    /// Launches queued for the next batch, with graphs on, and the graphs kept.
    graphs: Mutex<GraphQueue<Vec<LaunchSpec>>>,
}

impl Default for EmuBackend {
    fn default() -> EmuBackend {
        EmuBackend::new(None)
    }
}

impl EmuBackend {
    /// An emulator whose buffers may total at most `capacity` bytes (each rounded up to 256),
    /// or unlimited.
    /// Graphs on when [`crate::graph::GRAPHS_ENV`] says so.
    pub fn new(capacity: Option<usize>) -> EmuBackend {
        EmuBackend::batching(capacity, graphs_from_env())
    }

    /// [`EmuBackend::new`] with graphs on or off whatever the environment says.
    pub fn batching(capacity: Option<usize>, graphs: bool) -> EmuBackend {
        EmuBackend {
            mem: HostBackend::named(GPU_EMU, capacity),
            launched: Mutex::new(BTreeMap::new()),
            fused: Mutex::new(BTreeMap::new()),
            graphs: Mutex::new(GraphQueue::new(graphs)),
        }
    }

    /// The entries this backend has launched so far (the tests' coverage check).
    pub fn launched(&self) -> BTreeSet<String> {
        self.launched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Run one launch spec on the CPU; `Error::Cuda` with the emulator's reason when the launch
    /// is invalid (unknown kernel, argument count or width, grid, block or shared memory past
    /// CUDA's limits) or a thread of it failed (a barrier part of a block never reached, a
    /// shuffle from a returned lane).
    pub fn run(&self, mut spec: LaunchSpec) -> Result<()> {
        count(&self.launched, &spec.entry);
        let entry = CString::new(spec.entry.clone())
            .map_err(|_| Error::Cuda(format!("gpu-emu: kernel name {:?}", spec.entry)))?;
        let sizes = spec.args.sizes();
        let mut params = spec.args.pointers();
        let mut err = vec![0u8; 1024];
        // SAFETY: `entry` is NUL-terminated; grid and block are 3 values each; `params` holds
        // sizes.len() pointers to the packed arguments of `spec`, alive (and unmoved) for the
        // call; the emulator checks their count and widths against the kernel before calling
        // it. The kernel dereferences the buffer addresses in them: its Kernel::spec took those
        // from this backend's live buffers, whose lengths crate::ops checked against the launch.
        // `err` is writable for its length.
        let rc = unsafe {
            powerinfer_emu_launch(
                entry.as_ptr(),
                spec.grid.as_ptr(),
                spec.block.as_ptr(),
                spec.shared_bytes as usize,
                params.as_mut_ptr(),
                sizes.as_ptr(),
                sizes.len(),
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        Err(Error::Cuda(format!(
            "gpu-emu: {}",
            String::from_utf8_lossy(&err[..end])
        )))
    }
}

/// The kernels compiled into the emulator, by entry name.
pub fn emu_entries() -> BTreeSet<String> {
    // SAFETY: a null buffer of length 0 asks only for the size needed.
    let n = unsafe { powerinfer_emu_entries(std::ptr::null_mut(), 0) };
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds the `n` bytes the list needs, NUL included.
    unsafe { powerinfer_emu_entries(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end])
        .lines()
        .map(String::from)
        .collect()
}

impl Backend for EmuBackend {
    type Buf<T: Elem> = HostBuf<T>;

    fn describe(&self) -> String {
        self.mem.describe()
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.mem.mem_info()
    }

    fn allocated_bytes(&self) -> Option<usize> {
        self.mem.allocated_bytes()
    }

    /// An exact-size allocation of its own (the address sanitizer's redzones around it).
    fn zeros<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        self.submit()?;
        self.mem.zeros(len)
    }

    fn write<T: Elem>(&self, host: &[T], dst: &mut HostBuf<T>, at: usize) -> Result<()> {
        self.submit()?;
        self.mem.write(host, dst, at)
    }

    fn read<T: Elem>(&self, src: &HostBuf<T>, at: usize, out: &mut [T]) -> Result<()> {
        self.submit()?;
        self.mem.read(src, at, out)
    }

    /// Launches finish before they return (queued ones at this synchronisation).
    fn synchronize(&self) -> Result<()> {
        self.submit()
    }

    fn launch<K: Kernel<Self>>(&self, kernel: K, _checked: Checked) -> Result<()> {
        let fused = kernel.fused();
        let spec = kernel.spec(self)?;
        if let Some(what) = fused {
            count(&self.fused, what);
        }
        let now = lock(&self.graphs).queue(spec);
        match now {
            Some(spec) => self.run(spec),
            None => Ok(()),
        }
    }

    fn flush(&self) -> Result<()> {
        lock(&self.graphs).flush(&EmuGraphs(self), true)
    }

    fn begin_step(&self) -> Result<()> {
        let mut q = lock(&self.graphs);
        q.flush(&EmuGraphs(self), false)?;
        q.begin_step();
        Ok(())
    }

    fn graph_stats(&self) -> Option<GraphStats> {
        let q = lock(&self.graphs);
        q.on().then(|| q.stats())
    }

    fn addr<T: Elem>(&self, buf: &HostBuf<T>) -> u64 {
        self.mem.addr(buf)
    }

    fn addr_mut<T: Elem>(&self, buf: &mut HostBuf<T>) -> u64 {
        self.mem.addr_mut(buf)
    }

    /// Launches per entry (run so far) and per fused step ([`Kernel::fused`]: "quantize_x (in
    /// rms_norm)", "rms_norm (in rope)", "add (in sparse_matvec)").
    fn kernel_launches(&self) -> Option<BTreeMap<String, u64>> {
        let mut all = lock(&self.launched).clone();
        all.extend(lock(&self.fused).iter().map(|(k, v)| (k.clone(), *v)));
        Some(all)
    }
}

impl EmuBackend {
    /// Run the queued batch before a copy, an allocation or a synchronisation.
    fn submit(&self) -> Result<()> {
        lock(&self.graphs).flush(&EmuGraphs(self), false)
    }
}

/// The emulator's graphs: the launches a batch was built from, each replaced as a CUDA graph's
/// node is updated; running one runs its launches in order.
struct EmuGraphs<'a>(&'a EmuBackend);

impl GraphRunner for EmuGraphs<'_> {
    type Graph = Vec<LaunchSpec>;

    fn build(&self, batch: &[LaunchSpec]) -> Result<Vec<LaunchSpec>> {
        Ok(batch.to_vec())
    }

    fn update(&self, graph: &mut Vec<LaunchSpec>, i: usize, spec: &LaunchSpec) -> Result<()> {
        graph[i] = spec.clone();
        Ok(())
    }

    fn run(&self, graph: &Vec<LaunchSpec>) -> Result<()> {
        graph.iter().try_for_each(|spec| self.0.run(spec.clone()))
    }
}

/// A lock, through a poisoned one (a panicking test thread leaves counts that are still good).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One more launch of `what` in `counts`.
fn count(counts: &Mutex<BTreeMap<String, u64>>, what: &str) {
    *lock(counts).entry(what.to_string()).or_insert(0) += 1;
}
