//! An opened neuron store at work: its cache, its readers, the clusters read ahead, and the
//! sparse FFN a decoded token runs over the clusters it pins. Below the model's weights, which
//! hold the store in use; opening one for a model is [`NeuronStore::open`] (in the parent).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use powerinfer_core::{ensure, Buffer, Result, Weight};
use powerinfer_cpu::{axpy_rows, matvec_rows};
use rayon::prelude::*;

use crate::layer::FfnKind;
use crate::neuron_store::cache::{Arena, Cache, Slot};
use crate::neuron_store::format::{self, StoreLayout, ALIGN};
use crate::neuron_store::io::{Batch, IoPool};

mod ahead;

/// What the store did since it was opened (or its counts were last reset).
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    /// Clusters found in the cache.
    pub hits: u64,
    /// Clusters read from storage.
    pub misses: u64,
    /// Bytes read from storage.
    pub bytes_read: u64,
    /// Seconds of reading: per group of clusters, from the submission of its reads to the
    /// completion of the last (computation overlaps them).
    pub read_s: f64,
    /// Clusters read ahead of their layer (counted in `bytes_read`; a later use is a hit).
    pub ahead: u64,
    /// Of those, the ones their layer used.
    pub ahead_used: u64,
}

/// A neuron store opened for one model, with its cache and readers.
pub struct NeuronStore {
    layout: StoreLayout,
    path: PathBuf,
    io: IoPool,
    cache: Mutex<Cache>,
    stats: Mutex<StoreStats>,
    /// The next layer's clusters being read ahead, pinned until that layer's FFN.
    ahead: Mutex<Option<Ahead>>,
    /// Whether [`NeuronStore::ffn`] reads the next layer's named clusters ahead.
    read_ahead: AtomicBool,
    /// Held for a whole [`NeuronStore::ffn`]: sessions sharing the model take turns, so that a
    /// cluster is never read into two slots (or one slot twice) at once, and a read-ahead is
    /// landed by the layer it was for.
    turn: Mutex<()>,
}

/// The activations the caller knows already (exact-relu computes the gate from the resident
/// rows), or the neurons whose gate rows are to be read with the rest (predictor mode).
pub enum Active<'a> {
    /// Neuron ids with their activations `act(gate)`.
    Firing(&'a [u32], &'a [f32]),
    /// Neuron ids predicted active.
    Listed(&'a [u32]),
    /// Neuron ids whose gate rows are read with the rest, each activation times a factor (a
    /// routed expert's weight: a mixture of experts' dense experts).
    Scaled(&'a [u32], &'a [f32]),
}

/// Clusters of `layer` read ahead of its FFN.
struct Ahead {
    layer: usize,
    need: usize,
    pinned: Pinned,
}

/// Clusters pinned in the cache, with the reads of the missing ones submitted.
struct Pinned {
    /// The clusters' slots, in the order asked for.
    slots: Vec<usize>,
    /// The slots being read, with their cluster.
    misses: Vec<(usize, u32)>,
    /// Those reads.
    batch: Arc<Batch>,
}

/// A cluster's active neurons: the cluster, their ids in it, the value each carries.
type ClusterGroup = (u32, Vec<u32>, Vec<f32>);

/// One cluster's rows as weights (views into its pinned slot).
struct ClusterRows {
    gate: Option<Weight>,
    up: Option<Weight>,
    down: Weight,
}

impl NeuronStore {
    /// The store of the file at `path`, laid out as `layout` (read from its header and
    /// checked against the model), with a cache of `cache_bytes` and `io_threads` readers.
    pub(super) fn new(
        layout: StoreLayout,
        path: &Path,
        cache_bytes: usize,
        io_threads: usize,
    ) -> Result<NeuronStore> {
        let slot = layout
            .layers
            .iter()
            .map(|l| l.cluster_bytes)
            .max()
            .unwrap_or(ALIGN);
        Ok(NeuronStore {
            cache: Mutex::new(Cache::new(cache_bytes, slot)?),
            io: IoPool::open(path, io_threads)?,
            layout,
            path: path.to_path_buf(),
            stats: Mutex::new(StoreStats::default()),
            ahead: Mutex::new(None),
            read_ahead: AtomicBool::new(false),
            turn: Mutex::new(()),
        })
    }

