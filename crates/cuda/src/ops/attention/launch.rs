//! The launches of `kernels/attention.cu`: one struct per kernel, its fields the kernel's
//! parameters in order; the KV-cache kernels take one layer's two caches, whose element type
//! picks the entry (`kv_store` / `kv_store_f32`, ...).

use super::host::{self, Dst, Heads};
use super::kv::{KvCaches, KvCachesMut};
use crate::backend::kernel;
use crate::host::view::{prefix, prefix_mut, product};
use crate::kernels::{kv_entry, KernelSource};
use crate::launch_spec::{grid, LaunchSpec, ELEM_THREADS};
use crate::layout::to_i32;

/// `kernels/attention.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "attention",
    include_str!("../../../kernels/attention.cu"),
    &["attention_merge"],
)
.per_kv_elem(&["kv_store", "attention_decode"]);

/// Warps per block of attention_decode (`ATT_WARPS` in attention.cu), as threads.
pub const ATT_THREADS: u32 = 4 * 32;
/// Query heads per block of attention_decode (`ATT_GROUP` in attention.cu).
pub const ATT_GROUP: usize = 4;

kernel! {
    /// `kv_store` (`kv_store_f32` for f32 caches): row `pos` of both caches = k, v as the cache's
    /// element type stores them (f16: rounded to nearest even).
    struct KvStore<'a, B> {
        k: &'a B::Buf<f32>,
        v: &'a B::Buf<f32>,
        kv_dim: usize,
        pos: usize,
        caches: KvCachesMut<'a, B>,
    }
    entry(k) = kv_entry("kv_store", k.caches.elem());
    spec(mut k, dev, a) {
        // kv_store[_f32](k, v, kv_dim, pos, cache_k, cache_v): row `pos` lies inside both caches.
        let entry = k.entry();
        a.ptr(dev.addr(k.k))
            .ptr(dev.addr(k.v))
            .i32(to_i32(k.kv_dim, "kv_dim")?);
        a.i32(to_i32(k.pos, "pos")?);
        let [ck, cv] = k.caches.addrs_mut(dev);
        a.ptr(ck).ptr(cv);
        LaunchSpec::per_element(&SOURCE, entry, k.kv_dim, a)
    }
    host(k) {
        let keys = prefix(B::data(k.k), k.kv_dim, "k")?;
        let values = prefix(B::data(k.v), k.kv_dim, "v")?;
        match k.caches {
            KvCachesMut::F16 { k: ck, v: cv } => {
                host::kv_store(keys, values, k.pos, B::data_mut(ck), B::data_mut(cv))
            }
            KvCachesMut::F32 { k: ck, v: cv } => {
                host::kv_store(keys, values, k.pos, B::data_mut(ck), B::data_mut(cv))
            }
        }
    }
}

