//! Copies in and out, and the weight uploads: whole matrices, and one layer's hot neurons
//! packed in slabs ([`pack_hot_slabs`]) ([`UploadOps`]; no kernel).

use powerinfer_core::{ensure, Result, Weight};

use crate::backend::{Backend, DeviceSlice, DeviceWeight, Elem, HotFfn};
use crate::convert::{device_dtype, device_rows};
use crate::kernels::ensure_gpu_dtype;
use crate::layout::{pack_hot_rows, pack_hot_slabs, RowLayout, RowSpace, SlabLayout};
use crate::repack::repack_rows;

/// Copies and uploads, checked, on any backend.
pub trait UploadOps: Backend {
    /// Copy `host` to a new buffer.
    fn upload<T: Elem>(&self, host: &[T]) -> Result<Self::Buf<T>> {
        let mut buf = self.zeros::<T>(host.len())?;
        self.write(host, &mut buf, 0)?;
        Ok(buf)
    }

    /// Copy a whole buffer back (waits for queued work).
    fn download<T: Elem>(&self, src: &Self::Buf<T>) -> Result<Vec<T>> {
        let mut out = vec![T::default(); src.len()];
        self.read(src, 0, &mut out)?;
        Ok(out)
    }

    /// Upload a whole weight matrix (rows as stored, the table formats converted to Q8_0:
    /// [`crate::convert`]; the 32-weight quantized formats repacked: [`crate::repack`]).
    fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight<Self>> {
        let dtype = device_dtype(w.dtype);
        ensure_gpu_dtype(dtype)?;
        let rb = w.dtype.row_bytes(w.cols)?;
        ensure!(
            w.n_bytes() == rb * w.rows,
            Shape,
            "{} weight of {} x {} has {} bytes",
            w.dtype,
            w.rows,
            w.cols,
            w.n_bytes()
        );
        let rows = device_rows(w.dtype, w.cols, w.bytes())?;
        Ok(DeviceWeight {
            dtype,
            rows: w.rows,
            cols: w.cols,
            layout: RowLayout::dense(w.rows, dtype.row_bytes(w.cols)?)?,
            data: self.upload(&repack_rows(dtype, w.cols, &rows)?)?,
        })
    }

    /// Pack one layer's hot neurons into slabs of `bucket` (see [`pack_hot_slabs`]; `up` None for
    /// a gate-less FFN) and upload them: exactly `n_slabs · slab_bytes` bytes, the plan's
    /// `ffn_hot`.
    fn upload_hot_ffn(
        &self,
        gate: &Weight,
        up: Option<&Weight>,
        down_t: &Weight,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn<Self>> {
        upload_packed(self, pack_hot_slabs(gate, up, down_t, ids, bucket)?)
    }

    /// [`UploadOps::upload_hot_ffn`] over row spaces: a mixture of experts' flattened neurons
    /// (each expert's rows, then the shared expert's), packed without copying the experts first
    /// ([`pack_hot_rows`]).
    fn upload_hot_rows(
        &self,
        gate: &RowSpace<'_>,
        up: Option<&RowSpace<'_>>,
        down_t: &RowSpace<'_>,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn<Self>> {
        upload_packed(self, pack_hot_rows(gate, up, down_t, ids, bucket)?)
    }
}

impl<B: Backend> UploadOps for B {}

/// One layer's packed hot neurons (the layout and bytes of [`pack_hot_slabs`] or
/// [`pack_hot_rows`]) uploaded to `be`.
fn upload_packed<B: Backend>(be: &B, (layout, bytes): (SlabLayout, Vec<u8>)) -> Result<HotFfn<B>> {
    Ok(HotFfn {
        layout,
        data: be.upload(&bytes)?,
    })
}
