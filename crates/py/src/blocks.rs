//! The block formats' encoder and decoder for Python (`_core.quantize`, `_core.dequantize`):
//! the synthetic-model writers and the tests (which check them against gguf-py) use them.

use crate::exceptions::run_detached;
use numpy::ndarray::Array2;
use numpy::{Element, IntoPyArray, PyArray2, PyReadonlyArray2};
use powerinfer_core::{dequantize_row, ensure, quantize_row, DType, Error, Result};
use pyo3::prelude::*;
use rayon::prelude::*;

/// Encode each row of the 2-D float32 array `x` in `dtype` ("Q4_K", "Q8_0", ...): a uint8
/// array of shape (rows, row bytes). A row length that is not a whole number of blocks is a
/// ShapeError, an unknown format an UnsupportedError.
#[pyfunction]
pub fn quantize<'py>(
    py: Python<'py>,
    dtype: &str,
    x: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let dtype = dtype_of(py, dtype)?;
    convert_rows(
        py,
        x,
        move |_, cols| dtype.row_bytes(cols),
        move |x, o| quantize_row(dtype, x, o),
    )
}

/// Decode each row of the 2-D uint8 array `data` (rows of `cols` weights in `dtype`) to
/// float32: an array of shape (rows, cols).
#[pyfunction]
pub fn dequantize<'py>(
    py: Python<'py>,
    dtype: &str,
    data: PyReadonlyArray2<'py, u8>,
    cols: usize,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let dtype = dtype_of(py, dtype)?;
    let width_of = move |rows, width| {
        let rb = dtype.row_bytes(cols)?;
        ensure!(
            rb == width,
            Shape,
            "{rows} rows of {cols} {dtype} weights need {rb} bytes each, got {width}"
        );
        Ok(cols)
    };
    convert_rows(py, data, width_of, move |b, o| dequantize_row(dtype, b, o))
}

/// Each row of the 2-D array `src` turned by `row` into a row of `width_of(rows, src
/// width)` items, in parallel with the GIL released: the (rows, width) array (every row empty
/// when either width is 0).
fn convert_rows<'py, S, D>(
    py: Python<'py>,
    src: PyReadonlyArray2<'py, S>,
    width_of: impl FnOnce(usize, usize) -> Result<usize> + Send,
    row: impl Fn(&[S], &mut [D]) -> Result<()> + Sync + Send,
) -> PyResult<Bound<'py, PyArray2<D>>>
where
    S: Element + Copy + Sync + Send,
    D: Element + Copy + Default + Send,
{
    let src = src.as_array().as_standard_layout().into_owned();
    let (rows, src_width) = src.dim();
    let out = run_detached(py, move || {
        let width = width_of(rows, src_width)?;
        let src = src.as_slice().expect("standard layout");
        let mut out = vec![D::default(); rows * width];
        if src_width > 0 && width > 0 {
            out.par_chunks_mut(width)
                .zip(src.par_chunks(src_width))
                .try_for_each(|(o, s)| row(s, o))?;
        }
        Array2::from_shape_vec((rows, width), out).map_err(|e| Error::Other(e.to_string()))
    })?;
    Ok(out.into_pyarray(py))
}

/// The format named `name`, or the UnsupportedError.
fn dtype_of(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name).map_err(|e| crate::exceptions::to_pyerr(py, e))
}
