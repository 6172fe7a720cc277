//! A weight matrix in the layout its dense products read fastest ([`Matrix`]): the file's
//! row-major rows, or, for the formats that have one, rows interleaved by eight
//! ([`Interleaved`]), repacked once at load in place of the file's layout (one copy in memory).
//! [`MatrixRef`] is the borrowed view the products take, so a plain [`Weight`] goes wherever a
//! matrix does.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use powerinfer_core::{DType, MatrixShape, Result, Weight};

use super::interleaved::Interleaved;

/// A weight matrix in one of the two layouts.
#[derive(Clone, Debug)]
pub enum Matrix {
    /// The file's rows, row r at byte r · row_bytes.
    Rows(Weight),
    /// Rows interleaved by eight (the formats [`Interleaved`] has a layout for).
    Interleaved(Arc<Interleaved>, Arc<OnceLock<Weight>>),
}

/// A borrowed [`Matrix`] (or [`Weight`]): what the dense products take.
#[derive(Clone, Copy, Debug)]
pub enum MatrixRef<'a> {
    Rows(&'a Weight),
    Interleaved(&'a Interleaved),
}

impl Matrix {
    /// `w` in the layout its dense products read fastest: interleaved where that layout pays
    /// ([`Interleaved::pays`]) and [`crate::interleaving`] allows, else as it is. The
    /// row-major bytes are dropped with `w`.
    pub fn for_products(w: Weight) -> Result<Matrix> {
        match crate::interleaving() && Interleaved::pays((&w).into()) {
            true => Ok(Matrix::Interleaved(
                Arc::new(Interleaved::new(&w)?),
                Arc::default(),
            )),
            false => Ok(Matrix::Rows(w)),
        }
    }

    /// The borrowed view.
    pub fn view(&self) -> MatrixRef<'_> {
        match self {
            Matrix::Rows(w) => MatrixRef::Rows(w),
            Matrix::Interleaved(w, _) => MatrixRef::Interleaved(w),
        }
    }

    /// Rows (output values).
    pub fn rows(&self) -> usize {
        self.view().rows()
    }

    /// Columns (input values).
    pub fn cols(&self) -> usize {
        self.view().cols()
    }

    /// The weights' format.
    pub fn dtype(&self) -> DType {
        self.view().dtype()
    }

    /// Format and shape.
    pub fn shape(&self) -> MatrixShape {
        MatrixShape {
            dtype: self.dtype(),
            rows: self.rows(),
            cols: self.cols(),
        }
    }

    /// Bytes of the matrix (the same in both layouts).
    pub fn n_bytes(&self) -> usize {
        match self {
            Matrix::Rows(w) => w.n_bytes(),
            Matrix::Interleaved(w, _) => w.n_bytes(),
        }
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.dtype().row_bytes(self.cols()).unwrap_or(0)
    }

    /// Whether the rows are interleaved.
    pub fn is_interleaved(&self) -> bool {
        matches!(self, Matrix::Interleaved(..))
    }

    /// The row-major weight, when the rows are not interleaved.
    pub fn as_rows(&self) -> Option<&Weight> {
        match self {
            Matrix::Rows(w) => Some(w),
            Matrix::Interleaved(..) => None,
        }
    }

    /// The matrix's rows by index, for the products that read chosen rows (the sparse modes'
    /// gate and up rows, the neuron store, the GPU's hot rows): the weight itself, or for an
    /// interleaved matrix a row-major copy gathered on first use and kept beside it (a second
    /// copy: a model loaded for dense decoding that then runs a sparse mode pays it).
    pub fn indexed(&self) -> Result<&Weight> {
        match self {
            Matrix::Rows(w) => Ok(w),
            Matrix::Interleaved(w, cell) => {
                if let Some(rows) = cell.get() {
                    return Ok(rows);
                }
                // Two threads may both gather; one copy is kept.
                let _ = cell.set(w.to_weight()?);
                cell.get().ok_or_else(|| {
                    powerinfer_core::Error::Other("the gathered rows were not kept".into())
                })
            }
        }
    }

    /// Whether [`Matrix::indexed`] has made a second, row-major copy.
    pub fn has_indexed_copy(&self) -> bool {
        matches!(self, Matrix::Interleaved(_, cell) if cell.get().is_some())
    }

    /// The matrix in the file's row-major layout: itself, or a copy gathered back from the
    /// interleaved groups (for readers that take rows by index once: GPU upload, the input
    /// mode's copies, column norms).
    pub fn to_rows(&self) -> Result<Cow<'_, Weight>> {
        match self {
            Matrix::Rows(w) => Ok(Cow::Borrowed(w)),
            Matrix::Interleaved(w, cell) => match cell.get() {
                Some(rows) => Ok(Cow::Borrowed(rows)),
                None => Ok(Cow::Owned(w.to_weight()?)),
            },
        }
    }

    /// Row `r`'s bytes in the file's layout (borrowed, or gathered from its group).
    pub fn row(&self, r: usize) -> Cow<'_, [u8]> {
        self.view().row(r)
    }

    /// Address of the first byte the products read (for zero-copy checks).
    pub fn as_ptr(&self) -> *const u8 {
        self.view().as_ptr()
    }
}

