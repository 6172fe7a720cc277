//! The contracts of `axpy_rows_<dtype>` and `add_splits` (axpy_down.cu) on host memory:
//! `y[c] += Σ_k a[k] · W[row k][c]`, rows with a zero coefficient not read. As the kernel: with one split each column's sum is taken in
//! row order and then added to `y`; with more, the rows are cut into runs of `ceil(n / splits)`,
//! each run's sums are written to `part`, and `add_splits` adds them to `y` in split order, so
//! this backend sums in the kernels' order.

use std::ops::Range;

use powerinfer_core::Result;

use crate::host::view::{Picks, Rows};

/// `out[c] = Σ_k a[k] · W[row k][c]` for k in `ks`, in order (`out` holds the cols).
fn sum_rows(
    w: &Rows<'_>,
    picks: &Picks<'_>,
    a: &[f32],
    ks: Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    let mut row = vec![0f32; w.cols];
    out.fill(0.0);
    for k in ks {
        let ak = a[k];
        if ak == 0.0 {
            continue;
        }
        w.decode(picks.row(k)?, &mut row)?;
        for (s, &v) in out.iter_mut().zip(&row) {
            *s += ak * v;
        }
    }
    Ok(())
}

/// `y[c] += Σ_k a[k] · W[row k][c]` over the picked rows (`a` holds one per row, `y` the
/// cols): one split, its sum added to `y` whole.
pub(crate) fn axpy_rows(w: &Rows<'_>, picks: &Picks<'_>, a: &[f32], y: &mut [f32]) -> Result<()> {
    let mut sum = vec![0f32; w.cols];
    sum_rows(w, picks, a, 0..picks.n, &mut sum)?;
    for (o, s) in y.iter_mut().zip(sum) {
        *o += s;
    }
    Ok(())
}

/// The first pass of a split `axpy_rows`: `part[s · cols + c]` = split `s`'s sum (`part` holds
/// splits · cols; `splits` ≥ 1).
pub(crate) fn axpy_split_rows(
    w: &Rows<'_>,
    picks: &Picks<'_>,
    a: &[f32],
    splits: usize,
    part: &mut [f32],
) -> Result<()> {
    let n = picks.n;
    let per = n.div_ceil(splits);
    for (s, out) in part.chunks_exact_mut(w.cols).take(splits).enumerate() {
        let k0 = (s * per).min(n);
        sum_rows(w, picks, a, k0..(k0 + per).min(n), out)?;
    }
    Ok(())
}

/// `y[c] += part[0][c] + ... + part[splits - 1][c]`, summed in that order.
pub(crate) fn add_splits(part: &[f32], splits: usize, y: &mut [f32]) {
    let cols = y.len();
    for (c, o) in y.iter_mut().enumerate() {
        let mut s = 0f32;
        for k in 0..splits {
            s += part[k * cols + c];
        }
        *o += s;
    }
}
