//! The host backend (`device="gpu-sim"`): a [`Backend`] whose buffers live in host memory and
//! whose kernels are plain Rust implementations of each CUDA kernel's contract (slab addressing,
//! padding ids, the f16 KV cache's rounding), so the hybrid executor runs, and is tested, on
//! machines without a GPU. Always built.

use powerinfer_core::Result;

use crate::backend::{Backend, Checked, DeviceSlice, Elem, Launch};

/// A simulated GPU in host memory, optionally with a memory capacity (the "VRAM" a plan must
/// fit in; unlimited by default).
#[derive(Debug, Default)]
pub struct HostBackend {
    capacity: Option<usize>,
}

impl HostBackend {
    /// A host backend with no memory limit.
    pub fn new() -> HostBackend {
        HostBackend { capacity: None }
    }

    /// A host backend whose allocations may total at most `bytes` (each rounded up to 256).
    pub fn with_capacity(bytes: usize) -> HostBackend {
        HostBackend {
            capacity: Some(bytes),
        }
    }
}

/// A buffer of the host backend.
#[derive(Debug)]
pub struct HostBuf<T> {
    data: Vec<T>,
}

impl<T: Send + Sync> DeviceSlice for HostBuf<T> {
    fn len(&self) -> usize {
        self.data.len()
    }
}

impl Backend for HostBackend {
    type Buf<T: Elem> = HostBuf<T>;

    fn describe(&self) -> String {
        "gpu-sim".into()
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        todo!()
    }

    fn allocated_bytes(&self) -> Option<usize> {
        todo!()
    }

    fn zeros<T: Elem>(&self, len: usize) -> Result<HostBuf<T>> {
        Ok(HostBuf {
            data: vec![T::default(); len],
        })
    }

    fn write<T: Elem>(&self, host: &[T], dst: &mut HostBuf<T>, at: usize) -> Result<()> {
        let _ = (host, dst, at);
        todo!()
    }

    fn read<T: Elem>(&self, src: &HostBuf<T>, at: usize, out: &mut [T]) -> Result<()> {
        let _ = (src, at, out);
        todo!()
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn launch(&self, launch: Launch<'_, Self>, _checked: Checked) -> Result<()> {
        let _ = launch;
        todo!()
    }
}
