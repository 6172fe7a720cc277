//! CUDA graphs for the launch batches of [`crate::graph`] (feature `cuda`): a batch becomes a
//! graph of kernel nodes in a chain (the stream's order), instantiated once; a replay updates
//! the nodes whose launch changed (`cuGraphExecKernelNodeSetParams`) and launches the
//! executable graph on the device's stream (`cuGraphLaunch`), one driver call for the batch.
//! This file holds the graph and its release; the device builds, updates and runs them
//! (`cuda_launch.rs`).

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;

/// A built graph: its nodes in batch order, and the executable instance the device launches.
pub(crate) struct CudaGraph {
    pub(crate) graph: sys::CUgraph,
    pub(crate) exec: sys::CUgraphExec,
    pub(crate) nodes: Vec<sys::CUgraphNode>,
    pub(crate) ctx: Arc<CudaContext>,
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
