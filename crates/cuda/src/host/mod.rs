//! The host backend (`device="gpu-sim"`): a [`Backend`] whose buffers live in host memory and
//! whose kernels are plain Rust implementations of each CUDA kernel's contract (slab addressing,
//! padding ids, the f16 KV cache's rounding), so the hybrid executor runs, and is tested, on
//! machines without a GPU. Always built.
//!
//! Memory is accounted as the plan counts device memory: every [`Backend::zeros`] allocation
//! counts `align(len · size_of::<T>())` bytes (256-byte granules) until its buffer is dropped,
//! against an optional capacity (the simulated VRAM; `Error::VramBudget` past it). Launches run
//! synchronously on the calling thread; arguments the CUDA kernel would fault on (indices out
//! of range, short buffers, rows outside their buffer) are `Error::Shape`, never a panic.
//!
//! The kernel families live in their own files, as in `kernels/*.cu`: `rows` (sparse_matvec,
//! gate_up, quantize_x), `axpy`, `compact`, `predictor`, `norm_rope`, `attention` and `elementwise`; `view` holds the
//! checked views of buffers they share (rows through a [`RowLayout`], index lists, neuron
//! flags).
//!
//! [`RowLayout`]: crate::layout::RowLayout

mod attention;
mod axpy;
mod compact;
mod elementwise;
mod norm_rope;
mod predictor;
mod rows;
mod view;

#[cfg(test)]
mod testutil;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use powerinfer_core::{ensure, Error, Result};

use crate::backend::{Backend, Checked, DeviceSlice, Elem, KvCaches, KvCachesMut, Launch};
use crate::layout::{align, ALIGN};
use view::{prefix, prefix_mut, Active, Neurons, Picks, Rows};

/// A simulated GPU in host memory, optionally with a memory capacity (the "VRAM" a plan must
/// fit in; unlimited by default).
#[derive(Debug)]
pub struct HostBackend {
    /// "gpu-sim", or "gpu-emu" for the emulator's memory (in messages).
    name: &'static str,
    capacity: Option<usize>,
    /// Bytes held by live buffers (each rounded up to [`ALIGN`]); shared with every buffer,
    /// which gives its bytes back when dropped.
    allocated: Arc<AtomicUsize>,
}

impl Default for HostBackend {
    fn default() -> HostBackend {
        HostBackend::new()
    }
}

impl HostBackend {
    /// A host backend with no memory limit ([`Backend::mem_info`] then reports the host's RAM).
    pub fn new() -> HostBackend {
        HostBackend {
            name: "gpu-sim",
            capacity: None,
            allocated: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Host memory named `name` in messages, with an optional capacity (the emulator's).
    #[cfg_attr(not(feature = "emu"), allow(dead_code))]
    pub(crate) fn named(name: &'static str, capacity: Option<usize>) -> HostBackend {
        HostBackend {
            name,
            capacity,
            ..HostBackend::new()
        }
    }

    /// A host backend whose live allocations may total at most `bytes` (each rounded up to
    /// 256); an allocation past it is `Error::VramBudget`.
    pub fn with_capacity(bytes: usize) -> HostBackend {
        HostBackend {
            capacity: Some(bytes),
            ..HostBackend::new()
        }
    }

    /// The memory capacity, when one was set.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    fn allocated(&self) -> usize {
        self.allocated.load(Ordering::SeqCst)
    }

    /// Count `bytes` more against the capacity, or say why they do not fit.
    fn reserve(&self, bytes: usize, what: impl Fn() -> String) -> Result<()> {
        let Some(cap) = self.capacity else {
            self.allocated.fetch_add(bytes, Ordering::SeqCst);
            return Ok(());
        };
        self.allocated
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                cur.checked_add(bytes).filter(|&total| total <= cap)
            })
            .map(|_| ())
            .map_err(|cur| {
                Error::VramBudget(format!(
                    "{}: {} needs {bytes} bytes but only {} of the {cap}-byte capacity are \
                     free ({cur} allocated)",
                    self.name,
                    what(),
                    cap.saturating_sub(cur)
                ))
            })
    }
}

