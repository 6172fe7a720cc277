//! Errors across the boundary: each `powerinfer_core::Error` variant maps to one class of the
//! Python hierarchy in `powerinfer_rs.errors`, and a Rust panic is caught and raised as
//! `InternalError` instead of crossing into Python.

use std::panic::{catch_unwind, AssertUnwindSafe};

use powerinfer_core::Error;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The Python class name for an error.
fn class_name(err: &Error) -> &'static str {
    match err {
        Error::Shape(_) => "ShapeError",
        Error::Unsupported(_) => "UnsupportedError",
        Error::ModelFile(_) => "ModelFileError",
        Error::Token(_) => "TokenError",
        Error::ContextOverflow(_) => "ContextOverflowError",
        Error::Plan(_) => "PlanError",
        Error::Cuda(_) => "CudaError",
        Error::Interrupted | Error::Other(_) => "InternalError",
    }
}

/// Convert an engine error into the matching `powerinfer_rs.errors` exception.
pub fn to_pyerr(py: Python<'_>, err: Error) -> PyErr {
    if matches!(err, Error::Interrupted) {
        return PyKeyboardInterrupt::new_err("interrupted");
    }
    let msg = err.to_string();
    let class = py
        .import("powerinfer_rs.errors")
        .and_then(|m| m.getattr(class_name(&err)))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(cls) => PyErr::from_type(cls, msg),
        Err(_) => PyRuntimeError::new_err(msg),
    }
}

/// Run `f` with the GIL released; map its error, and turn a panic into `InternalError`.
pub fn run_detached<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce() -> Result<T, Error> + Send,
{
    let out = py.detach(|| catch_unwind(AssertUnwindSafe(f)));
    match out {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(to_pyerr(py, e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(to_pyerr(
                py,
                Error::Other(format!("internal error (Rust panic): {what}")),
            ))
        }
    }
}

/// Map a plain `Result` (no GIL release needed).
pub fn check<T>(py: Python<'_>, r: Result<T, Error>) -> PyResult<T> {
    r.map_err(|e| to_pyerr(py, e))
}
