//! The accumulation kernel of `axpy_down.cu` (`y += Σ a[k] · W[row k]` over rows of a matrix):
//! the hot neurons' down pass over their slabs' down_t rows.

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn, Launch};
use crate::layout::RowLayout;
use crate::ops::compact::Compacted;

/// Most row splits (gridDim.y of axpy_rows).
const MAX_SPLITS: usize = 65_535;

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

/// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots.
pub(crate) fn hot_down<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    h: &B::Buf<f32>,
    part: &mut B::Buf<f32>,
    y: &mut B::Buf<f32>,
    splits: usize,
) -> Result<()> {
    let l = &ffn.layout;
    ensure!(
        h.len() >= l.n_hot,
        Shape,
        "hot_down: h {} for {} hot",
        h.len(),
        l.n_hot
    );
    let rows = down_rows(ffn, y.len(), None)?;
    launch_axpy(dev, rows, h, l.n_hot, part, y, splits)
}

/// The hot neurons' down pass over a compacted list: `y += Σ_j list.a[j] · down_t[list.idx[j]]`
/// for the list's first count entries (at most `n_hot`; compact_nonzero wrote them).
pub(crate) fn hot_down_listed<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    list: &Compacted<B>,
    part: &mut B::Buf<f32>,
    y: &mut B::Buf<f32>,
    splits: usize,
) -> Result<()> {
    let Some(a) = &list.a else {
        powerinfer_core::bail!(Shape, "hot_down: a list without coefficients");
    };
    list.check(ffn.layout.n_hot, "hot_down")?;
    let rows = down_rows(ffn, y.len(), Some(list))?;
    launch_axpy(dev, rows, a, ffn.layout.n_hot, part, y, splits)
}

/// The down_t rows of `ffn`'s slabs a down pass into a `y` of `y_len` reads (checked: dim
/// values): every hot slot, or the slots of a compacted `list` up to its count.
fn down_rows<'a, B: Backend>(
    ffn: &'a HotFfn<B>,
    y_len: usize,
    list: Option<&'a Compacted<B>>,
) -> Result<Rows<'a, B>> {
    let l = &ffn.layout;
    ensure!(
        y_len == l.dim,
        Shape,
        "hot_down: y {y_len} for dim {}",
        l.dim
    );
    Ok(Rows {
        dtype: l.down_dtype,
        w: &ffn.data,
        l: l.down,
        cols: l.dim,
        idx: list.map(|c| &c.idx),
        count: list.map(|c| &c.count),
    })
}

/// The matrix rows an accumulation reads: `cols` weights of `dtype` per row, row k being
/// `idx[k]` (or k) laid out by `l` in `w`.
struct Rows<'a, B: Backend> {
    dtype: DType,
    w: &'a B::Buf<u8>,
    l: RowLayout,
    cols: usize,
    idx: Option<&'a B::Buf<i32>>,
    /// With a compacted list: its count (the rows are the first count of n).
    count: Option<&'a B::Buf<i32>>,
}

/// Queue axpy_rows (and, for more than one split, add_splits) after the callers' checks:
/// nothing for no rows or no columns, `splits` clamped to 1..=min(n, 65,535), `part` checked
/// to hold splits · cols.
fn launch_axpy<B: Backend>(
    dev: &B,
    rows: Rows<'_, B>,
    a: &B::Buf<f32>,
    n: usize,
    part: &mut B::Buf<f32>,
    y: &mut B::Buf<f32>,
    splits: usize,
) -> Result<()> {
    let cols = rows.cols;
    if n == 0 || cols == 0 {
        return Ok(());
    }
    let splits = splits.clamp(1, n.min(MAX_SPLITS));
    let single = splits == 1;
    if !single {
        ensure!(
            part.len() >= splits * cols,
            Shape,
            "axpy_rows: part holds {} floats, {splits} splits of {cols} need {}",
            part.len(),
            splits * cols
        );
    }
    let launch = Launch::AxpyRows {
        dtype: rows.dtype,
        w: rows.w,
        l: rows.l,
        cols,
        idx: rows.idx,
        a,
        n,
        count: rows.count,
        part: if single { None } else { Some(&mut *part) },
        y: &mut *y,
        splits,
    };
    dev.launch(launch, Checked(()))?;
    if single {
        return Ok(());
    }
    let add = Launch::AddSplits {
        part: &*part,
        splits,
        cols,
        count: rows.count,
        n,
        y,
    };
    dev.launch(add, Checked(()))
}
