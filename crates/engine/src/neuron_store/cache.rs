//! The neuron store's cache: a fixed RAM budget of cluster-sized slots in one aligned arena.
//! Resident slots hold the hot clusters, loaded once and never evicted (PowerInfer-2's hot
//! neurons kept in memory); the others go least recently used first. A slot in use is pinned
//! (out of the recency list) until it is released, so a read never lands in memory a computation
//! is reading.

use std::collections::HashMap;
use std::sync::Arc;

use powerinfer_core::{ensure, PageBuf, Result};

use super::format::ALIGN;

/// No slot.
const NIL: usize = usize::MAX;

/// The arena's owner: kept alive by the cache and by every weight view into a slot.
pub(super) struct Arena {
    _buf: PageBuf,
}

/// A cluster of one layer.
pub(super) type Key = (u32, u32);

/// What [`Cache::acquire`] found.
pub(super) enum Slot {
    /// The slot holds the cluster's bytes already.
    Hit(usize),
    /// The slot is the cluster's now; its bytes are to be read.
    Miss(usize),
}

/// Slots of `slot_bytes`, each holding one cluster (or its first part) of one layer.
pub(super) struct Cache {
    slot_bytes: usize,
    base: *mut u8,
    arena: Arc<Arena>,
    map: HashMap<Key, usize>,
    keys: Vec<Option<Key>>,
    /// Bytes of each slot's cluster that are valid (its first part, or all of it).
    valid: Vec<usize>,
    /// Slots holding resident clusters (never evicted, never in the recency list).
    resident: Vec<bool>,
    n_resident: usize,
    prev: Vec<usize>,
    next: Vec<usize>,
    /// Most recently released.
    head: usize,
    /// Least recently released: the next to be evicted.
    tail: usize,
}

// SAFETY: `base` points into the arena the cache owns (through `arena`); the cache hands out
// slot addresses only for slots it has pinned, and is itself used behind a mutex.
unsafe impl Send for Cache {}

impl Cache {
    /// A cache of `budget` bytes in slots of `slot_bytes` (a multiple of [`ALIGN`]);
    /// `Error::Shape` when the budget holds no slot.
    pub(super) fn new(budget: usize, slot_bytes: usize) -> Result<Cache> {
        ensure!(
            slot_bytes > 0 && slot_bytes.is_multiple_of(ALIGN),
            Shape,
            "slots of {slot_bytes} bytes"
        );
        let n = budget / slot_bytes;
        ensure!(
            n > 0,
            Shape,
            "a neuron cache of {budget} bytes holds no cluster of {slot_bytes} bytes; give it at \
             least that"
        );
        if let Some(total) = powerinfer_core::pages::physical_memory() {
            ensure!(
                budget <= total,
                Shape,
                "a neuron cache of {budget} bytes is more than this machine's memory ({total} \
                 bytes)"
            );
        }
        let mut buf = PageBuf::try_zeroed(n * slot_bytes + ALIGN)?;
        let raw = buf.as_mut_slice().as_mut_ptr();
        let base = raw.wrapping_add(raw.align_offset(ALIGN));
        let mut c = Cache {
            slot_bytes,
            base,
            arena: Arc::new(Arena { _buf: buf }),
            map: HashMap::new(),
            keys: vec![None; n],
            valid: vec![0; n],
            resident: vec![false; n],
            n_resident: 0,
            prev: vec![NIL; n],
            next: vec![NIL; n],
            head: NIL,
            tail: NIL,
        };
        for s in 0..n {
            c.push_front(s);
        }
        Ok(c)
    }

    /// Slots.
    pub(super) fn slots(&self) -> usize {
        self.keys.len()
    }

    /// Slots that are not resident: how many clusters can be read into the cache at once.
    pub(super) fn free_slots(&self) -> usize {
        self.keys.len() - self.n_resident
    }

    /// Slots holding resident clusters.
    pub(super) fn resident_slots(&self) -> usize {
        self.n_resident
    }

    /// Make the (pinned, filled) slot `s` resident: it stays, out of the recency list, and
    /// [`Cache::release`] leaves it there.
    pub(super) fn make_resident(&mut self, s: usize) {
        if !self.resident[s] {
            self.resident[s] = true;
            self.n_resident += 1;
        }
    }

    /// The arena (for weight views into pinned slots).
    pub(super) fn arena(&self) -> Arc<Arena> {
        Arc::clone(&self.arena)
    }

    /// Address of slot `s`'s first byte (aligned to [`ALIGN`]).
    pub(super) fn addr(&self, s: usize) -> *mut u8 {
        self.base.wrapping_add(s * self.slot_bytes)
    }

