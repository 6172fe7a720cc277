//! CUDA graphs for the launch batches of [`crate::graph`] (feature `cuda`): a batch becomes a
//! graph of kernel nodes in a chain (the stream's order), instantiated once; a replay updates
//! the nodes whose launch changed (`cuGraphExecKernelNodeSetParams`) and launches the
//! executable graph on the device's stream (`cuGraphLaunch`), one driver call for the batch.

use std::ptr;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use powerinfer_core::Result;

use crate::device::{driver_err, CudaDevice};
use crate::graph::GraphRunner;
use crate::launch_spec::LaunchSpec;

/// A built graph: its nodes in batch order, and the executable instance the device launches.
pub(crate) struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    ctx: Arc<CudaContext>,
}

// SAFETY: the handles are plain driver objects of `ctx`; the device keeps its graphs behind one
// mutex (its GraphQueue), so no two threads use one graph at the same time, as the driver
// requires, and every use binds `ctx` first.
unsafe impl Send for CudaGraph {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handles were made by cuGraphCreate / cuGraphInstantiateWithFlags in this
        // context (null when that step never happened) and are destroyed once, here; a launched
        // executable may be destroyed while it runs (the driver finishes it first).
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
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
            // kernel's parameter order as for cuLaunchKernel (launch_spec.rs).
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
