//! Large owned allocations on transparent huge pages. Scattered row reads (the sparse kernels
//! touch a few kilobytes here and there across a layer) miss the TLB on nearly every row with
//! 4 KiB pages; with 2 MiB pages a layer is a handful of TLB entries. On Linux a [`PageBuf`] is
//! an anonymous mapping, aligned to 2 MiB and advised `MADV_HUGEPAGE` (the kernel grants huge
//! pages when `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or `madvise`, and falls
//! back to small pages silently otherwise); elsewhere, and for small sizes, it is ordinary
//! 64-byte-aligned heap memory.

use crate::Buffer;
use std::sync::Arc;

/// Size of a huge page, and the alignment of large buffers.
pub const HUGE_PAGE: usize = 2 << 20;

/// Buffers at least this long are placed on huge pages.
pub const HUGE_MIN: usize = HUGE_PAGE;

/// This machine's physical memory in bytes (`MemTotal` of `/proc/meminfo`), None where it
/// cannot be read: the bound of any buffer a user sizes (an anonymous mapping past it may be
/// granted, then the process is killed as it fills it).
pub fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A zero-filled, writable allocation that becomes an immutable [`Buffer`] by [`PageBuf::freeze`].
pub struct PageBuf {
    store: Store,
    /// Offset of the first byte in the store (2 MiB alignment inside a mapping).
    off: usize,
    len: usize,
}

enum Store {
    Heap(Vec<CacheLine>),
    #[cfg(target_os = "linux")]
    Map(memmap2::MmapMut),
}