    fn unlink(&mut self, s: usize) {
        let (p, n) = (self.prev[s], self.next[s]);
        match p {
            NIL if self.head == s => self.head = n,
            NIL => return, // not in the list (pinned)
            p => self.next[p] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n] = p,
        }
        self.prev[s] = NIL;
        self.next[s] = NIL;
    }

    fn push_front(&mut self, s: usize) {
        self.prev[s] = NIL;
        self.next[s] = self.head;
        match self.head {
            NIL => self.tail = s,
            h => self.prev[h] = s,
        }
        self.head = s;
    }

    /// Pin the slot of `key` with at least `need` valid bytes: a hit, or the least recently
    /// used unpinned slot, taken over for it (to be read). `Error::Other` when every slot is
    /// pinned (a caller asks for more clusters at once than there are slots).
    pub(super) fn acquire(&mut self, key: Key, need: usize) -> Result<Slot> {
        if let Some(&s) = self.map.get(&key) {
            if self.resident[s] {
                return Ok(Slot::Hit(s)); // resident clusters are whole
            }
            self.unlink(s);
            return Ok(match self.valid[s] >= need {
                true => Slot::Hit(s),
                false => Slot::Miss(s),
            });
        }
        let s = self.tail;
        ensure!(s != NIL, Other, "every slot of the neuron cache is in use");
        self.unlink(s);
        if let Some(old) = self.keys[s].take() {
            self.map.remove(&old);
        }
        self.keys[s] = Some(key);
        self.valid[s] = 0;
        self.map.insert(key, s);
        Ok(Slot::Miss(s))
    }

    /// Whether the cache has a slot for `key` (filled, being read, or pinned); a filled,
    /// unpinned one becomes the most recently used (a read-ahead keeps what it will need).
    pub(super) fn touch(&mut self, key: Key) -> bool {
        let Some(&s) = self.map.get(&key) else {
            return false;
        };
        let listed = self.prev[s] != NIL || self.head == s;
        if listed && !self.resident[s] {
            self.unlink(s);
            self.push_front(s);
        }
        true
    }

    /// Slot `s` now holds `bytes` valid bytes of its cluster.
    pub(super) fn filled(&mut self, s: usize, bytes: usize) {
        self.valid[s] = bytes;
    }

    /// Slot `s`'s read failed: it holds nothing.
    pub(super) fn forget(&mut self, s: usize) {
        if let Some(k) = self.keys[s].take() {
            self.map.remove(&k);
        }
        self.valid[s] = 0;
    }

    /// Unpin slot `s`: the most recently used (a resident slot stays where it is).
    pub(super) fn release(&mut self, s: usize) {
        if !self.resident[s] {
            self.push_front(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_goes_first_and_pinned_slots_stay() {
        let mut c = Cache::new(3 * ALIGN + 17, ALIGN).unwrap();
        assert_eq!(c.slots(), 3);
        assert_eq!(c.addr(1) as usize - c.addr(0) as usize, ALIGN);
        assert_eq!(c.addr(0) as usize % ALIGN, 0);
        let miss = |s: Slot| match s {
            Slot::Miss(s) => s,
            Slot::Hit(_) => panic!("expected a miss"),
        };
        let a = miss(c.acquire((0, 0), 10).unwrap());
        c.filled(a, 10);
        c.release(a);
        let b = miss(c.acquire((0, 1), 10).unwrap());
        c.filled(b, 10);
        c.release(b);
        let d = miss(c.acquire((0, 2), 10).unwrap());
        c.filled(d, 10);
        c.release(d);
        // (0, 0) used again: (0, 1) is now the least recent.
        assert!(matches!(c.acquire((0, 0), 10).unwrap(), Slot::Hit(s) if s == a));
        c.release(a);
        assert_eq!(miss(c.acquire((1, 0), 10).unwrap()), b);
        // A hit with too few valid bytes is a read into the same slot.
        assert!(matches!(c.acquire((0, 2), 20).unwrap(), Slot::Miss(s) if s == d));
        // (1, 0) and (0, 2) pinned: one slot left, then none.
        assert_eq!(miss(c.acquire((2, 0), 10).unwrap()), a);
        assert!(c.acquire((3, 0), 10).is_err());
        c.forget(a);
        c.release(a);
        assert!(matches!(c.acquire((2, 0), 10).unwrap(), Slot::Miss(s) if s == a));
        assert!(Cache::new(ALIGN - 1, ALIGN).is_err());
    }

    #[test]
    fn touch_keeps_a_cluster_and_leaves_pinned_slots_alone() {
        let mut c = Cache::new(2 * ALIGN, ALIGN).unwrap();
        let take = |c: &mut Cache, k: u32| match c.acquire((0, k), 10).unwrap() {
            Slot::Miss(s) => s,
            Slot::Hit(_) => panic!("expected a miss"),
        };
        let a = take(&mut c, 0);
        c.filled(a, 10);
        c.release(a);
        let b = take(&mut c, 1);
        c.filled(b, 10);
        c.release(b);
        // (0, 0) is the least recent; touched, (0, 1) goes first.
        assert!(c.touch((0, 0)));
        assert!(!c.touch((0, 9)));
        assert_eq!(take(&mut c, 2), b);
        // A pinned slot is known, and stays out of the recency list.
        assert!(c.touch((0, 2)));
        assert_eq!(take(&mut c, 3), a);
        assert!(c.acquire((0, 4), 10).is_err());
    }

    #[test]
    fn resident_slots_are_never_evicted() {
        let mut c = Cache::new(2 * ALIGN, ALIGN).unwrap();
        let Slot::Miss(r) = c.acquire((0, 7), 10).unwrap() else {
            panic!("expected a miss")
        };
        c.filled(r, 10);
        c.make_resident(r);
        c.release(r);
        assert_eq!((c.resident_slots(), c.free_slots()), (1, 1));
        for k in 0..5 {
            let Slot::Miss(s) = c.acquire((1, k), 10).unwrap() else {
                panic!("expected a miss")
            };
            assert_ne!(s, r);
            c.release(s);
        }
        assert!(matches!(c.acquire((0, 7), 10).unwrap(), Slot::Hit(s) if s == r));
        c.release(r);
        assert!(matches!(c.acquire((0, 7), 10).unwrap(), Slot::Hit(s) if s == r));
    }
}
