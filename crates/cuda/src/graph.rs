//! Launch batches run as graphs (issue 32, item 6: few launches). With graphs on
//! ([`GRAPHS_ENV`]), a backend that batches (the CUDA device, and the emulator, which runs the
//! same logic on the CPU) queues its launches instead of running them, until the host next
//! interacts with the device: a copy either way, an allocation, a synchronisation, or the
//! executor's [`Backend::flush`](crate::Backend::flush) before CPU work that should overlap the
//! GPU's. The queued batch then runs as one graph.
//!
//! A decode step's batches come in the same order every step, so the graphs are kept by the
//! batch's place in the step and by its kernels (entries and argument widths). The place is
//! (segment, index): the executor's explicit flushes, which its layer program fixes, end a
//! segment each (counted whether or not anything was queued), and the batches a copy or an
//! allocation ends are numbered within their segment;
//! [`Backend::begin_step`](crate::Backend::begin_step) starts at (0, 0). So a copy made on some
//! tokens only (a cold part uploaded when some cold neuron fired) moves the numbers of its own
//! segment's later batches only, and a batch whose kernels differ from token to token keeps a
//! graph for each of its forms. A batch replays the graph kept for its place and kernels, with
//! the nodes whose arguments, grid, block or shared memory changed updated in place (per token:
//! RoPE's angles, the position of the KV store, the attention's length and chunking); a batch
//! seen first builds a new graph. The host then pays one graph launch and a few node updates
//! per batch instead of one driver call per kernel.
//!
//! Every buffer a queued launch uses must outlive the flush that runs it: the executor's
//! buffers live as long as the model; a backend's `zeros` flushes before it allocates.

use std::collections::HashMap;

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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

/// Counters of the batches run as graphs ([`Backend::graph_stats`](crate::Backend::graph_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Batches run (each one graph launch).
    pub batches: u64,
    /// Graphs built (a batch number seen first with these kernels).
    pub built: u64,
    /// Batches that replayed a kept graph.
    pub replayed: u64,
    /// Nodes updated before a replay.
    pub nodes_updated: u64,
    /// Kernels run inside graphs.
    pub kernels: u64,
    /// Batches run by an explicit [`Backend::flush`](crate::Backend::flush) (the executor's,
    /// before CPU work), not by a copy or an allocation.
    pub explicit: u64,
}