    /// The file's layout.
    pub fn layout(&self) -> &StoreLayout {
        &self.layout
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads bypass the page cache (`O_DIRECT`).
    pub fn direct(&self) -> bool {
        self.io.direct
    }

    /// Read the clusters the next layer's predictor names ahead of that layer (off by default:
    /// on a disk whose read rate bounds the store already it adds reads and gains nothing).
    pub fn set_read_ahead(&self, on: bool) {
        self.read_ahead.store(on, Ordering::Relaxed);
    }

    /// Whether clusters are read ahead.
    pub fn read_ahead(&self) -> bool {
        self.read_ahead.load(Ordering::Relaxed)
    }

    /// Clusters the cache holds.
    pub fn cache_slots(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.slots())
    }

    /// Clusters held resident.
    pub fn resident_slots(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.resident_slots())
    }

    /// Load the clusters `clusters[layer]` (whole) and keep them resident, never evicted (the
    /// hot neurons' clusters, from a profile); at most all but one of the cache's slots.
    /// Returns how many were loaded.
    pub fn load_resident(&self, clusters: &[Vec<u32>]) -> Result<usize> {
        let _turn = self.turn.lock().map_err(|_| poisoned())?;
        self.land_ahead(usize::MAX);
        ensure!(
            clusters.len() <= self.layout.layers.len(),
            Shape,
            "resident clusters for {} layers of a {}-layer store",
            clusters.len(),
            self.layout.layers.len()
        );
        let room = self.cache_slots().saturating_sub(1);
        let mut loaded = 0;
        for (layer, ks) in clusters.iter().enumerate() {
            let l = &self.layout.layers[layer];
            let ks: Vec<u32> = ks
                .iter()
                .copied()
                .filter(|&k| (k as usize) < l.n_clusters)
                .take(room - loaded)
                .collect();
            for chunk in ks.chunks(64) {
                let slots = self.pin(layer, chunk.iter().copied(), l.cluster_bytes)?;
                let mut cache = self.cache.lock().map_err(|_| poisoned())?;
                for s in slots {
                    cache.make_resident(s);
                }
            }
            loaded += ks.len();
            if loaded >= room {
                break;
            }
        }
        self.reset_stats();
        Ok(loaded)
    }

    /// The counts so far.
    pub fn stats(&self) -> StoreStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Zero the counts.
    pub fn reset_stats(&self) {
        if let Ok(mut s) = self.stats.lock() {
            *s = StoreStats::default();
        }
    }

    /// One token's FFN core of `layer` over the `active` neurons into `out` (dim, overwritten):
    /// their up (and, listed, gate) rows and transposed down rows read from the store, as the
    /// resident engine's sparse decode computes them. `bias`: the activated projection's bias
    /// (one per neuron) where the family has one. `next`: the neurons of layer `layer + 1` a
    /// guess names (its predictor on this layer's input), whose clusters are read ahead when
    /// [`NeuronStore::read_ahead`] (never changing the result, only what is cached).
    #[allow(clippy::too_many_arguments)]
    pub fn ffn(
        &self,
        layer: usize,
        act: FfnKind,
        bias: Option<&[f32]>,
        xn: &[f32],
        active: Active<'_>,
        next: Option<&[u32]>,
        out: &mut [f32],
    ) -> Result<()> {
        let l = self.layout.layers.get(layer).ok_or_else(|| {
            powerinfer_core::Error::Shape(format!("layer {layer} of a neuron store"))
        })?;
        let _turn = self.turn.lock().map_err(|_| poisoned())?;
        let landed = self.land_ahead(layer);
        let c = self.layout.cluster;
        let (groups, full) = self.cluster_groups(active, l.neurons)?;
        let need = if full {
            l.cluster_bytes
        } else {
            l.up_down_bytes
        };
        if !landed.is_empty() {
            let used = groups.iter().filter(|g| landed.contains(&g.0)).count();
            if let Ok(mut st) = self.stats.lock() {
                st.ahead_used += used as u64;
            }
        }
        out.fill(0.0);
        let dim = out.len();
        let slots = self.cache.lock().map_or(1, |c| c.free_slots()).max(1);
        // Read ahead only when this layer's clusters are pinned in one go (the read-ahead's
        // slots then never starve a later chunk of this layer).
        let mut next = next.filter(|_| groups.len() <= slots && self.read_ahead());
        for chunk in groups.chunks(slots) {
            // A few tasks per thread, each summing its run of clusters into one vector. Every
            // task's misses are read as soon as the chunk is pinned, in task order, and a task
            // starts computing when its own reads are in: the first tasks compute while the
            // later ones' clusters are still being read (PowerInfer-2's cluster pipeline). The
            // tasks and the order of their sums do not depend on which clusters were cached.
            let tasks = chunk.len().min(4 * rayon::current_num_threads()).max(1);
            let per = chunk.len().div_ceil(tasks);
            let t0 = Instant::now();
            let mut pinned: Vec<Pinned> = Vec::with_capacity(tasks);
            for run in chunk.chunks(per) {
                match self.start(layer, run.iter().map(|g| g.0), need) {
                    Ok(p) => pinned.push(p),
                    Err(e) => {
                        // Reads already submitted write into their slots: wait before letting go.
                        for p in &pinned {
                            let waited = p.batch.wait(&self.source());
                            self.finish(p, waited.is_ok(), need);
                        }
                        return Err(e);
                    }
                }
            }
            if let Some(ids) = next.take() {
                self.start_ahead(layer + 1, ids, chunk.len());
            }
            let arena = self
                .cache
                .lock()
                .map(|c| c.arena())
                .map_err(|_| poisoned())?;
            let addrs: Vec<Vec<usize>> = {
                let cache = self.cache.lock().map_err(|_| poisoned())?;
                let addr = |p: &Pinned| p.slots.iter().map(|&s| cache.addr(s) as usize).collect();
                pinned.iter().map(addr).collect()
            };
            let work: Vec<_> = chunk.chunks(per).zip(pinned.iter().zip(&addrs)).collect();
            // Per task: whether its reads succeeded, when they were in, and its sum.
            let parts: Vec<(bool, Instant, Result<Vec<f32>>)> =
                work.par_iter()
                    .map(|(groups, (p, addrs))| {
                        let waited = p.batch.wait(&self.source());
                        let read = Instant::now();
                        if let Err(e) = waited {
                            return (false, read, Err(e));
                        }
                        let mut y = vec![0.0f32; dim];
                        let sum = groups.iter().zip(addrs.iter()).try_for_each(
                            |((k, local, a), &addr)| {
                                // SAFETY: the slot is pinned with `need` valid bytes (its read was
                                // waited for above) until released below, after every view of it is
                                // dropped; the arena outlives them.
                                let rows =
                                    unsafe { self.views(l, addr as *const u8, full, &arena)? };
                                // The bias of the cluster's neurons (the last cluster may be partial).
                                let first = *k as usize * c;
                                let b = bias.map(|b| &b[first..(first + c).min(b.len())]);
                                cluster_ffn(&rows, act, b, xn, local, a, &mut y)
                            },
                        );
                        (true, read, sum.map(|()| y))
                    })
                    .collect();
            let last_read = parts.iter().map(|p| p.1).max().unwrap_or(t0);
            self.count(&pinned, need, last_read.duration_since(t0).as_secs_f64());
            for (p, part) in pinned.iter().zip(&parts) {
                self.finish(p, part.0, need);
            }
            for (_, _, y) in parts {
                out.iter_mut().zip(y?).for_each(|(o, v)| *o += v);
            }
        }
        Ok(())
    }

    /// The `active` neurons (of a layer of `neurons`) by cluster, in cluster order: (cluster,
    /// local ids, the value each carries), and whether their gate rows are read too (Listed,
    /// Scaled).
    fn cluster_groups(
        &self,
        active: Active<'_>,
        neurons: usize,
    ) -> Result<(Vec<ClusterGroup>, bool)> {
        let c = self.layout.cluster;
        // The active neurons of each cluster: (cluster, local ids, activations when known).
        // The values each neuron carries: its activation (Firing), or a factor on the one its
        // gate row gives (Scaled; 1 when Listed).
        let (ids, vals, full) = match active {
            Active::Firing(ids, acts) => (ids, Some(acts), false),
            Active::Listed(ids) => (ids, None, true),
            Active::Scaled(ids, scales) => (ids, Some(scales), true),
        };
        ensure!(
            vals.is_none_or(|a| a.len() == ids.len()),
            Shape,
            "{} values for {} neurons",
            vals.map_or(0, |a| a.len()),
            ids.len()
        );
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        let mut groups: Vec<ClusterGroup> = Vec::new();
        for i in order {
            let id = ids[i] as usize;
            ensure!(id < neurons, Shape, "neuron {id} of a layer of {neurons}");
            let k = (id / c) as u32;
            if groups.last().is_none_or(|g| g.0 != k) {
                groups.push((k, Vec::new(), Vec::new()));
            }
            let g = groups.last_mut().expect("pushed above");
            g.1.push((id % c) as u32);
            g.2.push(vals.map_or(1.0, |a| a[i]));
        }
        Ok((groups, full))
    }

    /// The store file's name, for errors.
    fn source(&self) -> String {
        self.path.display().to_string()
    }

    /// Pin the clusters `keys` of `layer` with `need` valid bytes each, reading the misses (all
    /// in flight at once); returns their slots in order.
    fn pin(
        &self,
        layer: usize,
        keys: impl Iterator<Item = u32>,
        need: usize,
    ) -> Result<Vec<usize>> {
        let p = self.start(layer, keys, need)?;
        let t0 = Instant::now();
        let waited = p.batch.wait(&self.source());
        self.count(std::slice::from_ref(&p), need, t0.elapsed().as_secs_f64());
        match waited {
            Ok(()) => {
                if let Ok(mut cache) = self.cache.lock() {
                    p.misses.iter().for_each(|&(s, _)| cache.filled(s, need));
                }
                Ok(p.slots)
            }
            Err(e) => {
                self.finish(&p, false, need);
                Err(e)
            }
        }
    }

    /// Pin the clusters `keys` of `layer` and submit the reads of those not cached (`need`
    /// bytes each), without waiting for them. On an error nothing stays pinned.
    fn start(&self, layer: usize, keys: impl Iterator<Item = u32>, need: usize) -> Result<Pinned> {
        let l = &self.layout.layers[layer];
        let mut cache = self.cache.lock().map_err(|_| poisoned())?;
        let mut slots = Vec::new();
        let mut misses = Vec::new();
        for k in keys {
            match cache.acquire((layer as u32, k), need) {
                Ok(Slot::Hit(s)) => slots.push(s),
                Ok(Slot::Miss(s)) => {
                    slots.push(s);
                    misses.push((s, k));
                }
                Err(e) => {
                    misses.iter().for_each(|&(s, _)| cache.forget(s));
                    slots.iter().for_each(|&s| cache.release(s));
                    return Err(e);
                }
            }
        }
        let batch = Batch::new(misses.len());
        for &(s, k) in &misses {
            // SAFETY: slot s is pinned (no view, no other read) and holds `need` <= its bytes,
            // aligned to ALIGN, until the batch is waited for (`ffn`, `pin`).
            unsafe {
                self.io
                    .submit(l.cluster_offset(k as usize), need, cache.addr(s), &batch)
            };
        }
        Ok(Pinned {
            slots,
            misses,
            batch,
        })
    }

    /// After `p`'s reads were waited for: its read slots marked filled (`ok`) or forgotten,
    /// and every slot released.
    fn finish(&self, p: &Pinned, ok: bool, need: usize) {
        if let Ok(mut cache) = self.cache.lock() {
            for &(s, _) in &p.misses {
                if ok {
                    cache.filled(s, need);
                } else {
                    cache.forget(s);
                }
            }
            p.slots.iter().for_each(|&s| cache.release(s));
        }
    }

    /// Add `pinned`'s hits, misses and bytes to the counts, and `read_s` seconds of reading.
    fn count(&self, pinned: &[Pinned], need: usize, read_s: f64) {
        if let Ok(mut st) = self.stats.lock() {
            for p in pinned {
                st.hits += (p.slots.len() - p.misses.len()) as u64;
                st.misses += p.misses.len() as u64;
                st.bytes_read += (p.misses.len() * need) as u64;
            }
            st.read_s += read_s;
        }
    }

    /// Weight views of one cluster in a slot at `addr`.
    ///
    /// # Safety
    /// `addr` is a pinned slot holding the cluster's first `up_down_bytes` (and, with `full`,
    /// all of its bytes), unchanged while the views live; `arena` owns that memory.
    unsafe fn views(
        &self,
        l: &format::LayerLayout,
        addr: *const u8,
        full: bool,
        arena: &Arc<Arena>,
    ) -> Result<ClusterRows> {
        let (c, dim) = (self.layout.cluster, self.layout.dim);
        let [g_rb, u_rb, d_rb] = l.row_bytes;
        let owner: Arc<dyn Send + Sync> = arena.clone();
        // SAFETY: per the caller, these ranges lie inside the pinned slot and stay unchanged.
        let view = |at: usize, len: usize| unsafe {
            Buffer::borrowed(addr.add(at), len, Arc::clone(&owner))
        };
        Ok(ClusterRows {
            up: match l.up {
                Some(d) => Some(Weight::new(d, c, dim, view(0, c * u_rb))?),
                None => None,
            },
            down: Weight::new(l.down, c, dim, view(c * u_rb, c * d_rb))?,
            gate: match full {
                true => Some(Weight::new(
                    l.gate,
                    c,
                    dim,
                    view(l.up_down_bytes, c * g_rb),
                )?),
                false => None,
            },
        })
    }
}

