//! Copies in and out, and the weight uploads: whole matrices, and one layer's hot neurons
//! packed in slabs ([`pack_hot_slabs`]).

use powerinfer_core::{ensure, Result, Weight};

use crate::backend::{Backend, DeviceSlice, DeviceWeight, Elem, HotFfn};
use crate::layout::{pack_hot_rows, pack_hot_slabs, RowLayout, RowSpace};
use crate::repack::repack_rows;

/// Copy `host` to a new buffer.
pub(crate) fn upload<B: Backend, T: Elem>(dev: &B, host: &[T]) -> Result<B::Buf<T>> {
    let mut buf = dev.zeros::<T>(host.len())?;
    dev.write(host, &mut buf, 0)?;
    Ok(buf)
}

/// Copy a whole buffer back (waits for queued work).
pub(crate) fn download<B: Backend, T: Elem>(dev: &B, src: &B::Buf<T>) -> Result<Vec<T>> {
    let mut out = vec![T::default(); src.len()];
    dev.read(src, 0, &mut out)?;
    Ok(out)
}

/// Upload a whole weight matrix (rows as stored, the 32-weight quantized formats repacked:
/// [`crate::repack`]).
pub(crate) fn upload_weight<B: Backend>(dev: &B, w: &Weight) -> Result<DeviceWeight<B>> {
    super::ensure_gpu_dtype(w.dtype)?;
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
    Ok(DeviceWeight {
        dtype: w.dtype,
        rows: w.rows,
        cols: w.cols,
        layout: RowLayout::dense(w.rows, rb)?,
        data: upload(dev, &repack_rows(w.dtype, w.cols, w.bytes())?)?,
    })
}

/// Pack one layer's hot neurons into slabs of `bucket` (see [`pack_hot_slabs`]; `up` None for
/// a gate-less FFN) and upload them: exactly `n_slabs · slab_bytes` bytes, the plan's
/// `ffn_hot`.
pub(crate) fn upload_hot_ffn<B: Backend>(
    dev: &B,
    gate: &Weight,
    up: Option<&Weight>,
    down_t: &Weight,
    ids: &[u32],
    bucket: usize,
) -> Result<HotFfn<B>> {
    let (layout, bytes) = pack_hot_slabs(gate, up, down_t, ids, bucket)?;
    Ok(HotFfn {
        layout,
        data: upload(dev, &bytes)?,
    })
}

/// [`upload_hot_ffn`] over row spaces (a mixture of experts' flattened neurons:
/// [`pack_hot_rows`]).
pub(crate) fn upload_hot_rows<B: Backend>(
    dev: &B,
    gate: &RowSpace<'_>,
    up: Option<&RowSpace<'_>>,
    down_t: &RowSpace<'_>,
    ids: &[u32],
    bucket: usize,
) -> Result<HotFfn<B>> {
    let (layout, bytes) = pack_hot_rows(gate, up, down_t, ids, bucket)?;
    Ok(HotFfn {
        layout,
        data: upload(dev, &bytes)?,
    })
}
