//! Pinned (page-locked) host staging buffers for the small per-layer transfers (feature `cuda`).
//!
//! A copy from pageable host memory makes the driver stage it itself and block; a copy from
//! pinned memory is a true asynchronous DMA. [`CudaDevice`](crate::CudaDevice) sends every
//! write or read of at most [`STAGING_BYTES`] through one of two per-device buffers:
//!
//! - **writes** (`UploadStaging`): the host data is copied into the next free part of a
//!   write-combined pinned ring, the DMA from there is queued on the device's stream, and the
//!   call returns at once. The caller's slice may be reused as soon as `write` returns (it was
//!   copied); the device copy happens in stream order, before any later launch. When the ring is
//!   full, the next write first waits for the ring's last queued copy (hence for all of them,
//!   the stream being in order) and starts again at its beginning.
//! - **reads** (`DownloadStaging`): the DMA into a (cacheable) pinned buffer is queued after
//!   all earlier work, the stream is synchronized, and the bytes are copied out.
//!
//! Larger transfers go directly from/to the caller's memory (pageable, synchronous for the host
//! data as the driver defines it).

use std::sync::Arc;

use cudarc::driver::sys::{CUdeviceptr, CU_MEMHOSTALLOC_WRITECOMBINED};
use cudarc::driver::{result, CudaEvent, CudaStream};
use powerinfer_core::Result;

use crate::driver::driver_err;

/// Largest transfer sent through a staging buffer (and each buffer's size): 1 MiB.
pub const STAGING_BYTES: usize = 1 << 20;
/// Alignment of each staged write inside the ring.
const SLOT_ALIGN: usize = 256;

/// One pinned host allocation (cuMemHostAlloc), freed on drop once its copies are done.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    /// Recorded on the stream after the last copy that used the buffer.
    event: CudaEvent,
    stream: Arc<CudaStream>,
}

// SAFETY: the buffer is plain host memory owned by this value alone; it is only touched through
// `&mut self` (the device keeps each staging buffer behind a mutex), and the driver calls made
// with it (copies, event waits, free) may come from any thread of the context.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(stream: &Arc<CudaStream>, len: usize, flags: u32) -> Result<Pinned> {
        let ctx = stream.context();
        ctx.bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))?;
        let event = ctx
            .new_event(None)
            .map_err(driver_err("creating a staging event"))?;
        // SAFETY: allocates `len` bytes of page-locked host memory in the current (bound)
        // context; the pointer is owned by the returned value and freed once, in Drop.
        let ptr = unsafe { result::malloc_host(len, flags) }
            .map_err(driver_err("allocating pinned host memory"))?;
        Ok(Pinned {
            ptr: ptr.cast(),
            len,
            event,
            stream: stream.clone(),
        })
    }

    /// Wait until every copy queued with this buffer has finished.
    fn wait(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(driver_err("waiting for a staged copy"))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // A copy may still read or write the buffer: wait for it before freeing. Errors cannot
        // be returned from drop; the context records them.
        let ctx = self.stream.context();
        ctx.record_err(self.event.synchronize());
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: `ptr` came from cuMemHostAlloc in this context, no copy uses it any more
        // (waited above), and it is freed exactly once.
        ctx.record_err(unsafe { result::free_host(self.ptr.cast()) });
    }
}

/// The write ring (write-combined pinned memory: fast for the host to fill, never read by it).
pub(crate) struct UploadStaging {
    buf: Pinned,
    /// Start of the free part of the ring.
    cursor: usize,
}

impl UploadStaging {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<UploadStaging> {
        Ok(UploadStaging {
            buf: Pinned::new(stream, STAGING_BYTES, CU_MEMHOSTALLOC_WRITECOMBINED)?,
            cursor: 0,
        })
    }

    /// Queue a copy of `src` (at most [`STAGING_BYTES`]) to device address `dst` on the stream;
    /// returns without waiting for it (`src` may be reused at once).
    ///
    /// # Safety
    /// `dst` must be the address of `src.len()` writable bytes of device memory of this
    /// stream's context that stay allocated until the copy has run (stream order).
    pub(crate) unsafe fn write(&mut self, src: &[u8], dst: CUdeviceptr) -> Result<()> {
        let n = src.len();
        assert!(n <= self.buf.len, "staged write of {n} bytes");
        if self.cursor + n > self.buf.len {
            // Full: every earlier copy from the ring must be done before it is overwritten.
            self.buf.wait()?;
            self.cursor = 0;
        }
        // SAFETY: [cursor, cursor + n) lies inside the allocation (checked above) and no queued
        // copy reads it: copies since the last wrap used [0, cursor), and those before the
        // wrap have finished (waited on).
        let staged = unsafe {
            let p = self.buf.ptr.add(self.cursor);
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, n);
            std::slice::from_raw_parts(p.cast_const(), n)
        };
        let stream = &self.buf.stream;
        // The raw copy below needs the context current on this thread (cudarc's calls bind it
        // themselves).
        stream
            .context()
            .bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))?;
        // SAFETY: `staged` is pinned host memory that stays untouched until the copy has run
        // (the ring's rule above); `dst` holds n bytes (the caller's contract).
        unsafe { result::memcpy_htod_async(dst, staged, stream.cu_stream()) }
            .map_err(driver_err("copying to the device"))?;
        self.buf
            .event
            .record(stream)
            .map_err(driver_err("recording a staging event"))?;
        self.cursor += n.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        Ok(())
    }
}

/// The read buffer (cacheable pinned memory: the host reads it back).
pub(crate) struct DownloadStaging {
    buf: Pinned,
}

impl DownloadStaging {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<DownloadStaging> {
        Ok(DownloadStaging {
            buf: Pinned::new(stream, STAGING_BYTES, 0)?,
        })
    }

    /// Copy `out.len()` bytes (at most [`STAGING_BYTES`]) from device address `src` into `out`
    /// after all work queued on the stream, and wait for them.
    ///
    /// # Safety
    /// `src` must be the address of `out.len()` readable bytes of device memory of this
    /// stream's context.
    pub(crate) unsafe fn read(&mut self, src: CUdeviceptr, out: &mut [u8]) -> Result<()> {
        let n = out.len();
        assert!(n <= self.buf.len, "staged read of {n} bytes");
        let stream = &self.buf.stream;
        stream
            .context()
            .bind_to_thread()
            .map_err(driver_err("binding the CUDA context"))?;
        // SAFETY: the first n bytes of the pinned buffer are free (every read synchronizes
        // before returning) and stay untouched by the host until the synchronize below; `src`
        // holds n bytes (the caller's contract).
        unsafe {
            let staged = std::slice::from_raw_parts_mut(self.buf.ptr, n);
            result::memcpy_dtoh_async(staged, src, stream.cu_stream())
        }
        .map_err(driver_err("copying from the device"))?;
        stream
            .synchronize()
            .map_err(driver_err("synchronizing the stream"))?;
        // SAFETY: the copy into the first n bytes has finished (synchronized above).
        unsafe { std::ptr::copy_nonoverlapping(self.buf.ptr.cast_const(), out.as_mut_ptr(), n) };
        Ok(())
    }
}
