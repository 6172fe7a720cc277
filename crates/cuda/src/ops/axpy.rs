//! The accumulation kernel of `axpy_down.cu` (`y += Σ a[k] · W[row k]` over rows of a matrix):
//! the hot neurons' down pass over their slabs' down_t rows.

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn, Launch};
use crate::layout::RowLayout;

/// Most row splits (gridDim.y of axpy_rows).
const MAX_SPLITS: usize = 65_535;

/// Row splits of the hot down pass over `n_hot` slots: one per 128 rows, 1..=128. More blocks
/// for longer hot lists, so that a large GPU has enough of them in flight.
pub fn down_splits(n_hot: usize) -> usize {
    (n_hot / 128).clamp(1, 128)
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
        y.len() == l.dim,
        Shape,
        "hot_down: y {} for dim {}",
        y.len(),
        l.dim
    );
    ensure!(
        h.len() >= l.n_hot,
        Shape,
        "hot_down: h {} for {} hot",
        h.len(),
        l.n_hot
    );
    let rows = Rows {
        dtype: l.down_dtype,
        w: &ffn.data,
        l: l.down,
        cols: l.dim,
        idx: None,
    };
    launch_axpy(dev, rows, h, l.n_hot, part, y, splits)
}

/// The matrix rows an accumulation reads: `cols` weights of `dtype` per row, row k being
/// `idx[k]` (or k) laid out by `l` in `w`.
struct Rows<'a, B: Backend> {
    dtype: DType,
    w: &'a B::Buf<u8>,
    l: RowLayout,
    cols: usize,
    idx: Option<&'a B::Buf<i32>>,
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
        y,
    };
    dev.launch(add, Checked(()))
}
