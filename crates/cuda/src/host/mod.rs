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
//! Each kernel's contract lives with its family (`crate::ops::<family>::host`, run by
//! [`Kernel::host`]); [`view`] holds the checked views of buffers they share (rows through a
//! [`RowLayout`], index lists, neuron flags, counts). This module knows no family.
//!
//! [`RowLayout`]: crate::layout::RowLayout

pub(crate) mod view;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use powerinfer_core::{Error, Result};

use crate::backend::{Backend, Checked, DeviceSlice, Elem, HostMem, Kernel};
use crate::layout::{align, ALIGN};

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

    fn launch<K: Kernel<Self>>(&self, kernel: K, _checked: Checked) -> Result<()> {
        let entry = kernel.entry();
        kernel.host().map_err(|e| match e {
            Error::Shape(m) => Error::Shape(format!("gpu-sim {entry}: {m}")),
            e => e,
        })
    }
}

impl HostMem for HostBackend {
    fn data<T: Elem>(buf: &HostBuf<T>) -> &[T] {
        &buf.data
    }

    fn data_mut<T: Elem>(buf: &mut HostBuf<T>) -> &mut [T] {
        &mut buf.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::{is_shape, upload};

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
