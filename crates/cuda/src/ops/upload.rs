//! Copies in and out, and the weight uploads: whole matrices, chosen rows as a compact matrix,
//! and one layer's hot neurons packed in slabs ([`pack_hot_slabs`]).

use powerinfer_core::{ensure, Result, Weight};

use crate::backend::{Backend, DeviceSlice, DeviceWeight, Elem, HotFfn};
use crate::layout::{pack_hot_slabs, RowLayout};

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

/// Upload a whole weight matrix (rows as stored).
pub(crate) fn upload_weight<B: Backend>(dev: &B, w: &Weight) -> Result<DeviceWeight<B>> {
    let all: Vec<u32> = (0..w.rows as u32).collect();
    upload_rows(dev, w, &all)
}

/// Upload rows `ids` of `w` (in that order) as a compact matrix: row k on the device is row
/// ids[k] of `w`.
pub(crate) fn upload_rows<B: Backend>(dev: &B, w: &Weight, ids: &[u32]) -> Result<DeviceWeight<B>> {
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
    let mut bytes = Vec::with_capacity(rb * ids.len());
    for &i in ids {
        ensure!((i as usize) < w.rows, Shape, "row {i} of {} rows", w.rows);
        bytes.extend_from_slice(w.row(i as usize));
    }
    Ok(DeviceWeight {
        dtype: w.dtype,
        rows: ids.len(),
        cols: w.cols,
        layout: RowLayout::dense(ids.len(), rb)?,
        data: upload(dev, &bytes)?,
    })
}

/// Pack one layer's hot neurons into slabs of `bucket` (see [`pack_hot_slabs`]) and upload
/// them: exactly `n_slabs · slab_bytes` bytes, the plan's `ffn_hot`.
pub(crate) fn upload_hot_ffn<B: Backend>(
    dev: &B,
    gate: &Weight,
    up: &Weight,
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
