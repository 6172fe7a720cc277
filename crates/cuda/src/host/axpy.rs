//! `axpy_rows_<dtype>` (axpy_down.cu): `y[c] += Σ_k a[k] · W[row k][c]`, rows with a zero
//! coefficient not read. Each column's sum is taken in row order and then added to `y`, as the
//! kernel does with one split; more splits only reorder the kernel's sum, so they are ignored.

use powerinfer_core::Result;

use super::view::{Picks, Rows};

/// `y[c] += Σ_k a[k] · W[row k][c]` for k in 0..n (`a` holds n, `y` holds the cols).
pub(super) fn axpy_rows(w: &Rows<'_>, picks: &Picks<'_>, a: &[f32], y: &mut [f32]) -> Result<()> {
    let mut sum = vec![0f32; w.cols];
    let mut row = vec![0f32; w.cols];
    for (k, &ak) in a.iter().enumerate().take(picks.n) {
        if ak == 0.0 {
            continue;
        }
        w.decode(picks.row(k)?, &mut row)?;
        for (s, &v) in sum.iter_mut().zip(&row) {
            *s += ak * v;
        }
    }
    for (o, s) in y.iter_mut().zip(sum) {
        *o += s;
    }
    Ok(())
}
