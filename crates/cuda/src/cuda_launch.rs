//! The raw launch on a GPU (feature `cuda`): the [`LaunchSpec`] of a checked [`Kernel`]
//! ([`Kernel::spec`], the description the emulator runs too) handed to `cuLaunchKernel` on
//! the device's stream, or queued for the next graph batch when graphs are on
//! ([`crate::graph`]), and the batches run as CUDA graphs ([`CudaGraphs`]). Nothing here waits
//! for the GPU.

use std::ptr;
use std::sync::Arc;

use cudarc::driver::{result, sys};
use powerinfer_core::Result;

use crate::backend::Kernel;
use crate::cuda_graph::CudaGraph;
use crate::device::CudaDevice;
use crate::driver::driver_err;
use crate::graph::GraphRunner;
use crate::launch_spec::LaunchSpec;

impl CudaDevice {
    /// Queue `launch` on this device's stream (the body of [`Backend::launch`]).
    ///
    /// [`Backend::launch`]: crate::Backend::launch
    pub(crate) fn launch_kernel<K: Kernel<CudaDevice>>(&self, kernel: K) -> Result<()> {
        let spec: LaunchSpec = kernel.spec(self)?;
        // With graphs on, queued for the next batch (crate::graph).
        let Some(mut spec) = self.queue(spec) else {
            return Ok(());
        };
        let f = self.function(spec.module, &spec.entry)?;
        let mut params = spec.args.pointers();
        self.bind()?;
        let [gx, gy, gz] = spec.grid;
        let [bx, by, bz] = spec.block;
        // SAFETY: `params` points at the packed arguments of `spec`, alive until this returns
        // (cuLaunchKernel copies them). Kernel::spec built them from a kernel whose shapes ops
        // checked, in the kernel's parameter order with its widths: the emulator checks count
        // and widths against the compiled kernel on every launch, tests/nvrtc_ptx.rs against
        // the PTX; the grid, block and shared bytes are the ones the kernel's comment asks for.
        // Buffers are device allocations of this context, used on this one stream only.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (gx, gy, gz),
                (bx, by, bz),
                spec.shared_bytes,
                self.stream().cu_stream(),
                &mut params,
            )
        }
        .map_err(driver_err(&format!("launching {}", spec.entry)))
    }

    /// Run the queued batch (as a graph, with graphs on; `explicit`: the executor's flush,
    /// counted apart), and with `begin_step` start a decode step's batch numbering again.
    pub(crate) fn run_batch(&self, explicit: bool, begin_step: bool) -> Result<()> {
        let mut q = self.graphs();
        q.flush(&CudaGraphs(self), explicit)?;
        if begin_step {
            q.begin_step();
        }
        Ok(())
    }
}

/// The device as a [`GraphRunner`].
pub(crate) struct CudaGraphs<'a>(pub &'a CudaDevice);

impl CudaGraphs<'_> {
    /// The node parameters of `spec`: its function, geometry and argument pointers (`params`,
    /// which the driver copies during the call that takes them).
    fn node(
        &self,
        spec: &LaunchSpec,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<sys::CUDA_KERNEL_NODE_PARAMS> {
        let f = self.0.function(spec.module, &spec.entry)?;
        let [gx, gy, gz] = spec.grid;
        let [bx, by, bz] = spec.block;
        Ok(sys::CUDA_KERNEL_NODE_PARAMS {
            func: f.cu_function(),
            gridDimX: gx,
            gridDimY: gy,
            gridDimZ: gz,
            blockDimX: bx,
            blockDimY: by,
            blockDimZ: bz,
            sharedMemBytes: spec.shared_bytes,
            kernelParams: params.as_mut_ptr(),
            extra: ptr::null_mut(),
            kern: ptr::null_mut(),
            ctx: ptr::null_mut(),
        })
    }
}

impl GraphRunner for CudaGraphs<'_> {
    type Graph = CudaGraph;

    fn build(&self, batch: &[LaunchSpec]) -> Result<CudaGraph> {
        self.0.bind()?;
        let mut g = CudaGraph {
            graph: ptr::null_mut(),
            exec: ptr::null_mut(),
            nodes: Vec::with_capacity(batch.len()),
            ctx: Arc::clone(self.0.context()),
        };
        // SAFETY: an out-pointer to a local handle; flags must be 0.
        unsafe { sys::cuGraphCreate(&mut g.graph, 0) }
            .result()
            .map_err(driver_err("creating a CUDA graph"))?;
        for spec in batch {
            let mut args = spec.args.clone();
            let mut params = args.pointers();
            let p = self.node(spec, &mut params)?;
            let dep = g.nodes.last().copied();
            let mut node = ptr::null_mut();
            // SAFETY: `g.graph` is the graph just created; the dependency (the previous node,
            // or none) is a node of it; `p` holds a function of this context and the argument
            // pointers of `args`, alive for this call (the driver copies the values), in the
            // kernel's parameter order as for cuLaunchKernel (Kernel::spec).
            unsafe {
                sys::cuGraphAddKernelNode_v2(
                    &mut node,
                    g.graph,
                    dep.as_ref().map_or(ptr::null(), |d| d as *const _),
                    usize::from(dep.is_some()),
                    &p,
                )
            }
            .result()
            .map_err(driver_err(&format!(
                "adding {} to a CUDA graph",
                spec.entry
            )))?;
            g.nodes.push(node);
        }
        // SAFETY: an out-pointer to a local handle; `g.graph` is complete; flags 0.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) }
            .result()
            .map_err(driver_err("instantiating a CUDA graph"))?;
        Ok(g)
    }

    fn update(&self, g: &mut CudaGraph, i: usize, spec: &LaunchSpec) -> Result<()> {
        self.0.bind()?;
        let mut args = spec.args.clone();
        let mut params = args.pointers();
        let p = self.node(spec, &mut params)?;
        // SAFETY: node i of the graph `g.exec` was instantiated from, which ran the same
        // kernel (GraphQueue compares entries and argument widths before an update); `p` as
        // in `build`, alive for the call.
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, g.nodes[i], &p) }
            .result()
            .map_err(driver_err(&format!(
                "updating {} in a CUDA graph",
                spec.entry
            )))
    }

    fn run(&self, g: &CudaGraph) -> Result<()> {
        self.0.bind()?;
        // SAFETY: an instantiated graph of this context, launched on this device's stream (in
        // stream order: after the copies and launches before it, before those after it).
        unsafe { sys::cuGraphLaunch(g.exec, self.0.stream().cu_stream()) }
            .result()
            .map_err(driver_err("launching a CUDA graph"))
    }
}