/// A buffer of the host backend: its elements in a `Vec`, and the bytes it holds against its
/// backend's count (given back on drop).
pub struct HostBuf<T> {
    data: Vec<T>,
    bytes: usize,
    allocated: Arc<AtomicUsize>,
}

impl<T> HostBuf<T> {
    /// The elements (for tests and host-side inspection; the executor uses [`Backend::read`]).
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }
}

impl<T> std::fmt::Debug for HostBuf<T> {
    /// Length and accounted bytes, not the elements (weights run to gigabytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuf")
            .field("type", &std::any::type_name::<T>())
            .field("len", &self.data.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<T> Drop for HostBuf<T> {
    fn drop(&mut self) {
        self.allocated.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl<T: Send + Sync> DeviceSlice for HostBuf<T> {
    fn len(&self) -> usize {
        self.data.len()
    }
}

/// Total host RAM (MemTotal of /proc/meminfo), the "device memory" of an unlimited backend;
/// half the address space where it cannot be read.
fn host_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(usize::MAX / 2)
}

/// `bytes` for a message: "1.50 GiB", "12.00 MiB", "300 bytes".
fn human(bytes: usize) -> String {
    const MIB: f64 = (1 << 20) as f64;
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (MIB * 1024.0)),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / MIB),
        b => format!("{b} bytes"),
    }
}

/// `at..at + n` inside a buffer of `len`, or a Shape error naming the copy.
fn copy_range(
    name: &str,
    op: &str,
    at: usize,
    n: usize,
    len: usize,
) -> Result<std::ops::Range<usize>> {
    match at.checked_add(n) {
        Some(end) if end <= len => Ok(at..end),
        _ => Err(Error::Shape(format!(
            "{name} {op}: {n} elements at {at} do not fit a buffer of {len}"
        ))),
    }
}

impl Backend for HostBackend {
    type Buf<T: Elem> = HostBuf<T>;

    fn describe(&self) -> String {
        match self.capacity {
            Some(cap) => format!("{} (capacity {})", self.name, human(cap)),
            None => self.name.into(),
        }
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let total = self.capacity.unwrap_or_else(host_memory);
        Ok((total.saturating_sub(self.allocated()), total))
    }

    fn allocated_bytes(&self) -> Option<usize> {
        Some(self.allocated())
    }

    fn zeros<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        let what = || format!("a buffer of {len} {}", std::any::type_name::<T>());
        let bytes = len
            .checked_mul(size_of::<T>())
            .filter(|&b| b <= usize::MAX - ALIGN)
            .map(align)
            .ok_or_else(|| Error::VramBudget(format!("{}: {} is too large", self.name, what())))?;
        self.reserve(bytes, what)?;
        // From here the bytes are counted: the buffer (or the error path) gives them back.
        let mut data = Vec::new();
        if data.try_reserve_exact(len).is_err() {
            self.allocated.fetch_sub(bytes, Ordering::SeqCst);
            return Err(Error::VramBudget(format!(
                "{}: host memory exhausted allocating {} ({bytes} bytes)",
                self.name,
                what()
            )));
        }
        data.resize(len, T::default());
        Ok(HostBuf {
            data,
            bytes,
            allocated: Arc::clone(&self.allocated),
        })
    }

    fn write<T: Elem>(&self, host: &[T], dst: &mut HostBuf<T>, at: usize) -> Result<()> {
        let range = copy_range(self.name, "write", at, host.len(), dst.data.len())?;
        dst.data[range].copy_from_slice(host);
        Ok(())
    }

    fn read<T: Elem>(&self, src: &HostBuf<T>, at: usize, out: &mut [T]) -> Result<()> {
        let range = copy_range(self.name, "read", at, out.len(), src.data.len())?;
        out.copy_from_slice(&src.data[range]);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn addr<T: Elem>(&self, buf: &HostBuf<T>) -> u64 {
        buf.data.as_ptr() as u64
    }

    fn addr_mut<T: Elem>(&self, buf: &mut HostBuf<T>) -> u64 {
        buf.data.as_mut_ptr() as u64
    }

    fn launch(&self, launch: Launch<'_, Self>, _checked: Checked) -> Result<()> {
        let entry = launch.entry();
        run(launch).map_err(|e| match e {
            Error::Shape(m) => Error::Shape(format!("gpu-sim {entry}: {m}")),
            e => e,
        })
    }
}

