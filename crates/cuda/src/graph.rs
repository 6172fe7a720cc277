//! Launch batches run as graphs (issue 32, item 6: few launches). With graphs on
//! ([`GRAPHS_ENV`]), a backend that batches (the CUDA device, and the emulator, which runs the
//! same logic on the CPU) queues its launches instead of running them, until the host next
//! interacts with the device: a copy either way, an allocation, a synchronisation, or the
//! executor's [`Backend::flush`](crate::Backend::flush) before CPU work that should overlap the
//! GPU's. The queued batch then runs as one graph.
//!
//! A decode step's batches come in the same order every step, so the graphs are kept per batch
//! number within the step ([`Backend::begin_step`](crate::Backend::begin_step) restarts the
//! count): a batch whose kernels (entries and argument widths) are those of the graph kept for
//! its number replays it, with the nodes whose arguments, grid, block or shared memory changed
//! updated in place (per token: RoPE's angles, the position of the KV store, the attention's
//! length and chunking); any other batch builds a new graph for its number. The host then pays
//! one graph launch and a few node updates per batch instead of one driver call per kernel.

use std::collections::BTreeMap;

use powerinfer_core::Result;

use crate::launch_spec::LaunchSpec;

/// `POWERINFER_RS_GPU_GRAPHS=1` runs each batch of launches between two host interactions as a
/// graph (built once per batch shape, replayed with the changed nodes updated); unset or 0:
/// every kernel is its own launch. Off by default until measured on a GPU
/// (benchmarks/gpu/NOTES.md).
pub const GRAPHS_ENV: &str = "POWERINFER_RS_GPU_GRAPHS";

/// Whether [`GRAPHS_ENV`] turns graphs on.
pub fn graphs_from_env() -> bool {
    std::env::var(GRAPHS_ENV).is_ok_and(|v| v.trim() == "1")
}

/// What a graph node keeps across replays: the kernel and its arguments' widths.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeKernel {
    module: &'static str,
    entry: String,
    sizes: Vec<usize>,
}

impl NodeKernel {
    fn of(spec: &LaunchSpec) -> NodeKernel {
        NodeKernel {
            module: spec.module.name,
            entry: spec.entry.clone(),
            sizes: spec.args.sizes(),
        }
    }
}

/// Whether node `spec` must be updated in a graph last run with `last`.
fn changed(last: &LaunchSpec, spec: &LaunchSpec) -> bool {
    last.grid != spec.grid
        || last.block != spec.block
        || last.shared_bytes != spec.shared_bytes
        || last.args != spec.args
}

/// Counters of the batches run as graphs ([`Backend::kernel_launches`] reports them as
/// "graph: ..." entries on the emulator).
///
/// [`Backend::kernel_launches`]: crate::Backend::kernel_launches
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Batches run (each one graph launch).
    pub batches: u64,
    /// Graphs built (a batch number seen first, or with other kernels than its graph's).
    pub built: u64,
    /// Batches that replayed a kept graph.
    pub replayed: u64,
    /// Nodes updated before a replay.
    pub nodes_updated: u64,
    /// Kernels run inside graphs.
    pub kernels: u64,
}

