//! The key/value cache: per layer, one row of `kv_dim` keys and one of values per position,
//! grown in steps as the context fills so short sessions stay small.
//!
//! Its precisions ([`KvTypes`]: one for the keys, one for the values) are one setting shared by
//! the CPU and the GPU layers: f16 by default, as llama.cpp's, f32 on request, or ggml's q8_0,
//! q4_0 and q4_1 blocks along `head_dim` (CPU only for now). At f16 and f32 the CPU side holds
//! its rows as f32 in memory (its float attention kernels read f32); at f16 every value is
//! rounded to the nearest f16 (ties to even, as the GPU's `kv_store` does) when written, so both
//! sides attend over the same numbers and a row moved between them is exact. A block side holds
//! ggml's bytes, quantized when a position is written by ggml's reference rounding.

use powerinfer_core::quantize::quantize_row;
use powerinfer_core::{ensure, Result};
pub use powerinfer_core::{KvPrecision, KvTypes};
use powerinfer_cpu::KvRows;

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

/// One layer's keys (or values) for every position held: f32 values (f16 or f32 precision) or
/// ggml block bytes (q8_0, q4_0, q4_1), `kv_dim` values per position.
#[derive(Debug)]
enum Rows {
    Float(Vec<f32>),
    Blocks(Vec<u8>),
}

/// The rows of one side (keys or values) of every layer, at one precision.
#[derive(Debug)]
struct Side {
    precision: KvPrecision,
    layers: Vec<Rows>,
}

impl Side {
    fn new(precision: KvPrecision, n_layers: usize) -> Side {
        let empty = || match precision.is_quantized() {
            true => Rows::Blocks(Vec::new()),
            false => Rows::Float(Vec::new()),
        };
        Side {
            precision,
            layers: (0..n_layers).map(|_| empty()).collect(),
        }
    }

    /// Bytes of one position of one layer as a snapshot holds it (f16 values at f16).
    fn position_bytes(&self, kv_dim: usize) -> usize {
        self.precision.row_bytes(kv_dim)
    }

    /// Room for `positions` positions in every layer.
    fn resize(&mut self, positions: usize, kv_dim: usize) {
        let bytes = positions * self.position_bytes(kv_dim);
        for rows in &mut self.layers {
            match rows {
                Rows::Float(v) => v.resize(positions * kv_dim, 0.0),
                Rows::Blocks(b) => b.resize(bytes, 0),
            }
        }
    }

    /// Positions `start..` of `layer` from `src` (whole rows), rounded or quantized.
    fn write(&mut self, layer: usize, start: usize, kv_dim: usize, src: &[f32]) {
        let p = self.precision;
        match &mut self.layers[layer] {
            Rows::Float(v) => {
                let rows = &mut v[start * kv_dim..start * kv_dim + src.len()];
                rows.copy_from_slice(src);
                round(p, rows);
            }
            Rows::Blocks(b) => {
                let rb = p.row_bytes(kv_dim);
                let dst = &mut b[start * rb..(start + src.len() / kv_dim.max(1)) * rb];
                for (row, out) in src.chunks_exact(kv_dim).zip(dst.chunks_exact_mut(rb)) {
                    // Whole blocks: the session checked kv_dim against the block size.
                    let _ = quantize_row(p.dtype(), row, out);
                }
            }
        }
    }

    /// Positions `0..n` of `layer` as the attention kernels read them.
    fn rows(&self, layer: usize, n: usize, kv_dim: usize) -> KvRows<'_> {
        match &self.layers[layer] {
            Rows::Float(v) => KvRows::F32(&v[..n * kv_dim]),
            Rows::Blocks(b) => KvRows::Blocks(
                self.precision.dtype(),
                &b[..n * self.position_bytes(kv_dim)],
            ),
        }
    }

    /// Positions `0..n` of `layer` as snapshot bytes onto `out`.
    fn snapshot(&self, layer: usize, n: usize, kv_dim: usize, out: &mut Vec<u8>) {
        match &self.layers[layer] {
            Rows::Float(v) => {
                let rows = &v[..n * kv_dim];
                match self.precision {
                    KvPrecision::F32 => out.extend(rows.iter().flat_map(|x| x.to_le_bytes())),
                    _ => out.extend(
                        rows.iter()
                            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes()),
                    ),
                }
            }
            Rows::Blocks(b) => out.extend_from_slice(&b[..n * self.position_bytes(kv_dim)]),
        }
    }

    /// Positions `0..` of `layer` from snapshot bytes `src` (room already made).
    fn restore(&mut self, layer: usize, src: &[u8]) {
        let p = self.precision;
        match &mut self.layers[layer] {
            Rows::Float(v) if p == KvPrecision::F32 => {
                for (d, b) in v.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Rows::Float(v) => {
                for (d, b) in v.iter_mut().zip(src.chunks_exact(2)) {
                    *d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            Rows::Blocks(b) => b[..src.len()].copy_from_slice(src),
        }
    }

    /// Bytes allocated.
    fn allocated_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|r| match r {
                Rows::Float(v) => v.len() * 4,
                Rows::Blocks(b) => b.len(),
            })
            .sum()
    }
}

