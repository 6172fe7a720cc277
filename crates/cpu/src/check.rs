//! Shape checks shared by the ops and the references: every size mismatch is an
//! `Error::Shape`, never a panic or an out-of-bounds read.

use powerinfer_core::{ensure, DType, Result, Weight};

/// Error unless `got == want`: `"{op}: {what} has {got} values, want {want} ({why})"`.
pub(crate) fn len(op: &str, what: &str, got: usize, want: usize, why: &str) -> Result<()> {
    ensure!(
        got == want,
        Shape,
        "{op}: {what} has {got} values, want {want} ({why})"
    );
    Ok(())
}

/// Error unless `row` holds exactly `n` weights of `dtype`.
pub(crate) fn row(dtype: DType, row: &[u8], n: usize) -> Result<()> {
    let want = dtype.row_bytes(n)?;
    ensure!(
        row.len() == want,
        Shape,
        "{dtype} row of {n} weights needs {want} bytes, got {}",
        row.len()
    );
    Ok(())
}

/// Error unless the weight's buffer holds exactly `rows` rows of `cols` weights.
pub(crate) fn weight_bytes(w: &Weight) -> Result<()> {
    let want = w.dtype.row_bytes(w.cols)?.checked_mul(w.rows);
    ensure!(
        want == Some(w.n_bytes()),
        Shape,
        "{} weight of {} x {} needs {:?} bytes, has {}",
        w.dtype,
        w.rows,
        w.cols,
        want,
        w.n_bytes()
    );
    Ok(())
}

/// Error unless `x` has `w.cols` values, `y` has `w.rows` and the weight's bytes fit its shape.
pub(crate) fn matvec(w: &Weight, x: &[f32], y: &[f32]) -> Result<()> {
    len("matvec", "x", x.len(), w.cols, "the weight's cols")?;
    len("matvec", "y", y.len(), w.rows, "the weight's rows")?;
    weight_bytes(w)
}

/// A weight's rows, checked against its shape and an index list.
pub(crate) struct Rows<'a> {
    data: &'a [u8],
    /// Bytes per row.
    pub(crate) bytes: usize,
}

impl<'a> Rows<'a> {
    /// Error unless the weight's bytes fit its shape and every index names one of its rows.
    pub(crate) fn new(w: &'a Weight, idx: &[u32], what: &str) -> Result<Rows<'a>> {
        weight_bytes(w)?;
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= w.rows) {
            powerinfer_core::bail!(
                Shape,
                "{what}: index {bad} out of range for {} rows",
                w.rows
            );
        }
        Ok(Rows {
            data: w.bytes(),
            bytes: w.dtype.row_bytes(w.cols)?,
        })
    }

    /// Row `i` (checked in range by [`Rows::new`]).
    #[inline]
    pub(crate) fn get(&self, i: u32) -> &'a [u8] {
        &self.data[i as usize * self.bytes..][..self.bytes]
    }
}
