//! The accumulation family (`kernels/axpy_down.cu`: `y += Σ a[k] · W[row k]` over rows of a
//! matrix): the hot neurons' down pass over their slabs' down_t rows, checked ([`AxpyOps`]),
//! launched ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn};
use crate::layout::RowLayout;
use crate::ops::compact::Compacted;

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

pub use launch::{down_splits, live_splits, part_len, SPLIT_ROWS};
use launch::{AddSplits, AxpyRows, MAX_SPLITS};

/// The hot neurons' down pass, checked, on any backend.
pub trait AxpyOps: Backend {
    /// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots, the rows cut
    /// into `splits` runs (clamped to 1..=min(n_hot, 65,535)) whose partial sums go through
    /// `part` (at least splits · dim floats; [`down_splits`] and [`part_len`] size it) and are
    /// added in a fixed order: the result is the same bits on every run.
    fn hot_down(
        &self,
        ffn: &HotFfn<Self>,
        h: &Self::Buf<f32>,
        part: &mut Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
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
        launch_axpy(self, rows, h, l.n_hot, part, y, splits)
    }

    /// The hot neurons' down pass over a compacted list ([`CompactOps::nonzero_rows`]):
    /// `y += Σ_j list.a[j] · down_t[list.idx[j]]` for the list's first count entries (at most
    /// `n_hot`), split as [`AxpyOps::hot_down`] over one split per 128 rows (at most `splits`,
    /// chosen on the GPU from the count): the same bits on every run.
    ///
    /// [`CompactOps::nonzero_rows`]: crate::ops::compact::CompactOps::nonzero_rows
    fn hot_down_listed(
        &self,
        ffn: &HotFfn<Self>,
        list: &Compacted<Self>,
        part: &mut Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        splits: usize,
    ) -> Result<()> {
        let Some(a) = &list.a else {
            powerinfer_core::bail!(Shape, "hot_down: a list without coefficients");
        };
        list.check(ffn.layout.n_hot, "hot_down")?;
        let rows = down_rows(ffn, y.len(), Some(list))?;
        launch_axpy(self, rows, a, ffn.layout.n_hot, part, y, splits)
    }
}

impl<B: Backend> AxpyOps for B {}

/// The down_t rows of `ffn`'s slabs a down pass into a `y` of `y_len` reads (checked: dim
/// values): every hot slot, or the slots of a compacted `list` up to its count.
fn down_rows<'a, B: Backend>(
    ffn: &'a HotFfn<B>,
    y_len: usize,
    list: Option<&'a Compacted<B>>,
) -> Result<DownRows<'a, B>> {
    let l = &ffn.layout;
    ensure!(
        y_len == l.dim,
        Shape,
        "hot_down: y {y_len} for dim {}",
        l.dim
    );
    Ok(DownRows {
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
struct DownRows<'a, B: Backend> {
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
    rows: DownRows<'_, B>,
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
    let launch = AxpyRows {
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
    let add = AddSplits {
        part: &*part,
        splits,
        cols,
        count: rows.count,
        n,
        y,
    };
    dev.launch(add, Checked(()))
}