/// One 64-byte, 64-aligned line of heap storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// The frozen store, kept alive by the buffers that borrow it (nothing writes it any more: the
/// only handle is inside the owner).
enum Frozen {
    Heap(#[allow(dead_code)] Vec<CacheLine>),
    #[cfg(target_os = "linux")]
    Map(#[allow(dead_code)] memmap2::MmapMut),
}

impl PageBuf {
    /// `len` zero bytes: on huge pages when `len >= HUGE_MIN` and the OS allows, else on the heap.
    pub fn zeroed(len: usize) -> PageBuf {
        #[cfg(target_os = "linux")]
        if len >= HUGE_MIN {
            if let Some(b) = PageBuf::mapped(len) {
                return b;
            }
        }
        PageBuf {
            store: Store::Heap(vec![CacheLine([0u8; 64]); len.div_ceil(64)]),
            off: 0,
            len,
        }
    }

    /// [`PageBuf::zeroed`], or `Error::Shape` when the memory cannot be had (instead of the
    /// process ending in the allocator's abort) or is more than the machine's
    /// [`physical_memory`]: for sizes a user gives.
    pub fn try_zeroed(len: usize) -> crate::Result<PageBuf> {
        if let Some(total) = physical_memory() {
            crate::ensure!(
                len <= total,
                Shape,
                "{len} bytes of memory: more than this machine has ({total})"
            );
        }
        #[cfg(target_os = "linux")]
        if len >= HUGE_MIN {
            if let Some(b) = PageBuf::mapped(len) {
                return Ok(b);
            }
        }
        let lines = len.div_ceil(64);
        let mut v: Vec<CacheLine> = Vec::new();
        v.try_reserve_exact(lines)
            .map_err(|_| crate::Error::Shape(format!("cannot allocate {len} bytes of memory")))?;
        v.resize(lines, CacheLine([0u8; 64]));
        Ok(PageBuf {
            store: Store::Heap(v),
            off: 0,
            len,
        })
    }

    /// An anonymous mapping with room to start at a 2 MiB boundary, advised for huge pages.
    #[cfg(target_os = "linux")]
    fn mapped(len: usize) -> Option<PageBuf> {
        let map = memmap2::MmapMut::map_anon(len.checked_add(HUGE_PAGE)?).ok()?;
        let base = map.as_ptr() as usize;
        let off = base.next_multiple_of(HUGE_PAGE) - base;
        // Advice only: a kernel without THP leaves the mapping on small pages.
        let _ = map.advise_range(memmap2::Advice::HugePage, off, len);
        Some(PageBuf {
            store: Store::Map(map),
            off,
            len,
        })
    }

    /// True when the memory was mapped with huge-page advice (not a promise that the kernel
    /// granted huge pages).
    pub fn huge_advised(&self) -> bool {
        match self.store {
            Store::Heap(_) => false,
            #[cfg(target_os = "linux")]
            Store::Map(_) => true,
        }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let (off, len) = (self.off, self.len);
        match &mut self.store {
            Store::Heap(v) => {
                // SAFETY: the Vec owns v.len() * 64 >= len initialised bytes, borrowed mutably
                // through self for the slice's lifetime.
                unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
            }
            #[cfg(target_os = "linux")]
            Store::Map(m) => &mut m[off..off + len],
        }
    }

    /// The bytes as u64 words (`len` rounded down to whole words). The start is 64-byte aligned.
    pub fn as_mut_words(&mut self) -> &mut [u64] {
        let bytes = self.as_mut_slice();
        let words = bytes.len() / 8;
        let ptr = bytes.as_mut_ptr();
        debug_assert_eq!(ptr as usize % 8, 0);
        // SAFETY: the start is at least 64-byte aligned (heap lines or a page-aligned mapping
        // plus a 2 MiB-multiple offset), `words * 8` bytes lie in the borrowed slice, and every
        // bit pattern is a valid u64.
        unsafe { std::slice::from_raw_parts_mut(ptr as *mut u64, words) }
    }

    /// The bytes, immutable from now on, as a shareable [`Buffer`].
    pub fn freeze(self) -> Buffer {
        let (off, len) = (self.off, self.len);
        let (ptr, owner): (*const u8, Arc<dyn Send + Sync>) = match self.store {
            Store::Heap(v) => (v.as_ptr() as *const u8, Arc::new(Frozen::Heap(v))),
            #[cfg(target_os = "linux")]
            Store::Map(m) => {
                // SAFETY: off + len lies inside the mapping (see `mapped`).
                let p = unsafe { m.as_ptr().add(off) };
                (p, Arc::new(Frozen::Map(m)))
            }
        };
        // SAFETY: ptr..ptr+len lies in the frozen store, which nothing writes any more and which
        // the Arc keeps alive as long as the buffer (moving a Vec or Mmap does not move its
        // memory).
        unsafe { Buffer::borrowed(ptr, len, owner) }
    }
}

/// The buffers that own their bytes: copies into a [`PageBuf`], frozen.
impl Buffer {
    /// Copy `bytes` into a new buffer that owns them: 64-byte aligned, and on huge pages when
    /// large (see [`crate::pages`]).
    pub fn from_bytes(bytes: &[u8]) -> Buffer {
        let mut store = PageBuf::zeroed(bytes.len());
        store.as_mut_slice().copy_from_slice(bytes);
        store.freeze()
    }

    /// A buffer of f32 values (copied), for tests and small tensors.
    pub fn from_f32(values: &[f32]) -> Buffer {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Buffer::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_buffers_hold_their_bytes() {
        for len in [0usize, 1, 63, 4096, HUGE_MIN + 7] {
            let mut b = PageBuf::zeroed(len);
            assert_eq!(
                b.huge_advised(),
                cfg!(target_os = "linux") && len >= HUGE_MIN
            );
            assert!(b.as_mut_slice().iter().all(|&v| v == 0));
            for (i, v) in b.as_mut_slice().iter_mut().enumerate() {
                *v = (i % 251) as u8;
            }
            assert_eq!(b.as_mut_words().len(), len / 8);
            let frozen = b.freeze();
            assert_eq!(frozen.len(), len);
            assert_eq!(frozen.as_ptr() as usize % 64, 0);
            if len >= HUGE_MIN && cfg!(target_os = "linux") {
                assert_eq!(frozen.as_ptr() as usize % HUGE_PAGE, 0);
            }
            let s = frozen.as_slice();
            assert!(s.iter().enumerate().all(|(i, &v)| v == (i % 251) as u8));
        }
    }
}