impl<'a> MatrixRef<'a> {
    /// Row `r`'s bytes in the file's layout (borrowed, or gathered from its group).
    pub fn row(&self, r: usize) -> Cow<'a, [u8]> {
        match *self {
            MatrixRef::Rows(w) => Cow::Borrowed(w.row(r)),
            MatrixRef::Interleaved(w) => Cow::Owned(w.row(r)),
        }
    }

    /// Address of the first byte the products read (for zero-copy checks).
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            MatrixRef::Rows(w) => w.data.as_ptr(),
            MatrixRef::Interleaved(w) => w.as_ptr(),
        }
    }

    /// Whether the rows are interleaved.
    pub fn is_interleaved(&self) -> bool {
        matches!(self, MatrixRef::Interleaved(_))
    }

    /// Rows (output values).
    pub fn rows(&self) -> usize {
        match self {
            MatrixRef::Rows(w) => w.rows,
            MatrixRef::Interleaved(w) => w.rows,
        }
    }

    /// Columns (input values).
    pub fn cols(&self) -> usize {
        match self {
            MatrixRef::Rows(w) => w.cols,
            MatrixRef::Interleaved(w) => w.cols,
        }
    }

    /// The weights' format.
    pub fn dtype(&self) -> DType {
        match self {
            MatrixRef::Rows(w) => w.dtype,
            MatrixRef::Interleaved(w) => w.dtype,
        }
    }

    /// `f` of rows `range`'s bytes in the file's layout, row after row: borrowed from a
    /// row-major weight, gathered from the groups of an interleaved one.
    pub(crate) fn with_rows<R>(
        &self,
        range: std::ops::Range<usize>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> R {
        match self {
            MatrixRef::Rows(w) => {
                let rb = w.row_bytes();
                f(&w.bytes()[range.start * rb..range.end * rb])
            }
            MatrixRef::Interleaved(w) => {
                let rb = w.blocks() * w.dtype.block_bytes();
                let mut bytes = vec![0u8; range.len() * rb];
                w.rows_into(range, &mut bytes);
                f(&bytes)
            }
        }
    }
}

impl<'a> From<&'a Weight> for MatrixRef<'a> {
    fn from(w: &'a Weight) -> Self {
        MatrixRef::Rows(w)
    }
}

impl<'a> From<&'a Matrix> for MatrixRef<'a> {
    fn from(m: &'a Matrix) -> Self {
        m.view()
    }
}

impl<'a> From<&'a Interleaved> for MatrixRef<'a> {
    fn from(w: &'a Interleaved) -> Self {
        MatrixRef::Interleaved(w)
    }
}

impl From<&Matrix> for MatrixShape {
    fn from(m: &Matrix) -> MatrixShape {
        m.shape()
    }
}