impl Drop for NeuronStore {
    fn drop(&mut self) {
        // The readers finish their queue before the cache's arena goes (`io` is dropped first);
        // landing the read-ahead says so here too.
        self.land_ahead(usize::MAX);
    }
}

fn poisoned() -> powerinfer_core::Error {
    powerinfer_core::Error::Other("the neuron cache's lock was poisoned".into())
}

/// One cluster's part of the FFN for its active `local` rows: with the gate rows (predictor
/// mode, dense experts), their gate values and activation (plus the cluster's `bias`) times the
/// factors `a`, keeping those that fire; else the given activations `a`; then the up rows
/// (gated FFNs) and the down_t rows, summed into `y`.
fn cluster_ffn(
    rows: &ClusterRows,
    act: FfnKind,
    bias: Option<&[f32]>,
    xn: &[f32],
    local: &[u32],
    a: &[f32],
    y: &mut [f32],
) -> Result<()> {
    let (mut idx, mut vals) = (
        Vec::with_capacity(local.len()),
        Vec::with_capacity(local.len()),
    );
    match &rows.gate {
        Some(gate) => {
            let mut g = vec![0.0f32; local.len()];
            matvec_rows(gate, xn, local, &mut g)?;
            for ((&j, &g), &f) in local.iter().zip(&g).zip(a) {
                let v = act.apply(g + bias.map_or(0.0, |b| b[j as usize]));
                if v != 0.0 {
                    idx.push(j);
                    vals.push(v * f);
                }
            }
        }
        None => {
            idx.extend_from_slice(local);
            vals.extend_from_slice(a);
        }
    }
    if let (true, Some(up)) = (act.gated, &rows.up) {
        let mut u = vec![0.0f32; idx.len()];
        matvec_rows(up, xn, &idx, &mut u)?;
        vals.iter_mut()
            .zip(&u)
            .for_each(|(h, &u)| *h = act.times_up(*h, u));
    }
    axpy_rows(&rows.down, &idx, &vals, y)
}
