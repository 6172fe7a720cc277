//! The key/value cache: per layer, one row of `kv_dim` keys and one of values per position,
//! grown in steps as the context fills so short sessions stay small.
//!
//! Its precision ([`KvPrecision`]) is one setting shared by the CPU and the GPU layers: f16 by
//! default, as llama.cpp's, f32 on request. The CPU side holds its rows as f32 in memory
//! either way (its attention kernels read f32); at f16 every value is rounded to the nearest f16
//! (ties to even, as the GPU's `kv_store` does) when written, so both sides attend over the
//! same numbers and a row moved between them is exact.

pub use powerinfer_core::KvPrecision;
use powerinfer_core::{ensure, Result};

/// Positions added to the cache at a time when it grows.
const GROW_STEP: usize = 256;

/// `v` as precision `p` stores it.
fn round(p: KvPrecision, v: &mut [f32]) {
    if p == KvPrecision::F16 {
        v.iter_mut().for_each(|x| *x = round_to_f16(*x));
    }
}

/// `x` rounded to the nearest f16 value (ties to even; from 65520 on to infinity; NaN and
/// infinities kept), as an f32:
/// `f16::from_f32(x).to_f32()` without a conversion per value, in branch-free f32 and integer
/// arithmetic the compiler vectorises. Normal f16 range: the 13 low mantissa bits rounded off;
/// below it (f16 subnormals, steps of 2^-24): `(x + c) − c` with `c = ±0.5`, whose f32 sum has
/// exactly that step.
#[inline]
pub fn round_to_f16(x: f32) -> f32 {
    const MIN_NORMAL: f32 = 6.103_515_6e-5; // 2^-14
    let b = x.to_bits();
    let normal = f32::from_bits(b.wrapping_add(0x0fff + ((b >> 13) & 1)) & !0x1fff);
    let c = 0.5f32.copysign(x);
    let sub = ((x + c) - c).copysign(x);
    let r = if x.abs() < MIN_NORMAL { sub } else { normal };
    if !x.is_finite() {
        x
    } else if r.abs() >= 65536.0 {
        f32::INFINITY.copysign(x)
    } else {
        r
    }
}