/// Keys and values of every layer for positions `0..len`.
#[derive(Debug)]
pub struct KvCache {
    kv_dim: usize,
    capacity: usize,
    len: usize,
    /// Positions the rows have room for.
    room: usize,
    keys: Side,
    values: Side,
    /// The values are the leading part of each key row, held once (multi-head latent
    /// attention: the key row is `c_kv` then `k_pe`, the value `c_kv`); the value side holds
    /// nothing.
    latent: bool,
}

impl KvCache {
    /// An empty cache for `n_layers` layers of width `kv_dim`, holding at most `capacity`
    /// positions at the default precision (f16).
    pub fn new(n_layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        let t = KvTypes::default();
        KvCache {
            kv_dim,
            capacity,
            len: 0,
            room: 0,
            keys: Side::new(t.k, n_layers),
            values: Side::new(t.v, n_layers),
            latent: false,
        }
    }

    /// An empty latent cache ([`KvCache::new`]): one row of `kv_dim` per position and layer
    /// whose leading part the attention reads as the value (multi-head latent attention); its
    /// precision is f16 or f32, keys and values alike.
    pub fn latent(n_layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        KvCache {
            latent: true,
            ..KvCache::new(n_layers, kv_dim, capacity)
        }
    }

    /// Whether the values are read from the key rows ([`KvCache::latent`]).
    pub fn is_latent(&self) -> bool {
        self.latent
    }

    /// The precision of the keys and of the values held.
    pub fn types(&self) -> KvTypes {
        KvTypes {
            k: self.keys.precision,
            v: self.values.precision,
        }
    }

    /// Hold keys and values at `t` from now on; the positions held are forgotten (their values
    /// were rounded for the old precision), and so is the memory.
    /// [`Unsupported`](powerinfer_core::Error::Unsupported) for a block format when `kv_dim`
    /// is no whole number of blocks (the session checks `head_dim` too).
    pub fn set_types(&mut self, t: KvTypes) -> Result<()> {
        ensure!(
            !self.latent || (!t.is_quantized() && t.k == t.v),
            Unsupported,
            "a {} KV cache for latent attention (DeepSeek-V2/V3): its one row per position is \
             keys and values at once, kept f16 or f32",
            t.name()
        );
        t.check_head_dim(self.kv_dim)?;
        let n_layers = self.keys.layers.len();
        self.keys = Side::new(t.k, n_layers);
        self.values = Side::new(t.v, n_layers);
        self.len = 0;
        self.room = 0;
        Ok(())
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
        if need > self.room {
            let grow_to = (need.div_ceil(GROW_STEP) * GROW_STEP).min(self.capacity);
            self.keys.resize(grow_to, self.kv_dim);
            if !self.latent {
                self.values.resize(grow_to, self.kv_dim);
            }
            self.room = grow_to;
        }
        Ok(())
    }

    /// Write keys and values for positions `start..start+n` of `layer` (n rows each), rounded
    /// to f16 or quantized to blocks as the precision says. A latent cache takes the keys
    /// alone (`v` is not read).
    pub fn write(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        self.keys.write(layer, start, self.kv_dim, k);
        if !self.latent {
            self.values.write(layer, start, self.kv_dim, v);
        }
    }

    /// Keys and values of `layer` for positions `0..n`, as the attention kernels read them.
    pub fn rows(&self, layer: usize, n: usize) -> (KvRows<'_>, KvRows<'_>) {
        if self.latent {
            let k = self.keys.rows(layer, n, self.kv_dim);
            return (k, k);
        }
        (
            self.keys.rows(layer, n, self.kv_dim),
            self.values.rows(layer, n, self.kv_dim),
        )
    }