kernel! {
    /// `attention_decode` (`attention_decode_f32` for f32 caches): one query over positions
    /// `first..n_pos` of the caches, grouped-query, scores `(q · scale)·k`, soft-capped by
    /// `softcap` when > 0, with each head's sink logit in `sinks` joining the softmax where
    /// given (gpt-oss), in chunks of `chunk` positions. One chunk: the output to `out`; more:
    /// each chunk's unnormalised output, max and normaliser to `part`
    /// (`[n_heads][n_chunks][head_dim + 2]`, without the sink), for [`AttentionMerge`].
    struct AttentionDecode<'a, B> {
        q: &'a B::Buf<f32>,
        caches: KvCaches<'a, B>,
        first: usize,
        n_pos: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        scale: f32,
        softcap: f32,
        sinks: Option<&'a B::Buf<f32>>,
        chunk: usize,
        part: &'a mut B::Buf<f32>,
        out: &'a mut B::Buf<f32>,
    }
    entry(k) = kv_entry("attention_decode", k.caches.elem());
    spec(k, dev, a) {
        // attention_decode[_f32](q, cache_k, cache_v, first, n_pos, group, head_dim, kv_dim,
        // scale, softcap, sinks, chunk, part, out): block (x, y, z) = query heads x * ATT_GROUP..
        // of the group of KV head y over chunk z; head_dim <= MAX_HEAD_DIM fits the kernel's
        // static shared arrays; first < n_pos; sinks (null: none) holds n_heads floats.
        let entry = k.entry();
        let (n_heads, n_kv_heads, head_dim) = (k.n_heads, k.n_kv_heads, k.head_dim);
        let group = n_heads / n_kv_heads.max(1);
        let [ck, cv] = k.caches.addrs(dev);
        a.ptr(dev.addr(k.q)).ptr(ck).ptr(cv);
        a.i32(to_i32(k.first, "first position")?)
            .i32(to_i32(k.n_pos, "positions")?)
            .i32(to_i32(group, "group")?);
        a.i32(to_i32(head_dim, "head_dim")?)
            .i32(to_i32(n_kv_heads * head_dim, "kv_dim")?);
        a.f32(k.scale)
            .f32(k.softcap)
            .ptr(k.sinks.map_or(0, |s| dev.addr(s)))
            .i32(to_i32(k.chunk, "chunk")?);
        a.ptr(dev.addr_mut(k.part)).ptr(dev.addr_mut(k.out));
        let chunks = grid(k.n_pos.saturating_sub(k.first), k.chunk.max(1))?;
        let blocks = [grid(group, ATT_GROUP)?, to_i32(n_kv_heads, "kv heads")? as u32];
        let mut s = LaunchSpec::new(&SOURCE, entry, blocks, ATT_THREADS, 0, a);
        s.grid[2] = chunks;
        Ok(s)
    }
    host(k) {
        let shape = Heads::new(k.n_heads, k.n_kv_heads, k.head_dim)?;
        let total = product(k.n_heads, k.head_dim, "n_heads × head_dim")?;
        let q = prefix(B::data(k.q), total, "q")?;
        let out = prefix_mut(B::data_mut(k.out), total, "out")?;
        let (positions, params) = (k.first..k.n_pos, [k.scale, k.softcap]);
        let sinks = match k.sinks {
            Some(s) => Some(prefix(B::data(s), k.n_heads, "sinks")?),
            None => None,
        };
        let dst = Dst {
            chunk: k.chunk,
            part: B::data_mut(k.part),
            out,
        };
        match k.caches {
            KvCaches::F16 { k, v } => {
                let caches = [B::data(k), B::data(v)];
                host::attention_decode(&shape, q, caches, positions, params, sinks, dst)
            }
            KvCaches::F32 { k, v } => {
                let caches = [B::data(k), B::data(v)];
                host::attention_decode(&shape, q, caches, positions, params, sinks, dst)
            }
        }
    }
}

kernel! {
    /// `attention_merge`: the chunks' partial states in `part` combined, in chunk order, into
    /// each head's output, each head's sink logit in `sinks` joining the softmax where given.
    struct AttentionMerge<'a, B> {
        part: &'a B::Buf<f32>,
        n_heads: usize,
        head_dim: usize,
        n_chunks: usize,
        sinks: Option<&'a B::Buf<f32>>,
        out: &'a mut B::Buf<f32>,
    }
    entry = "attention_merge";
    spec(k, dev, a) {
        // attention_merge(part, n_chunks, head_dim, sinks, out): a block per head; sinks (null:
        // none) holds n_heads floats.
        a.ptr(dev.addr(k.part))
            .i32(to_i32(k.n_chunks, "chunks")?);
        a.i32(to_i32(k.head_dim, "head_dim")?)
            .ptr(k.sinks.map_or(0, |s| dev.addr(s)))
            .ptr(dev.addr_mut(k.out));
        let blocks = [to_i32(k.n_heads, "heads")? as u32, 1];
        let entry = k.entry();
        Ok(LaunchSpec::new(&SOURCE, entry, blocks, ELEM_THREADS, 0, a))
    }
    host(k) {
        let total = product(k.n_heads, k.head_dim, "n_heads × head_dim")?;
        let sinks = match k.sinks {
            Some(s) => Some(prefix(B::data(s), k.n_heads, "sinks")?),
            None => None,
        };
        let out = prefix_mut(B::data_mut(k.out), total, "out")?;
        host::attention_merge(B::data(k.part), k.n_chunks, k.head_dim, sinks, out)
    }
}
