//! Keeping the CPU and GPU KV caches consistent. The CPU cache has a row per position for every
//! layer; a layer whose attention runs on the GPU also has its cache there (f16 or f32, the
//! session's precision, which the CPU cache rounds to as well). Decoding writes
//! GPU layers' rows only on the GPU; batched CPU passes (prefill, scoring, profiling) write
//! every layer's rows only on the CPU. So each side records how far its copy of the GPU layers'
//! rows is valid, and the missing rows cross just before the side that lacks them runs:
//! CPU → GPU (converted to the caches' element, as the `kv_store` kernels store it: exact, the
//! CPU rows already hold such values) before a decode step, GPU → CPU before a CPU pass. Truncation and rollback only lower the marks.

use powerinfer_core::Result;
use powerinfer_cuda::{Backend, KvElem};

use crate::hybrid::gpu_model::{GpuModel, KvBufs};
use crate::hybrid::transfers::Link;
use crate::kv_cache::KvCache;

/// How many positions of the GPU layers' rows each side holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvSync {
    /// Positions `0..gpu` are valid in the GPU caches.
    pub gpu: usize,
    /// Positions `0..cpu` of the GPU layers are valid in the CPU cache.
    pub cpu: usize,
}

impl KvSync {
    /// A decode step wrote position `len - 1` on the GPU (and the CPU layers' row on the CPU).
    pub fn gpu_wrote(&mut self, len: usize) {
        self.gpu = len;
    }

    /// A CPU pass wrote every layer's rows up to `len`.
    pub fn cpu_wrote(&mut self, len: usize) {
        self.cpu = len;
        self.gpu = self.gpu.min(len);
    }

    /// The context was cut to `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.gpu = self.gpu.min(len);
        self.cpu = self.cpu.min(len);
    }

    /// Upload the CPU cache's rows the GPU caches lack (positions `gpu..cache.len()`).
    pub fn to_gpu<B: Backend>(
        &mut self,
        link: &mut Link<'_, B>,
        gpu: &mut GpuModel<B>,
        cache: &KvCache,
    ) -> Result<()> {
        let len = cache.len();
        if self.gpu >= len {
            return Ok(());
        }
        let from = self.gpu;
        for (l, layer) in gpu.layers.iter_mut().enumerate() {
            let Some(a) = layer.attention.as_mut() else {
                continue;
            };
            let (keys, values) = cache.layer(l, len)?;
            let at = from * a.kv_dim;
            match &mut a.cache {
                KvBufs::F16(k, v) => up(link, l, [&keys[at..], &values[at..]], [k, v], at)?,
                KvBufs::F32(k, v) => up(link, l, [&keys[at..], &values[at..]], [k, v], at)?,
            }
        }
        self.gpu = len;
        Ok(())
    }

    /// Download the GPU caches' rows the CPU cache lacks (positions `cpu..cache.len()`).
    pub fn to_cpu<B: Backend>(
        &mut self,
        link: &mut Link<'_, B>,
        gpu: &GpuModel<B>,
        cache: &mut KvCache,
    ) -> Result<()> {
        let len = cache.len();
        if self.cpu >= len {
            return Ok(());
        }
        let from = self.cpu;
        for (l, layer) in gpu.layers.iter().enumerate() {
            let Some(a) = layer.attention.as_ref() else {
                continue;
            };
            let at = from * a.kv_dim;
            let n = (len - from) * a.kv_dim;
            let [k, v] = match &a.cache {
                KvBufs::F16(k, v) => down(link, l, [k, v], at, n)?,
                KvBufs::F32(k, v) => down(link, l, [k, v], at, n)?,
            };
            cache.write(l, from, &k, &v);
        }
        self.cpu = len;
        Ok(())
    }
}

/// Upload rows of keys and values (f32, from the CPU cache) into a layer's caches of element
/// `T` from value `at` on, converted as the cache stores them.
fn up<B: Backend, T: KvElem>(
    link: &mut Link<'_, B>,
    layer: usize,
    src: [&[f32]; 2],
    dst: [&mut B::Buf<T>; 2],
    at: usize,
) -> Result<()> {
    for (src, dst) in src.into_iter().zip(dst) {
        let rows: Vec<T> = src.iter().map(|&v| T::from_f32(v)).collect();
        link.up(layer, &rows, dst, at)?;
    }
    Ok(())
}

/// Download `n` values of a layer's key and value caches of element `T` from value `at` on,
/// as f32.
fn down<B: Backend, T: KvElem>(
    link: &mut Link<'_, B>,
    layer: usize,
    src: [&B::Buf<T>; 2],
    at: usize,
    n: usize,
) -> Result<[Vec<f32>; 2]> {
    let mut raw = vec![T::default(); n];
    let mut out = [Vec::new(), Vec::new()];
    for (src, out) in src.into_iter().zip(out.iter_mut()) {
        link.down(layer, src, at, &mut raw)?;
        *out = raw.iter().map(|&v| v.to_f32()).collect();
    }
    Ok(out)
}
