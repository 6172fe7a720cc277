//! A 2-D weight matrix in one of the [`DType`] formats: `rows` rows of `cols` weights each, rows
//! contiguous (row r starts at byte r · row_bytes). Vectors (norm weights) are one row.

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A weight matrix viewed over a [`Buffer`].
#[derive(Clone, Debug)]
pub struct Weight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: Buffer,
}

impl Weight {
    /// Check that `data` holds exactly `rows` rows of `cols` weights in `dtype`.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: Buffer) -> Result<Weight> {
        let row_bytes = dtype.row_bytes(cols)?;
        let want = row_bytes
            .checked_mul(rows)
            .ok_or_else(|| Error::Shape(format!("{rows} x {cols} overflows")))?;
        if data.len() != want {
            return Err(Error::Shape(format!(
                "{dtype} weight of {rows} x {cols} needs {want} bytes, got {}",
                data.len()
            )));
        }
        Ok(Weight {
            dtype,
            rows,
            cols,
            data,
        })
    }

    /// An F32 weight copied from values (tests, small tensors).
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Result<Weight> {
        Weight::new(DType::F32, rows, cols, Buffer::from_f32(values))
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.as_slice()[r * rb..(r + 1) * rb]
    }

    /// All bytes.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Total bytes.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}

/// A matrix's format and shape, without its bytes (what byte accounting needs, whatever the
/// layout the bytes are kept in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixShape {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

impl From<&Weight> for MatrixShape {
    fn from(w: &Weight) -> MatrixShape {
        MatrixShape {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_is_checked() {
        let w = Weight::from_f32(2, 3, &[0.0; 6]).unwrap();
        assert_eq!(w.row_bytes(), 12);
        assert_eq!(w.row(1).len(), 12);
        let bad = Weight::new(DType::Q8_0, 2, 32, Buffer::from_bytes(&[0u8; 67]));
        assert!(matches!(bad, Err(Error::Shape(_))));
        let bad_cols = Weight::new(DType::Q4_0, 1, 31, Buffer::from_bytes(&[0u8; 18]));
        assert!(matches!(bad_cols, Err(Error::Shape(_))));
    }
}