impl GraphStats {
    /// The counters as named entries (for a launch-count map).
    pub fn entries(&self) -> [(&'static str, u64); 5] {
        [
            ("graph: batches", self.batches),
            ("graph: built", self.built),
            ("graph: replayed", self.replayed),
            ("graph: nodes updated", self.nodes_updated),
            ("graph: kernels", self.kernels),
        ]
    }
}

/// One kept graph: the backend's handle `G` and the launches it last ran.
struct Kept<G> {
    graph: G,
    kernels: Vec<NodeKernel>,
    last: Vec<LaunchSpec>,
}

/// How a backend makes, updates and runs its graphs.
pub trait GraphRunner {
    /// The backend's graph (a CUDA graph and its executable; nothing on the emulator).
    type Graph;
    /// A new graph running `batch` in order.
    fn build(&self, batch: &[LaunchSpec]) -> Result<Self::Graph>;
    /// Node `i` of `graph` now runs `spec` (same kernel, other arguments or geometry).
    fn update(&self, graph: &mut Self::Graph, i: usize, spec: &LaunchSpec) -> Result<()>;
    /// Run `graph` (queued, in stream order), whose nodes are now `batch`.
    fn run(&self, graph: &Self::Graph, batch: &[LaunchSpec]) -> Result<()>;
}

/// The queue of launches and the graphs kept per batch number of a step.
pub struct GraphQueue<G> {
    on: bool,
    pending: Vec<LaunchSpec>,
    /// The batch number within the current step.
    number: usize,
    kept: BTreeMap<usize, Kept<G>>,
    stats: GraphStats,
}

impl<G> std::fmt::Debug for GraphQueue<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphQueue")
            .field("on", &self.on)
            .field("pending", &self.pending.len())
            .field("kept", &self.kept.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Most graphs kept (batch numbers past it run as graphs built each time): a decode step has a
/// few batches per layer.
const MAX_KEPT: usize = 4096;

impl<G> GraphQueue<G> {
    /// A queue, batching when `on`.
    pub fn new(on: bool) -> GraphQueue<G> {
        GraphQueue {
            on,
            pending: Vec::new(),
            number: 0,
            kept: BTreeMap::new(),
            stats: GraphStats::default(),
        }
    }

    /// Whether launches are batched.
    pub fn on(&self) -> bool {
        self.on
    }

    /// Queue `spec` (graphs on), or hand it back to be launched now.
    pub fn queue(&mut self, spec: LaunchSpec) -> Option<LaunchSpec> {
        if !self.on {
            return Some(spec);
        }
        self.pending.push(spec);
        None
    }

    /// A decode step begins: batches are numbered from 0 again.
    pub fn begin_step(&mut self) {
        self.number = 0;
    }

    /// The counters so far.
    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Run the queued batch, if any, as a graph through `runner`. On an error the batch is
    /// dropped (not run again) and its number's graph forgotten.
    pub fn flush<R: GraphRunner<Graph = G>>(&mut self, runner: &R) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        let number = self.number;
        self.number += 1;
        let kernels: Vec<NodeKernel> = batch.iter().map(NodeKernel::of).collect();
        let result = match self.kept.remove(&number) {
            Some(mut k) if k.kernels == kernels => {
                let mut updated = 0;
                let mut res = Ok(());
                for (i, (last, spec)) in k.last.iter().zip(&batch).enumerate() {
                    if changed(last, spec) {
                        res = runner.update(&mut k.graph, i, spec);
                        if res.is_err() {
                            break;
                        }
                        updated += 1;
                    }
                }
                res.and_then(|()| runner.run(&k.graph, &batch)).map(|()| {
                    self.stats.replayed += 1;
                    self.stats.nodes_updated += updated;
                    k
                })
            }
            _ => runner.build(&batch).and_then(|graph| {
                self.stats.built += 1;
                runner.run(&graph, &batch).map(|()| Kept {
                    graph,
                    kernels,
                    last: Vec::new(),
                })
            }),
        };
        let mut kept = result?;
        self.stats.batches += 1;
        self.stats.kernels += batch.len() as u64;
        kept.last = batch;
        if number < MAX_KEPT {
            self.kept.insert(number, kept);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::kernels;
    use crate::launch_spec::KernelArgs;

    /// A runner that records what it was asked to do.
    #[derive(Default)]
    struct Log(RefCell<Vec<String>>);

    impl GraphRunner for Log {
        type Graph = usize;
        fn build(&self, batch: &[LaunchSpec]) -> Result<usize> {
            self.0.borrow_mut().push(format!("build {}", batch.len()));
            Ok(batch.len())
        }
        fn update(&self, _: &mut usize, i: usize, spec: &LaunchSpec) -> Result<()> {
            self.0
                .borrow_mut()
                .push(format!("update {i} {}", spec.entry));
            Ok(())
        }
        fn run(&self, g: &usize, batch: &[LaunchSpec]) -> Result<()> {
            assert_eq!(*g, batch.len());
            self.0.borrow_mut().push("run".into());
            Ok(())
        }
    }

    fn spec(entry: &str, arg: i32) -> LaunchSpec {
        let mut args = KernelArgs::default();
        args.i32(arg);
        LaunchSpec {
            module: &kernels::ELEMENTWISE,
            entry: entry.into(),
            grid: [1, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            args,
        }
    }

    #[test]
    fn batches_replay_their_graph_with_only_the_changed_nodes_updated() {
        let log = Log::default();
        let mut q = GraphQueue::new(true);
        let step = |q: &mut GraphQueue<usize>, pos: i32| {
            q.begin_step();
            for (e, a) in [("add", 1), ("rope", pos), ("fill", 2)] {
                assert!(q.queue(spec(e, a)).is_none());
            }
            q.flush(&log).unwrap();
            q.queue(spec("add", 3));
            q.flush(&log).unwrap();
            q.flush(&log).unwrap(); // nothing queued: nothing run
        };
        step(&mut q, 0);
        step(&mut q, 1);
        step(&mut q, 1);
        assert_eq!(
            log.0.take(),
            [
                "build 3",
                "run",
                "build 1",
                "run",
                "update 1 rope",
                "run",
                "run",
                "run",
                "run"
            ]
        );
        // Another kernel at batch 0: a new graph for that number.
        q.begin_step();
        q.queue(spec("add", 1));
        q.queue(spec("copy", 1));
        q.flush(&log).unwrap();
        assert_eq!(log.0.take(), ["build 2", "run"]);
        let s = q.stats();
        assert_eq!(
            (s.batches, s.built, s.replayed, s.nodes_updated),
            (7, 3, 4, 1)
        );
        assert_eq!(s.kernels, 3 * 3 + 3 + 2);
        // Geometry counts as a change too.
        q.begin_step();
        let mut wide = spec("add", 1);
        wide.grid = [2, 1, 1];
        q.queue(wide);
        q.queue(spec("copy", 1));
        q.flush(&log).unwrap();
        assert_eq!(log.0.take(), ["update 0 add", "run"]);
    }

    #[test]
    fn off_hands_every_launch_back() {
        let mut q = GraphQueue::<usize>::new(false);
        assert!(q.queue(spec("add", 1)).is_some());
        q.flush(&Log::default()).unwrap();
        assert_eq!(q.stats(), GraphStats::default());
    }
}