/// Keys and values of every layer for positions `0..len`.
#[derive(Debug)]
pub struct KvCache {
    precision: KvPrecision,
    kv_dim: usize,
    capacity: usize,
    len: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of width `kv_dim`, holding at most `capacity`
    /// positions at the default precision (f16).
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        KvCache {
            precision: KvPrecision::default(),
            kv_dim,
            capacity,
            len: 0,
            keys: vec![Vec::new(); n_layers],
            values: vec![Vec::new(); n_layers],
        }
    }

    /// The precision of the values held.
    pub fn precision(&self) -> KvPrecision {
        self.precision
    }

    /// Hold values at `p` from now on; the positions held are forgotten (their values were
    /// rounded for the old precision).
    pub fn set_precision(&mut self, p: KvPrecision) {
        self.precision = p;
        self.len = 0;
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
    /// At f16 precision the values are rounded to f16.
    pub fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let off = start * self.kv_dim;
        for (dst, src) in [(&mut self.keys[layer], k), (&mut self.values[layer], v)] {
            let rows = &mut dst[off..off + src.len()];
            rows.copy_from_slice(src);
            round(self.precision, rows);
        }
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

    /// Bytes per position of a [`KvCache::snapshot`]: every layer's key and value rows at the
    /// cache's precision (2 bytes a value at f16, 4 at f32).
    pub fn snapshot_bytes_per_position(&self) -> usize {
        let width = match self.precision {
            KvPrecision::F16 => 2,
            KvPrecision::F32 => 4,
        };
        self.keys.len() * 2 * self.kv_dim * width
    }

    /// Positions `0..n` (n ≤ [`KvCache::len`]) as bytes: per layer its keys then its values,
    /// little-endian at the cache's precision (exact: f16 values were rounded when written).
    pub fn snapshot(&self, n: usize) -> Result<Vec<u8>> {
        ensure!(
            n <= self.len,
            Shape,
            "a snapshot of {n} positions from a cache holding {}",
            self.len
        );
        let mut out = Vec::with_capacity(n * self.snapshot_bytes_per_position());
        for (k, v) in self.keys.iter().zip(&self.values) {
            for rows in [k, v] {
                let rows = &rows[..n * self.kv_dim];
                match self.precision {
                    KvPrecision::F16 => out.extend(
                        rows.iter()
                            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()),
                    ),
                    KvPrecision::F32 => out.extend(rows.iter().flat_map(|x| x.to_le_bytes())),
                }
            }
        }
        Ok(out)
    }

    /// Make the cache exactly the `n` positions of a [`KvCache::snapshot`] (`data` of this
    /// cache's shape and precision; a [`Shape`](powerinfer_core::Error::Shape) error, and the
    /// cache unchanged, otherwise).
    pub fn restore(&mut self, data: &[u8], n: usize) -> Result<()> {
        let want = n.checked_mul(self.snapshot_bytes_per_position());
        ensure!(
            want == Some(data.len()),
            Shape,
            "a KV snapshot of {} bytes is not {n} positions of this cache ({} bytes each at {:?})",
            data.len(),
            self.snapshot_bytes_per_position(),
            self.precision
        );
        ensure!(
            n <= self.capacity,
            ContextOverflow,
            "a KV snapshot of {n} positions exceeds the context of {} tokens",
            self.capacity
        );
        self.len = 0;
        self.reserve(n)?;
        let per_rows = data.len() / (2 * self.keys.len()).max(1);
        let mut chunks = data.chunks_exact(per_rows.max(1));
        for (k, v) in self.keys.iter_mut().zip(self.values.iter_mut()) {
            for rows in [k, v] {
                let src = chunks.next().unwrap_or(&[]);
                let dst = &mut rows[..n * self.kv_dim];
                match self.precision {
                    KvPrecision::F16 => {
                        for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                            *d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                        }
                    }
                    KvPrecision::F32 => {
                        for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                            *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        }
                    }
                }
            }
        }
        self.len = n;
        Ok(())
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

    #[test]
    fn snapshot_restores_every_value_at_both_precisions() {
        for p in [KvPrecision::F16, KvPrecision::F32] {
            let mut c = KvCache::new(3, 5, 40);
            c.set_precision(p);
            c.reserve(7).unwrap();
            let mut s = 7u32;
            for l in 0..3 {
                let mut row = || {
                    (0..7 * 5)
                        .map(|_| {
                            s = s.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            (s >> 8) as f32 / 3e5 - 20.0
                        })
                        .collect::<Vec<f32>>()
                };
                let (k, v) = (row(), row());
                c.write(l, 0, &k, &v);
            }
            c.set_len(7);
            let snap = c.snapshot(6).unwrap();
            assert_eq!(snap.len(), 6 * c.snapshot_bytes_per_position());
            let mut d = KvCache::new(3, 5, 40);
            d.set_precision(p);
            d.reserve(9).unwrap();
            d.set_len(9);
            d.restore(&snap, 6).unwrap();
            assert_eq!(d.len(), 6);
            for l in 0..3 {
                assert_eq!(d.layer(l, 6), c.layer(l, 6), "{p:?} layer {l}");
            }
            assert!(matches!(c.snapshot(8), Err(Error::Shape(_))));
            assert!(matches!(d.restore(&snap[1..], 6), Err(Error::Shape(_))));
            assert!(matches!(d.restore(&snap, 5), Err(Error::Shape(_))));
            assert_eq!(d.len(), 6, "a refused restore changes nothing");
        }
    }

    #[test]
    fn round_to_f16_is_the_f16_conversion() {
        let mut bits: Vec<u32> = vec![
            0x3380_0000, // 2^-24, the least subnormal
            0x3300_0000, // 2^-25: a tie, to 0
            0x3340_0000, // 1.5 · 2^-25
            0x3880_0000, // 2^-14, the least normal
            0x387f_ffff, // just below it
            0x477f_e000, // 65504, the largest f16
            0x477f_efff, // just below the tie to infinity
            0x477f_f000, // 65520: a tie, to infinity
            0x7f7f_ffff,
            0x7f80_0000,
            0x3f80_1000, // 1 + 2^-11: a tie, to even (1)
            0x3f80_3000, // 1 + 3 · 2^-11: a tie, to even (up)
        ];
        let mut s = 0x9e37_79b9u32;
        bits.extend((0..1_000_000).map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        }));
        for b in bits {
            for x in [f32::from_bits(b), -f32::from_bits(b)] {
                let want = half::f16::from_f32(x).to_f32();
                let got = round_to_f16(x);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{x:e} ({:#x}): {got:e}, want {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn f16_precision_rounds_what_it_writes() {
        let x = [1.0f32 / 3.0, 65519.0, 1e-8, -2.5];
        let f16 = x.map(|v| half::f16::from_f32(v).to_f32());
        assert_ne!(x, f16);
        let mut c = KvCache::new(1, 4, 8);
        c.reserve(1).unwrap();
        c.write(0, 0, &x, &x);
        assert_eq!(c.layer(0, 1), (&f16[..], &f16[..]));
        c.set_precision(KvPrecision::F32);
        assert_eq!(c.len(), 0);
        c.write(0, 0, &x, &x);
        assert_eq!(c.layer(0, 1), (&x[..], &x[..]));
    }
}