    /// Keys and values of `layer` for positions `0..n` as f32 values (both sides f16 or f32;
    /// [`Unsupported`](powerinfer_core::Error::Unsupported) for block formats).
    pub fn layer(&self, layer: usize, n: usize) -> Result<(&[f32], &[f32])> {
        match self.rows(layer, n) {
            (KvRows::F32(k), KvRows::F32(v)) => Ok((k, v)),
            _ => powerinfer_core::bail!(
                Unsupported,
                "a {} KV cache read as f32 values",
                self.types().name()
            ),
        }
    }

    /// Mark positions `0..len` as valid (after a forward pass wrote them).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// Forget positions from `len` on (keeps the memory).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes per position of a [`KvCache::snapshot`]: every layer's key and value rows at
    /// their precisions (2 bytes a value at f16, 4 at f32, ggml's blocks for q8_0/q4_0/q4_1).
    pub fn snapshot_bytes_per_position(&self) -> usize {
        let layers = self.keys.layers.len();
        match self.latent {
            true => layers * self.keys.position_bytes(self.kv_dim),
            false => layers * self.types().position_bytes(self.kv_dim),
        }
    }

    /// Positions `0..n` (n ≤ [`KvCache::len`]) as bytes: per layer its keys then its values,
    /// at their precisions (f16/f32 little-endian, blocks as stored; exact: values were
    /// rounded or quantized when written).
    pub fn snapshot(&self, n: usize) -> Result<Vec<u8>> {
        ensure!(
            n <= self.len,
            Shape,
            "a snapshot of {n} positions from a cache holding {}",
            self.len
        );
        let mut out = Vec::with_capacity(n * self.snapshot_bytes_per_position());
        for l in 0..self.keys.layers.len() {
            self.keys.snapshot(l, n, self.kv_dim, &mut out);
            if !self.latent {
                self.values.snapshot(l, n, self.kv_dim, &mut out);
            }
        }
        Ok(out)
    }

    /// Make the cache exactly the `n` positions of a [`KvCache::snapshot`] (`data` of this
    /// cache's shape and precisions; a [`Shape`](powerinfer_core::Error::Shape) error, and the
    /// cache unchanged, otherwise).
    pub fn restore(&mut self, data: &[u8], n: usize) -> Result<()> {
        let want = n.checked_mul(self.snapshot_bytes_per_position());
        ensure!(
            want == Some(data.len()),
            Shape,
            "a KV snapshot of {} bytes is not {n} positions of this cache ({} bytes each at {})",
            data.len(),
            self.snapshot_bytes_per_position(),
            self.types().name()
        );
        ensure!(
            n <= self.capacity,
            ContextOverflow,
            "a KV snapshot of {n} positions exceeds the context of {} tokens",
            self.capacity
        );
        self.len = 0;
        self.reserve(n)?;
        let (kb, vb) = (
            n * self.keys.position_bytes(self.kv_dim),
            n * self.values.position_bytes(self.kv_dim) * usize::from(!self.latent),
        );
        let mut at = 0;
        for l in 0..self.keys.layers.len() {
            self.keys.restore(l, &data[at..at + kb]);
            if !self.latent {
                self.values.restore(l, &data[at + kb..at + kb + vb]);
            }
            at += kb + vb;
        }
        self.len = n;
        Ok(())
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        self.keys.allocated_bytes() + self.values.allocated_bytes()
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
        let (k, v) = c.layer(1, 3).unwrap();
        assert_eq!(k, &[1.0; 12]);
        assert_eq!(v, &[2.0; 12]);
        c.reserve(297).unwrap();
        c.set_len(300);
        assert!(matches!(c.reserve(1), Err(Error::ContextOverflow(_))));
        c.truncate(10);
        assert_eq!(c.len(), 10);
    }

