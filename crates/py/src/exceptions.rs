//! The exception hierarchy, declared once, here: each class is created when the module loads
//! (a subclass of `PowerInferError` and of the matching built-in, so generic handlers keep
//! working), `powerinfer_rs.errors` re-exports them, and every `powerinfer_core::Error` becomes
//! the class its [`Error::class_name`] names. A Rust panic is caught and raised as
//! `InternalError` instead of crossing into Python.

use std::panic::{catch_unwind, AssertUnwindSafe};

use powerinfer_core::Error;
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// Each class: name, the built-in it also derives from, docstring. `PowerInferError` first.
const CLASSES: [(&str, &str, &str); 11] = [
    (
        "PowerInferError",
        "Exception",
        "Base class of every powerinfer-rs error.",
    ),
    (
        "ModelFileError",
        "ValueError",
        "A model file or directory is missing, truncated or malformed.",
    ),
    (
        "UnsupportedError",
        "ValueError",
        "An architecture, weight format or feature the engine does not implement.",
    ),
    (
        "ShapeError",
        "ValueError",
        "Tensor shapes, sizes or config values do not fit together.",
    ),
    (
        "TokenError",
        "ValueError",
        "A token id outside the vocabulary.",
    ),
    (
        "ContextOverflowError",
        "ValueError",
        "More tokens than the context window holds.",
    ),
    (
        "PlanError",
        "ValueError",
        "A plan, neuron table, threshold or predictor file made for another model, or \
         inconsistent with it.",
    ),
    (
        "VramBudgetError",
        "MemoryError",
        "A placement that does not fit the VRAM budget.",
    ),
    (
        "HubError",
        "ValueError",
        "A model asked for by hub id (org/repo[:QUANT]) that cannot be fetched or resolved: \
         a missing or gated repo, no file or two files for the tag, offline without a cached \
         copy.",
    ),
    (
        "CudaError",
        "RuntimeError",
        "A CUDA driver, NVRTC or kernel launch error, or no GPU where one was asked for.",
    ),
    (
        "InternalError",
        "RuntimeError",
        "A bug: something the engine should never do. Please report it.",
    ),
];

/// The classes, created once per process in [`CLASSES`] order.
static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn create(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let builtins = py.import("builtins")?;
    let type_ = builtins.getattr("type")?;
    let mut out: Vec<Py<PyType>> = Vec::with_capacity(CLASSES.len());
    for (name, builtin, doc) in CLASSES {
        let builtin = builtins.getattr(builtin)?;
        let bases = match out.first() {
            Some(root) => PyTuple::new(py, [root.bind(py).as_any(), &builtin])?,
            None => PyTuple::new(py, [&builtin])?,
        };
        let ns = PyDict::new(py);
        ns.set_item("__doc__", doc)?;
        ns.set_item("__module__", "powerinfer_rs.errors")?;
        let cls = type_.call1((name, bases, ns))?.cast_into::<PyType>()?;
        out.push(cls.unbind());
    }
    Ok(out)
}

fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || create(py))
}

/// Add every exception class to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for ((name, _, _), cls) in CLASSES.iter().zip(types(m.py())?) {
        m.add(*name, cls.bind(m.py()))?;
    }
    Ok(())
}

/// Convert an engine error into the matching exception (`KeyboardInterrupt` for
/// [`Error::Interrupted`]).
pub fn to_pyerr(py: Python<'_>, err: Error) -> PyErr {
    if matches!(err, Error::Interrupted) {
        return PyKeyboardInterrupt::new_err("interrupted");
    }
    let want = err.class_name();
    let cls = types(py).ok().and_then(|t| {
        CLASSES
            .iter()
            .position(|(name, _, _)| *name == want)
            .map(|i| t[i].bind(py).clone())
    });
    match cls {
        Some(cls) => PyErr::from_type(cls, err.to_string()),
        None => PyRuntimeError::new_err(err.to_string()),
    }
}

/// An engine error on its way into Python: the one conversion (`?` turns a core error into
/// the matching exception wherever a binding returns [`PyResult`]).
pub struct CoreError(pub Error);

impl From<Error> for CoreError {
    fn from(e: Error) -> Self {
        CoreError(e)
    }
}

impl From<CoreError> for PyErr {
    fn from(e: CoreError) -> PyErr {
        Python::attach(|py| to_pyerr(py, e.0))
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
pub fn check<T>(r: Result<T, Error>) -> PyResult<T> {
    r.map_err(|e| CoreError(e).into())
}
