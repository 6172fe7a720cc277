//! The launches of `kernels/axpy_down.cu`: one struct per kernel, its fields the kernel's
//! parameters in order.

use powerinfer_core::{DType, Error};

use super::host;
use crate::backend::{kernel, Backend};
use crate::host::view::{counted, prefix, prefix_mut, product, Picks, Rows};
use crate::kernels::{dtype_suffix, KernelSource};
use crate::launch_spec::{tile_geometry, LaunchSpec, ROW_THREADS};
use crate::layout::{to_i32, RowLayout};

/// `kernels/axpy_down.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "axpy_down",
    include_str!("../../../kernels/axpy_down.cu"),
    &["add_splits"],
)
.per_dtype(&["axpy_rows"]);

/// Most row splits (gridDim.y of axpy_rows).
pub(crate) const MAX_SPLITS: usize = 65_535;

/// Row splits of the hot down pass over `n_hot` slots: one per 128 rows, 1..=128. More blocks
/// for longer hot lists, so that a large GPU has enough of them in flight.
pub fn down_splits(n_hot: usize) -> usize {
    (n_hot / SPLIT_ROWS).clamp(1, 128)
}

/// Rows per split of the down pass (`SPLIT_ROWS` in axpy_down.cu).
pub const SPLIT_ROWS: usize = 128;

/// The splits a down pass over a compacted list of `n` rows runs (the kernels compute it from
/// the device count): one per 128 rows, 1..=`splits` (those launched).
pub fn live_splits(n: usize, splits: usize) -> usize {
    n.div_ceil(SPLIT_ROWS).clamp(1, splits.max(1))
}

/// Floats of the split sums' buffer for a model of `dim` and `ffn` neurons: enough for
/// [`down_splits`] of every hot list (at most `ffn` slots).
pub fn part_len(dim: usize, ffn: usize) -> usize {
    dim * down_splits(ffn)
}

kernel! {
    /// `axpy_rows_<dtype>`: `y[c] += Σ_k a[k] · W[row k][c]`, rows with a zero coefficient not
    /// read; `splits` blocks along the rows (gridDim.y). With one split the sum goes to `y`; with
    /// more, split `s` writes its partial sums to `part[s · cols ..]` (`part` holds at least
    /// splits · cols) and [`AddSplits`] adds them to `y`. With `count` (a compacted list) the rows
    /// are the first `min(count[0], n)`, in one split per 128 of them (at most `splits`:
    /// [`live_splits`]).
    struct AxpyRows<'a, B> {
        dtype: DType,
        w: &'a B::Buf<u8>,
        l: RowLayout,
        cols: usize,
        idx: Option<&'a B::Buf<i32>>,
        a: &'a B::Buf<f32>,
        n: usize,
        count: Option<&'a B::Buf<i32>>,
        part: Option<&'a mut B::Buf<f32>>,
        y: &'a mut B::Buf<f32>,
        splits: usize,
    }
    entry(k) = format!("axpy_rows_{}", dtype_suffix(k.dtype));
    spec(k, dev, a) {
        // axpy_rows_<dtype>(w, l, cols, idx, a, n, count, part, y, units_pb): a holds n floats, y
        // `cols`, part (null for one split) splits · cols, count (null: none) one int; splits is
        // 1..=min(n, 65,535) (the op clamps it), gridDim.y; the block geometry from tile_geometry.
        let opt = |b: Option<&B::Buf<i32>>| b.map_or(0, |b| dev.addr(b));
        let entry = k.entry();
        a.ptr(dev.addr(k.w))
            .layout(&k.l)
            .i32(to_i32(k.cols, "cols")?)
            .ptr(opt(k.idx));
        a.ptr(dev.addr(k.a))
            .i32(to_i32(k.n, "rows")?)
            .ptr(opt(k.count))
            .ptr(k.part.map_or(0, |p| dev.addr_mut(p)))
            .ptr(dev.addr_mut(k.y));
        let (gx, units_pb, smem) = tile_geometry(k.dtype, k.cols)?;
        a.i32(to_i32(units_pb, "units per block")?);
        let blocks = [gx, k.splits as u32];
        Ok(LaunchSpec::new(&SOURCE, entry, blocks, ROW_THREADS, smem, a))
    }
    host(k) {
        let launched = k.splits;
        if launched == 0 {
            return Err(Error::Shape("splits must be > 0".into()));
        }
        let count = k.count.map(|c| B::data(c));
        let n = counted(count, k.n)?;
        let splits = match count {
            Some(_) => live_splits(n, launched),
            None => launched,
        };
        let w = Rows::new(B::data(k.w), k.l, k.dtype, k.cols, "w")?;
        let picks = Picks::new(k.idx.map(|i| B::data(i)), n)?;
        let a = prefix(B::data(k.a), n, "a")?;
        if launched == 1 {
            let y = prefix_mut(B::data_mut(k.y), k.cols, "y")?;
            return host::axpy_rows(&w, &picks, a, y);
        }
        let part = k
            .part
            .ok_or_else(|| Error::Shape("split axpy_rows without part".into()))?;
        let len = product(launched, k.cols, "part")?;
        let part = prefix_mut(B::data_mut(part), len, "part")?;
        host::axpy_split_rows(&w, &picks, a, splits, part)
    }
}

impl<'a, B: Backend> AxpyRows<'a, B> {
    /// `y[c] += Σ_k a[k] · W[row k][c]` over the rows 0..n of `w` (`dtype`, laid out by `l`,
    /// `cols` columns) in one split: no index list, no count; the other fields are set from
    /// there.
    pub fn rows(
        dtype: DType,
        w: &'a B::Buf<u8>,
        l: RowLayout,
        cols: usize,
        a: &'a B::Buf<f32>,
        n: usize,
        y: &'a mut B::Buf<f32>,
    ) -> Self {
        AxpyRows {
            dtype,
            w,
            l,
            cols,
            idx: None,
            a,
            n,
            count: None,
            part: None,
            y,
            splits: 1,
        }
    }
}

kernel! {
    /// `add_splits`: `y[c] += Σ_s part[s · cols + c]` for s in 0..splits, in that order; with
    /// `count`, over the live splits of `min(count[0], n)` rows.
    struct AddSplits<'a, B> {
        part: &'a B::Buf<f32>,
        splits: usize,
        cols: usize,
        count: Option<&'a B::Buf<i32>>,
        n: usize,
        y: &'a mut B::Buf<f32>,
    }
    entry = "add_splits";
    spec(k, dev, a) {
        // add_splits(part, splits, cols, count, n, y): thread per column.
        a.ptr(dev.addr(k.part))
            .i32(to_i32(k.splits, "splits")?)
            .i32(to_i32(k.cols, "cols")?)
            .ptr(k.count.map_or(0, |c| dev.addr(c)))
            .i32(to_i32(k.n, "rows")?)
            .ptr(dev.addr_mut(k.y));
        LaunchSpec::per_element(&SOURCE, k.entry(), k.cols, a)
    }
    host(k) {
        let len = product(k.splits, k.cols, "part")?;
        let part = prefix(B::data(k.part), len, "part")?;
        let y = prefix_mut(B::data_mut(k.y), k.cols, "y")?;
        let splits = match k.count {
            Some(c) => live_splits(counted(Some(B::data(c)), k.n)?, k.splits),
            None => k.splits,
        };
        host::add_splits(part, splits, y);
        Ok(())
    }
}
