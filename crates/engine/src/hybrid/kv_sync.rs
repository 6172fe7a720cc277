//! Keeping the CPU and GPU KV caches consistent. The CPU cache has a row per position for every
//! layer; a layer whose attention runs on the GPU also has its f16 cache there. Decoding writes
//! GPU layers' rows only on the GPU; batched CPU passes (prefill, scoring, profiling) write
//! every layer's rows only on the CPU. So each side records how far its copy of the GPU layers'
//! rows is valid, and the missing rows cross just before the side that lacks them runs:
//! CPU → GPU (rounded to f16, as the `kv_store` kernel rounds) before a decode step, GPU → CPU
//! before a CPU pass. Truncation and rollback only lower the marks.

use half::f16;
use powerinfer_core::Result;
use powerinfer_cuda::Backend;

use crate::hybrid::gpu_model::GpuModel;
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
            let (keys, values) = cache.layer(l, len);
            let kv_dim = a.kv_dim;
            for (src, dst) in [(keys, &mut a.cache_k), (values, &mut a.cache_v)] {
                let rows: Vec<u16> = src[from * kv_dim..]
                    .iter()
                    .map(|&v| f16::from_f32(v).to_bits())
                    .collect();
                link.up(l, &rows, dst, from * kv_dim)?;
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
            let kv_dim = a.kv_dim;
            let n = (len - from) * kv_dim;
            let mut bits = vec![0u16; n];
            let mut rows = [vec![0f32; n], vec![0f32; n]];
            for (src, out) in [&a.cache_k, &a.cache_v].into_iter().zip(rows.iter_mut()) {
                link.down(l, src, from * kv_dim, &mut bits)?;
                out.iter_mut()
                    .zip(&bits)
                    .for_each(|(o, &b)| *o = f16::from_bits(b).to_f32());
            }
            cache.write(l, from, &rows[0], &rows[1]);
        }
        self.cpu = len;
        Ok(())
    }
}