/// `n`, or with a count buffer (written by a compaction) min(count[0], n); a negative count
/// is 0.
fn counted(count: Option<&HostBuf<i32>>, n: usize) -> Result<usize> {
    let Some(c) = count else {
        return Ok(n);
    };
    let c = prefix(&c.data, 1, "count")?[0];
    Ok(usize::try_from(c).unwrap_or(0).min(n))
}

/// A compaction's count into its one-int buffer.
fn write_count(count: &mut HostBuf<i32>, kept: usize) -> Result<()> {
    let c = prefix_mut(&mut count.data, 1, "count")?;
    c[0] = i32::try_from(kept).map_err(|_| Error::Shape(format!("{kept} entries")))?;
    Ok(())
}

/// One launch, on slices of the buffers.
fn run(launch: Launch<'_, HostBackend>) -> Result<()> {
    match launch {
        Launch::SparseMatvec {
            dtype,
            w,
            l,
            x,
            cols,
            idx,
            n,
            ids,
            flags,
            act,
            accumulate,
            y,
        } => {
            x.check("sparse_matvec", dtype)?;
            let w = Rows::new(&w.data, l, dtype, cols, "w")?;
            let active = match (ids, flags) {
                (_, None) => None,
                (Some((ids, ids_l)), Some(flags)) => {
                    Some(Active::new(&ids.data, ids_l, &flags.data)?)
                }
                (None, Some(_)) => {
                    return Err(Error::Shape("flags given without neuron ids".into()))
                }
            };
            let picks = Picks::new(idx.map(|i| i.data.as_slice()), n)?;
            let x = rows::x_values(&x, cols)?;
            let y = prefix_mut(&mut y.data, n, "y")?;
            rows::sparse_matvec(&w, &x, &picks, active.as_ref(), act, accumulate, y)
        }
        Launch::GateUp {
            dtype,
            w,
            gate_l,
            up_l,
            x,
            cols,
            idx,
            n,
            ids_l,
            flags,
            bias,
            act,
            count,
            h,
        } => {
            x.check("gate_up", dtype)?;
            let n = counted(count, n)?;
            let gate = Rows::new(&w.data, gate_l, dtype, cols, "gate")?;
            let up = up_l
                .map(|l| Rows::new(&w.data, l, dtype, cols, "up"))
                .transpose()?;
            let flags = flags.map(|f| f.data.as_slice());
            let bias = bias.map(|b| b.data.as_slice());
            let neurons = Neurons::new(&w.data, ids_l, flags, bias)?;
            let picks = Picks::new(idx.map(|i| i.data.as_slice()), n)?;
            let x = rows::x_values(&x, cols)?;
            let h = prefix_mut(&mut h.data, n, "h")?;
            rows::gate_up((&gate, up.as_ref()), &x, &picks, &neurons, act, h)
        }
        Launch::QuantizeX { x, cols, xq } => rows::quantize_x(&x.data, cols, &mut xq.data),
        Launch::AxpyRows {
            dtype,
            w,
            l,
            cols,
            idx,
            a,
            n,
            count,
            part,
            y,
            splits,
        } => {
            if splits == 0 {
                return Err(Error::Shape("splits must be > 0".into()));
            }
            let launched = splits;
            let n = counted(count, n)?;
            let splits = match count {
                Some(_) => crate::ops::live_splits(n, launched),
                None => launched,
            };
            let w = Rows::new(&w.data, l, dtype, cols, "w")?;
            let picks = Picks::new(idx.map(|i| i.data.as_slice()), n)?;
            let a = prefix(&a.data, n, "a")?;
            if launched == 1 {
                let y = prefix_mut(&mut y.data, cols, "y")?;
                return axpy::axpy_rows(&w, &picks, a, 0..n, y);
            }
            let part = part.ok_or_else(|| Error::Shape("split axpy_rows without part".into()))?;
            let len = view::product(launched, cols, "part")?;
            let part = prefix_mut(&mut part.data, len, "part")?;
            axpy::axpy_split_rows(&w, &picks, a, splits, part)
        }
        Launch::AddSplits {
            part,
            splits,
            cols,
            count,
            n,
            y,
        } => {
            let len = view::product(splits, cols, "part")?;
            let part = prefix(&part.data, len, "part")?;
            let y = prefix_mut(&mut y.data, cols, "y")?;
            let splits = match count {
                Some(_) => crate::ops::live_splits(counted(count, n)?, splits),
                None => splits,
            };
            axpy::add_splits(part, splits, y);
            Ok(())
        }
        Launch::CompactNonzero {
            a,
            idx,
            count_in,
            n,
            out_idx,
            out_a,
            count,
        } => {
            let m = counted(count_in, n)?;
            let out_idx = prefix_mut(&mut out_idx.data, m, "out_idx")?;
            let out_a = prefix_mut(&mut out_a.data, m, "out_a")?;
            let idx = idx.map(|i| i.data.as_slice());
            let kept = compact::compact_nonzero(&a.data, idx, m, out_idx, out_a)?;
            write_count(count, kept)
        }
        Launch::CompactFlags {
            slabs,
            ids_l,
            flags,
            n,
            out_idx,
            count,
        } => {
            let ids = Rows::ids(&slabs.data, ids_l)?;
            let out_idx = prefix_mut(&mut out_idx.data, n, "out_idx")?;
            let kept = compact::compact_flags(&ids, &flags.data, n, out_idx)?;
            write_count(count, kept)
        }
        Launch::PredictorFc2 {
            dtype,
            fc2_t,
            l,
            hidden,
            rank,
            ffn,
            threshold,
            flags,
            logits,
        } => {
            let fc2_t = Rows::new(&fc2_t.data, l, dtype, ffn, "fc2_t")?;
            let hidden = prefix(&hidden.data, rank, "hidden")?;
            let flags = prefix_mut(&mut flags.data, ffn, "flags")?;
            let logits = match logits {
                Some(l) => Some(prefix_mut(&mut l.data, ffn, "logits")?),
                None => None,
            };
            predictor::predictor_fc2(&fc2_t, hidden, threshold, flags, logits)
        }
        Launch::RmsNorm {
            x,
            w,
            rows,
            n,
            eps,
            out,
            xq,
        } => {
            let total = view::product(rows, n, "rows × n")?;
            let x = prefix(&x.data, total, "x")?;
            let w = prefix(&w.data, n, "w")?;
            let out = prefix_mut(&mut out.data, total, "out")?;
            norm_rope::rms_norm(x, w, n, eps, out);
            norm_rope::quantize_rows(out, n, xq.map(|q| &mut q.data[..]))
        }
        Launch::LayerNorm {
            x,
            w,
            b,
            rows,
            n,
            eps,
            out,
            xq,
        } => {
            let total = view::product(rows, n, "rows × n")?;
            let x = prefix(&x.data, total, "x")?;
            let w = prefix(&w.data, n, "w")?;
            let b = prefix(&b.data, n, "b")?;
            let out = prefix_mut(&mut out.data, total, "out")?;
            norm_rope::layer_norm(x, [w, b], eps, out);
            norm_rope::quantize_rows(out, n, xq.map(|q| &mut q.data[..]))
        }
        Launch::Rope {
            x,
            n_heads,
            k,
            k_heads,
            head_dim,
            pos,
            inv_freqs,
            neox,
            x_norm,
            k_norm,
            eps,
        } => {
            ensure!(
                2 * inv_freqs.len() <= head_dim,
                Shape,
                "rope: {} pairs in heads of {head_dim}",
                inv_freqs.len()
            );
            let heads = [("x", Some(x), n_heads, x_norm), ("k", k, k_heads, k_norm)];
            for (what, buf, n, norm) in heads {
                let Some(buf) = buf else { continue };
                let total = view::product(n, head_dim, "heads × head_dim")?;
                let h = prefix_mut(&mut buf.data, total, what)?;
                if let Some(w) = norm {
                    let w = prefix(&w.data, head_dim, "norm weight")?;
                    norm_rope::rms_norm_in_place(h, w, eps);
                }
                norm_rope::rope(h, head_dim, pos, inv_freqs, neox);
            }
            Ok(())
        }
        Launch::KvStore {
            k,
            v,
            kv_dim,
            pos,
            caches,
        } => {
            let k = prefix(&k.data, kv_dim, "k")?;
            let v = prefix(&v.data, kv_dim, "v")?;
            match caches {
                KvCachesMut::F16 { k: ck, v: cv } => {
                    attention::kv_store(k, v, pos, &mut ck.data, &mut cv.data)
                }
                KvCachesMut::F32 { k: ck, v: cv } => {
                    attention::kv_store(k, v, pos, &mut ck.data, &mut cv.data)
                }
            }
        }
        Launch::AttentionDecode {
            q,
            caches,
            first,
            n_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            softcap,
            chunk,
            part,
            out,
        } => {
            let shape = attention::Heads::new(n_heads, n_kv_heads, head_dim)?;
            let total = view::product(n_heads, head_dim, "n_heads × head_dim")?;
            let q = prefix(&q.data, total, "q")?;
            let out = prefix_mut(&mut out.data, total, "out")?;
            let (positions, params) = (first..n_pos, [scale, softcap]);
            let dst = attention::Dst {
                chunk,
                part: &mut part.data,
                out,
            };
            match caches {
                KvCaches::F16 { k, v } => {
                    let caches = [k.data.as_slice(), &v.data];
                    attention::attention_decode(&shape, q, caches, positions, params, dst)
                }
                KvCaches::F32 { k, v } => {
                    let caches = [k.data.as_slice(), &v.data];
                    attention::attention_decode(&shape, q, caches, positions, params, dst)
                }
            }
        }
        Launch::AttentionMerge {
            part,
            n_heads,
            head_dim,
            n_chunks,
            out,
        } => {
            let total = view::product(n_heads, head_dim, "n_heads × head_dim")?;
            let out = prefix_mut(&mut out.data, total, "out")?;
            attention::attention_merge(&part.data, n_chunks, head_dim, out)
        }
        Launch::Add { y, x, n } => {
            let x = prefix(&x.data, n, "x")?;
            elementwise::add(prefix_mut(&mut y.data, n, "y")?, x);
            Ok(())
        }
        Launch::ThresholdMask { h, n, t } => {
            elementwise::threshold_mask(prefix_mut(&mut h.data, n, "h")?, t);
            Ok(())
        }
        Launch::Softcap { y, n, cap } => {
            elementwise::softcap(prefix_mut(&mut y.data, n, "y")?, cap);
            Ok(())
        }
        Launch::Copy { dst, src, n } => {
            let src = prefix(&src.data, n, "src")?;
            prefix_mut(&mut dst.data, n, "dst")?.copy_from_slice(src);
            Ok(())
        }
        Launch::Fill { y, n, v } => {
            prefix_mut(&mut y.data, n, "y")?.fill(v);
            Ok(())
        }
        Launch::ExpertFlags {
            w,
            expert_ffn,
            routed,
            n_expert,
            n,
            flags,
        } => {
            let e = elementwise::Experts::new(&w.data, expert_ffn, routed, n_expert)?;
            let flags = prefix_mut(&mut flags.data, n, "flags")?;
            for (j, f) in flags.iter_mut().enumerate() {
                *f = i32::from(e.weight(j as i32)? != 0.0);
            }
            Ok(())
        }
        Launch::ExpertScale {
            slabs,
            ids_l,
            w,
            expert_ffn,
            routed,
            n_expert,
            n,
            h,
        } => {
            let e = elementwise::Experts::new(&w.data, expert_ffn, routed, n_expert)?;
            let ids = Rows::ids(&slabs.data, ids_l)?;
            let h = prefix_mut(&mut h.data, n, "h")?;
            for (s, v) in h.iter_mut().enumerate() {
                let id = ids.id(s)?;
                if id >= 0 {
                    *v *= e.weight(id)?;
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{is_shape, upload};
    use super::*;

    #[test]
    fn allocations_are_counted_in_granules_and_given_back() {
        let be = HostBackend::new();
        assert_eq!(be.allocated_bytes(), Some(0));
        let a = be.zeros::<f32>(1).unwrap();
        assert_eq!(be.allocated_bytes(), Some(256));
        let b = be.zeros::<u8>(257).unwrap();
        let c = be.zeros::<u16>(0).unwrap();
        let d = be.zeros::<i32>(64).unwrap();
        assert_eq!(be.allocated_bytes(), Some(256 + 512 + 256));
        assert_eq!((a.len(), b.len(), c.len(), d.len()), (1, 257, 0, 64));
        assert_eq!(
            format!("{b:?}"),
            "HostBuf { type: \"u8\", len: 257, bytes: 512 }"
        );
        assert!(c.is_empty() && a.as_slice() == [0.0]);
        drop(b);
        assert_eq!(be.allocated_bytes(), Some(512));
        drop((a, c, d));
        assert_eq!(be.allocated_bytes(), Some(0));
        let (free, total) = be.mem_info().unwrap();
        assert_eq!(free, total);
        assert!(total > 1 << 20);
        assert_eq!(be.describe(), "gpu-sim");
    }

    #[test]
    fn the_capacity_is_enforced_and_freed_memory_reused() {
        let be = HostBackend::with_capacity(1024);
        assert_eq!(be.capacity(), Some(1024));
        assert_eq!(be.describe(), "gpu-sim (capacity 1024 bytes)");
        let big = HostBackend::with_capacity(3 << 29);
        assert_eq!(big.describe(), "gpu-sim (capacity 1.50 GiB)");
        let a = be.zeros::<f32>(100).unwrap(); // 400 -> 512
        assert_eq!(be.mem_info().unwrap(), (512, 1024));
        let b = be.zeros::<u8>(512).unwrap();
        assert_eq!(be.mem_info().unwrap(), (0, 1024));
        let err = be.zeros::<u8>(1).unwrap_err();
        let Error::VramBudget(msg) = err else {
            panic!("{err:?}")
        };
        assert!(
            msg.contains("needs 256 bytes") && msg.contains("only 0 of the 1024"),
            "{msg}"
        );
        // A failed allocation counts nothing.
        assert_eq!(be.allocated_bytes(), Some(1024));
        drop(a);
        let c = be.zeros::<i32>(128).unwrap();
        assert_eq!(be.allocated_bytes(), Some(1024));
        drop((b, c));
        assert_eq!(be.allocated_bytes(), Some(0));
        assert!(matches!(
            be.zeros::<u16>(usize::MAX / 2),
            Err(Error::VramBudget(_))
        ));
        assert!(matches!(
            HostBackend::new().zeros::<f32>(usize::MAX / 2),
            Err(Error::VramBudget(_))
        ));
        assert_eq!(be.allocated_bytes(), Some(0));
    }

    #[test]
    fn copies_check_their_ranges() {
        let be = HostBackend::new();
        let mut buf = be.zeros::<i32>(5).unwrap();
        be.write(&[1, 2], &mut buf, 3).unwrap();
        be.write(&[], &mut buf, 5).unwrap();
        assert_eq!(buf.as_slice(), [0, 0, 0, 1, 2]);
        assert!(is_shape(be.write(&[1, 2], &mut buf, 4)));
        assert!(is_shape(be.write(&[1], &mut buf, usize::MAX)));
        let mut out = [0i32; 3];
        be.read(&buf, 2, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2]);
        assert!(is_shape(be.read(&buf, 3, &mut out)));
        assert!(is_shape(be.read(&buf, usize::MAX, &mut out)));
        let up = upload(&be, &[1u16, 2, 3]);
        assert_eq!(up.as_slice(), [1, 2, 3]);
        be.synchronize().unwrap();
    }
}