    #[test]
    fn snapshot_restores_every_value_at_every_precision() {
        let mut types: Vec<KvTypes> = KvPrecision::ALL.map(KvTypes::both).to_vec();
        types.push(KvTypes::from_name("q8_0/f16").unwrap());
        types.push(KvTypes::from_name("f32/q4_1").unwrap());
        for p in types {
            let mut c = KvCache::new(3, 64, 40);
            c.set_types(p).unwrap();
            c.reserve(7).unwrap();
            let mut s = 7u32;
            for l in 0..3 {
                let mut row = || {
                    (0..7 * 64)
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
            let mut d = KvCache::new(3, 64, 40);
            d.set_types(p).unwrap();
            d.reserve(9).unwrap();
            d.set_len(9);
            d.restore(&snap, 6).unwrap();
            assert_eq!(d.len(), 6);
            assert_eq!(
                snap.len(),
                6 * 3 * p.position_bytes(64),
                "{p:?}: the bytes of its types"
            );
            assert_eq!(d.snapshot(6).unwrap(), snap, "{p:?}: the same bytes again");
            if !p.is_quantized() {
                for l in 0..3 {
                    assert_eq!(d.layer(l, 6).unwrap(), c.layer(l, 6).unwrap(), "{p:?} {l}");
                }
            }
            assert!(matches!(c.snapshot(8), Err(Error::Shape(_))));
            assert!(matches!(d.restore(&snap[1..], 6), Err(Error::Shape(_))));
            assert!(matches!(d.restore(&snap, 5), Err(Error::Shape(_))));
            assert_eq!(d.len(), 6, "a refused restore changes nothing");
        }
    }

    #[test]
    fn a_latent_cache_holds_one_row_read_as_keys_and_values() {
        let mut c = KvCache::latent(2, 8, 300);
        c.reserve(3).unwrap();
        assert_eq!(c.allocated_bytes(), 2 * 256 * 8 * 4, "the key rows alone");
        let k: Vec<f32> = (0..24).map(|i| i as f32 * 0.5).collect();
        c.write(1, 0, &k, &[]);
        c.set_len(3);
        let (keys, values) = c.layer(1, 3).unwrap();
        assert_eq!((keys, values), (&k[..], &k[..]));
        assert_eq!(c.snapshot_bytes_per_position(), 2 * 8 * 2, "f16 key rows");
        let snap = c.snapshot(3).unwrap();
        let mut d = KvCache::latent(2, 8, 300);
        d.restore(&snap, 3).unwrap();
        assert_eq!(d.layer(1, 3).unwrap().0, &k[..]);
        let q8 = KvTypes::both(KvPrecision::Q8_0);
        assert!(matches!(c.set_types(q8), Err(Error::Unsupported(_))));
        let mixed = KvTypes::from_name("f32/f16").unwrap();
        assert!(matches!(c.set_types(mixed), Err(Error::Unsupported(_))));
        c.set_types(KvTypes::both(KvPrecision::F32)).unwrap();
        assert_eq!(c.snapshot_bytes_per_position(), 2 * 8 * 4);
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
        assert_eq!(c.layer(0, 1).unwrap(), (&f16[..], &f16[..]));
        c.set_types(KvTypes::both(KvPrecision::F32)).unwrap();
        assert_eq!(c.len(), 0);
        c.reserve(1).unwrap();
        c.write(0, 0, &x, &x);
        assert_eq!(c.layer(0, 1).unwrap(), (&x[..], &x[..]));
    }

    #[test]
    fn block_precisions_hold_ggml_blocks_of_what_they_write() {
        let x: Vec<f32> = (0..2 * 64)
            .map(|i| ((i * 37) % 101) as f32 / 13.0 - 3.0)
            .collect();
        for p in [KvPrecision::Q8_0, KvPrecision::Q4_0, KvPrecision::Q4_1] {
            let mut c = KvCache::new(2, 64, 300);
            c.set_types(KvTypes {
                k: p,
                v: KvPrecision::F16,
            })
            .unwrap();
            c.reserve(2).unwrap();
            c.write(1, 0, &x, &x);
            c.set_len(2);
            let mut want = vec![0u8; 2 * p.row_bytes(64)];
            for (row, out) in x.chunks(64).zip(want.chunks_mut(p.row_bytes(64))) {
                quantize_row(p.dtype(), row, out).unwrap();
            }
            match c.rows(1, 2) {
                (KvRows::Blocks(dt, k), KvRows::F32(_)) => {
                    assert_eq!((dt, k), (p.dtype(), &want[..]), "{p:?}");
                }
                other => panic!("{p:?}: {other:?}"),
            }
            assert!(matches!(c.layer(1, 2), Err(Error::Unsupported(_))));
            assert_eq!(c.allocated_bytes(), 2 * 256 * (p.row_bytes(64) + 64 * 4));
        }
        let mut c = KvCache::new(1, 48, 8);
        let q = KvTypes::both(KvPrecision::Q8_0);
        assert!(matches!(c.set_types(q), Err(Error::Unsupported(_))));
    }
}