impl GraphStats {
    /// The counters by name.
    pub fn entries(&self) -> [(&'static str, u64); 6] {
        [
            ("batches", self.batches),
            ("built", self.built),
            ("replayed", self.replayed),
            ("nodes_updated", self.nodes_updated),
            ("kernels", self.kernels),
            ("explicit", self.explicit),
        ]
    }
}

/// What a kept graph is found by: its batch's place in the step (segment, index) and kernels.
type GraphKey = ((usize, usize), Vec<NodeKernel>);

/// One kept graph: the backend's handle `G` and the launches it last ran.
struct Kept<G> {
    graph: G,
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
    /// Run `graph` (queued, in stream order): its nodes, built from and updated to `batch`.
    fn run(&self, graph: &Self::Graph) -> Result<()>;
}

/// The queue of launches and the graphs kept per batch number of a step.
pub struct GraphQueue<G> {
    on: bool,
    pending: Vec<LaunchSpec>,
    /// The next batch's place in the current step: (segment, index within it).
    place: (usize, usize),
    kept: HashMap<GraphKey, Kept<G>>,
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

/// Most graphs kept (all are dropped when a new one would pass it): a decode step has a few
/// batches per layer, most in one form.
const MAX_KEPT: usize = 4096;

impl<G> GraphQueue<G> {
    /// A queue, batching when `on`.
    pub fn new(on: bool) -> GraphQueue<G> {
        GraphQueue {
            on,
            pending: Vec::new(),
            place: (0, 0),
            kept: HashMap::new(),
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

    /// A decode step begins: batches are numbered from (0, 0) again.
    pub fn begin_step(&mut self) {
        self.place = (0, 0);
    }

    /// The counters so far.
    pub fn stats(&self) -> GraphStats {
        self.stats
    }

    /// Run the queued batch, if any, as a graph through `runner`; `explicit` for the backend's
    /// [`Backend::flush`](crate::Backend::flush) (counted apart). On an error the batch is
    /// dropped (not run again) and its graph forgotten.
    pub fn flush<R: GraphRunner<Graph = G>>(&mut self, runner: &R, explicit: bool) -> Result<()> {
        let place = self.place;
        self.place = match explicit {
            true => (place.0 + 1, 0),
            false if self.pending.is_empty() => place,
            false => (place.0, place.1 + 1),
        };
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.pending);
        let key = (place, batch.iter().map(NodeKernel::of).collect::<Vec<_>>());
        let (kept, updated, built) = match self.kept.remove(&key) {
            Some(mut k) => {
                let mut updated = 0;
                for (i, (last, spec)) in k.last.iter().zip(&batch).enumerate() {
                    if changed(last, spec) {
                        runner.update(&mut k.graph, i, spec)?;
                        updated += 1;
                    }
                }
                (k, updated, false)
            }
            None => {
                let graph = runner.build(&batch)?;
                (
                    Kept {
                        graph,
                        last: Vec::new(),
                    },
                    0,
                    true,
                )
            }
        };
        runner.run(&kept.graph)?;
        let s = &mut self.stats;
        s.batches += 1;
        s.kernels += batch.len() as u64;
        s.explicit += u64::from(explicit);
        match built {
            true => s.built += 1,
            false => {
                s.replayed += 1;
                s.nodes_updated += updated;
            }
        }
        if self.kept.len() >= MAX_KEPT {
            self.kept.clear();
        }
        self.kept.insert(
            key,
            Kept {
                last: batch,
                ..kept
            },
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::launch_spec::KernelArgs;
    use crate::ops::elementwise::launch::SOURCE;

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
        fn run(&self, g: &usize) -> Result<()> {
            self.0.borrow_mut().push(format!("run {g}"));
            Ok(())
        }
    }

    fn spec(entry: &str, arg: i32) -> LaunchSpec {
        let mut args = KernelArgs::default();
        args.i32(arg);
        LaunchSpec {
            module: &SOURCE,
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
        // A step: batch 0 of three kernels (one of them position-dependent), batch 1 of one
        // (two when `cold`: a CPU part added on some tokens only).
        let step = |q: &mut GraphQueue<usize>, pos: i32, cold: bool| {
            q.begin_step();
            for (e, a) in [("add", 1), ("rope", pos), ("fill", 2)] {
                assert!(q.queue(spec(e, a)).is_none());
            }
            q.flush(&log, true).unwrap();
            q.queue(spec("add", 3));
            if cold {
                q.queue(spec("copy", 4));
            }
            q.flush(&log, false).unwrap();
            q.flush(&log, true).unwrap(); // nothing queued: nothing run
        };
        step(&mut q, 0, false);
        step(&mut q, 1, false);
        step(&mut q, 1, true);
        step(&mut q, 2, false);
        step(&mut q, 2, true);
        assert_eq!(
            log.0.take(),
            [
                "build 3",
                "run 3",
                "build 1",
                "run 1", // step 0
                "update 1 rope",
                "run 3",
                "run 1", // step 1: the position changed
                "run 3",
                "build 2",
                "run 2", // step 2: batch 1's other form
                "update 1 rope",
                "run 3",
                "run 1", // step 3: both forms kept
                "run 3",
                "run 2",
            ]
        );
        let s = q.stats();
        assert_eq!(
            (s.batches, s.built, s.replayed, s.nodes_updated, s.explicit),
            (10, 3, 7, 2, 5)
        );
        assert_eq!(s.kernels, 5 * 3 + 3 + 2 * 2);
        // Geometry counts as a change too.
        q.begin_step();
        let mut wide = spec("add", 1);
        wide.grid = [2, 1, 1];
        for spec in [wide, spec("rope", 2), spec("fill", 2)] {
            q.queue(spec);
        }
        q.flush(&log, false).unwrap();
        assert_eq!(log.0.take(), ["update 0 add", "run 3"]);
    }

    #[test]
    fn a_copy_on_some_tokens_only_moves_the_numbers_of_its_own_segment() {
        let log = Log::default();
        let mut q = GraphQueue::new(true);
        // Segment 0: a batch, then on odd tokens a copy ends it early (a second batch); an
        // explicit flush; segment 1: one batch.
        for token in 0..4 {
            q.begin_step();
            q.queue(spec("add", 1));
            if token % 2 == 1 {
                q.flush(&log, false).unwrap(); // the copy
                q.queue(spec("fill", 2));
            }
            q.flush(&log, true).unwrap();
            q.queue(spec("copy", 3));
            q.flush(&log, false).unwrap();
        }
        // Built: add at (0, 0), copy at (1, 0), fill at (0, 1); segment 1's batch keeps its
        // place whatever segment 0 did.
        let s = q.stats();
        assert_eq!(
            (s.batches, s.built, s.replayed),
            (10, 3, 7),
            "{:?}",
            log.0.take()
        );
    }

    /// A runner whose updates fail.
    struct Failing;

    impl GraphRunner for Failing {
        type Graph = ();
        fn build(&self, _: &[LaunchSpec]) -> Result<()> {
            Ok(())
        }
        fn update(&self, _: &mut (), _: usize, _: &LaunchSpec) -> Result<()> {
            Err(powerinfer_core::Error::Cuda("no".into()))
        }
        fn run(&self, _: &()) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failed_update_drops_the_batch_and_its_graph() {
        let mut q = GraphQueue::new(true);
        for pos in [0, 1, 1] {
            q.begin_step();
            q.queue(spec("rope", pos));
            let r = q.flush(&Failing, false);
            // Step 0 builds, step 1's update fails, step 2 builds again (the graph forgotten).
            assert_eq!(r.is_err(), pos == 1 && q.stats().built == 1);
        }
        let s = q.stats();
        assert_eq!((s.batches, s.built, s.replayed), (2, 2, 0));
    }

    #[test]
    fn off_hands_every_launch_back() {
        let mut q = GraphQueue::<usize>::new(false);
        assert!(q.queue(spec("add", 1)).is_some());
        q.flush(&Log::default(), true).unwrap();
        assert_eq!(q.stats(), GraphStats::default());
    }
}
