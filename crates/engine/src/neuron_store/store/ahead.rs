//! Reading the next layer's clusters ahead of its FFN: started once this layer's clusters are
//! pinned, landed (or forgotten) by the next layer's FFN. Never changes a result, only what is
//! cached.

use std::collections::HashSet;

use super::{Ahead, NeuronStore, Pinned};
use crate::neuron_store::cache::Slot;
use crate::neuron_store::io::Batch;

impl NeuronStore {
    /// Wait for a read-ahead and let its slots go (filled, or forgotten where a read failed:
    /// the layer reads them again and reports the error). Returns its clusters where it was
    /// for `layer`.
    pub(super) fn land_ahead(&self, layer: usize) -> HashSet<u32> {
        let Some(a) = self.ahead.lock().ok().and_then(|mut a| a.take()) else {
            return HashSet::new();
        };
        let ok = a.pinned.batch.wait(&self.source()).is_ok();
        self.finish(&a.pinned, ok, a.need);
        match ok && a.layer == layer {
            true => a.pinned.misses.iter().map(|&(_, k)| k).collect(),
            false => HashSet::new(),
        }
    }

    /// Start reading the clusters of the neurons `ids` (sorted) of `layer` that the cache
    /// lacks, into at most half of its free slots, leaving `pinned` slots (in use now) and one
    /// more alone. Nothing happens past the last layer, or when no slot is to be had.
    pub(super) fn start_ahead(&self, layer: usize, ids: &[u32], pinned: usize) {
        let Some(l) = self.layout.layers.get(layer) else {
            return;
        };
        let (c, need) = (self.layout.cluster as u32, l.cluster_bytes);
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        let free = cache.free_slots();
        let room = (free / 2).min(free.saturating_sub(pinned + 1));
        let mut misses = Vec::new();
        let mut last = None;
        for k in ids.iter().map(|&id| id / c) {
            if last == Some(k) || (k as usize) >= l.n_clusters {
                continue;
            }
            last = Some(k);
            let key = (layer as u32, k);
            if cache.touch(key) {
                continue;
            }
            if misses.len() >= room {
                break;
            }
            match cache.acquire(key, need) {
                Ok(Slot::Miss(s)) => misses.push((s, k)),
                Ok(Slot::Hit(s)) => cache.release(s),
                Err(_) => break,
            }
        }
        if misses.is_empty() {
            return;
        }
        let batch = Batch::new(misses.len());
        for &(s, k) in &misses {
            // SAFETY: slot s is pinned (no view, no other read) and holds `need` <= its bytes,
            // aligned to ALIGN, until the batch is waited for (`land_ahead`).
            unsafe {
                self.io
                    .submit(l.cluster_offset(k as usize), need, cache.addr(s), &batch)
            };
        }
        drop(cache);
        if let Ok(mut st) = self.stats.lock() {
            st.ahead += misses.len() as u64;
            st.bytes_read += (misses.len() * need) as u64;
        }
        let slots = misses.iter().map(|&(s, _)| s).collect();
        let pinned = Pinned {
            slots,
            misses,
            batch,
        };
        if let Ok(mut a) = self.ahead.lock() {
            *a = Some(Ahead {
                layer,
                need,
                pinned,
            });
        }
    }
}
