//! The key/value cache: per layer, one f32 row of `kv_dim` keys and one of values per position,
//! grown in steps as the context fills so short sessions stay small.

use powerinfer_core::{ensure, Result};

/// Positions added to the cache at a time when it grows.
const GROW_STEP: usize = 256;

/// Keys and values of every layer for positions `0..len`.
#[derive(Debug)]
pub struct KvCache {
    kv_dim: usize,
    capacity: usize,
    len: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of width `kv_dim`, holding at most `capacity`
    /// positions.
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        KvCache {
            kv_dim,
            capacity,
            len: 0,
            keys: vec![Vec::new(); n_layers],
            values: vec![Vec::new(); n_layers],
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Make room for `n` more positions (an error past the capacity).
    pub fn reserve(&mut self, n: usize) -> Result<()> {
        let need = self.len + n;
        ensure!(
            need <= self.capacity,
            ContextOverflow,
            "{} cached + {n} new tokens exceed the context of {} tokens",
            self.len,
            self.capacity
        );
        let have = self
            .keys
            .first()
            .map_or(0, |k| k.len() / self.kv_dim.max(1));
        if need > have {
            let grow_to = (need.div_ceil(GROW_STEP) * GROW_STEP).min(self.capacity);
            for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
                buf.resize(grow_to * self.kv_dim, 0.0);
            }
        }
        Ok(())
    }

    /// Write keys and values for positions `start..start+n` of `layer` (n rows each).
    pub fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let off = start * self.kv_dim;
        self.keys[layer][off..off + k.len()].copy_from_slice(k);
        self.values[layer][off..off + v.len()].copy_from_slice(v);
    }

    /// Keys and values of `layer` for positions `0..n`.
    pub fn layer(&self, layer: usize, n: usize) -> (&[f32], &[f32]) {
        let end = n * self.kv_dim;
        (&self.keys[layer][..end], &self.values[layer][..end])
    }

    /// Mark positions `0..len` as valid (after a forward pass wrote them).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// Forget positions from `len` on (keeps the memory).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(self.values.iter())
            .map(|b| b.len() * 4)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::Error;

    #[test]
    fn grows_in_steps_and_refuses_overflow() {
        let mut c = KvCache::new(2, 4, 300);
        c.reserve(3).unwrap();
        assert_eq!(c.allocated_bytes(), 2 * 2 * 256 * 4 * 4);
        c.write(1, 0, &[1.0; 12], &[2.0; 12]);
        c.set_len(3);
        let (k, v) = c.layer(1, 3);
        assert_eq!(k, &[1.0; 12]);
        assert_eq!(v, &[2.0; 12]);
        c.reserve(297).unwrap();
        c.set_len(300);
        assert!(matches!(c.reserve(1), Err(Error::ContextOverflow(_))));
        c.truncate(10);
        assert_eq!(c.len(), 10);
    }
}
