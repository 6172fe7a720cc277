//! Byte buffers that either own their memory or borrow it from an owner kept alive beside them
//! (a memory-mapped numpy array handed over from Python), so weights reach the kernels without a
//! copy. The owning constructors (`Buffer::from_bytes`, `from_f32`) are in [`crate::pages`],
//! whose allocations they copy into.

use std::sync::Arc;

/// An immutable run of bytes with its owner. Cloning shares the owner, never the bytes.
#[derive(Clone)]
pub struct Buffer {
    ptr: *const u8,
    len: usize,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: the bytes are immutable for the buffer's lifetime and the owner is Send + Sync, so
// sharing the pointer across threads is as safe as sharing the owner.
unsafe impl Send for Buffer {}
// SAFETY: as above; nothing mutates through a Buffer.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Borrow `len` bytes at `ptr`, kept valid by `owner`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable and unchanged for as long as `owner` lives.
    pub unsafe fn borrowed(ptr: *const u8, len: usize, owner: Arc<dyn Send + Sync>) -> Buffer {
        Buffer {
            ptr,
            len,
            _owner: owner,
        }
    }

    /// Bytes `range` of this buffer as a buffer of their own, sharing the owner (no copy).
    /// None when the range is out of bounds.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<Buffer> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        Some(Buffer {
            ptr: self.ptr.wrapping_add(range.start),
            len: range.end - range.start,
            _owner: self._owner.clone(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the constructor's contract keeps ptr..ptr+len readable while the owner lives,
        // and the owner lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte (for zero-copy checks).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes at {:p})", self.len, self.ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_copy_is_aligned_and_equal() {
        let data: Vec<u8> = (0..200u8).collect();
        let b = Buffer::from_bytes(&data);
        assert_eq!(b.as_slice(), &data[..]);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        let c = b.clone();
        assert_eq!(c.as_ptr(), b.as_ptr());
    }

    #[test]
    fn slices_share_the_owner() {
        let data: Vec<u8> = (0..100u8).collect();
        let b = Buffer::from_bytes(&data);
        let s = b.slice(10..20).unwrap();
        drop(b);
        assert_eq!(s.as_slice(), &data[10..20]);
        assert_eq!(s.slice(2..2).unwrap().len(), 0);
        assert!(s.slice(5..11).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = s.slice(6..5);
        assert!(reversed.is_none());
    }

    #[test]
    fn borrowed_keeps_owner_alive() {
        let owner: Arc<Vec<u8>> = Arc::new(vec![1, 2, 3]);
        let ptr = owner.as_ptr();
        // SAFETY: the Vec is never mutated and is kept alive by the Arc we hand over.
        let b = unsafe { Buffer::borrowed(ptr, 3, owner.clone()) };
        drop(owner);
        assert_eq!(b.as_slice(), &[1, 2, 3]);
        assert_eq!(b.as_ptr(), ptr);
    }
}
