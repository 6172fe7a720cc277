//! The block formats' encoder and decoder for Python (`_core.quantize`, `_core.dequantize`):
//! the synthetic-model writers and the tests (which check them against gguf-py) use them.

use crate::exceptions::run_detached;
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray2};
use powerinfer_core::{dequantize_row, ensure, quantize_row, DType, Error};
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
    let values = x.as_array().as_standard_layout().into_owned();
    let (rows, cols) = values.dim();
    let dtype = dtype_of(py, dtype)?;
    let out = run_detached(py, move || {
        let rb = dtype.row_bytes(cols)?;
        let src = values.as_slice().expect("standard layout");
        let mut out = vec![0u8; rows * rb];
        if rb > 0 {
            out.par_chunks_mut(rb)
                .zip(src.par_chunks(cols))
                .try_for_each(|(o, x)| quantize_row(dtype, x, o))?;
        }
        Array2::from_shape_vec((rows, rb), out).map_err(|e| Error::Other(e.to_string()))
    })?;
    Ok(out.into_pyarray(py))
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
    let bytes = data.as_array().as_standard_layout().into_owned();
    let (rows, width) = bytes.dim();
    let dtype = dtype_of(py, dtype)?;
    let out = run_detached(py, move || {
        let rb = dtype.row_bytes(cols)?;
        ensure!(
            rb == width,
            Shape,
            "{rows} rows of {cols} {dtype} weights need {rb} bytes each, got {width}"
        );
        let src = bytes.as_slice().expect("standard layout");
        let mut out = vec![0f32; rows * cols];
        if rb > 0 {
            out.par_chunks_mut(cols)
                .zip(src.par_chunks(rb))
                .try_for_each(|(o, b)| dequantize_row(dtype, b, o))?;
        }
        Array2::from_shape_vec((rows, cols), out).map_err(|e| Error::Other(e.to_string()))
    })?;
    Ok(out.into_pyarray(py))
}

/// The format named `name`, or the UnsupportedError.
fn dtype_of(py: Python<'_>, name: &str) -> PyResult<DType> {
    DType::from_name(name).map_err(|e| crate::exceptions::to_pyerr(py, e))
}
