//! Paths from Python, decoded as `os.fsencode` decodes them (str, bytes or any `os.PathLike`;
//! `surrogateescape` for bytes that are not UTF-8). A str the file system's encoding cannot
//! hold (a lone surrogate such as `"\ud800"`) is a typed error naming the argument: pyo3's own
//! `PathBuf` extraction panics on it ("Python API call failed").

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use powerinfer_core::Error;
use pyo3::exceptions::{PyTypeError, PyUnicodeEncodeError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::exceptions::to_pyerr;

/// `obj` as a path: `os.fsencode(obj)`'s bytes. `TypeError` for an object that is no path;
/// for one that cannot be encoded, the error `class` makes (`Error::ModelFile`,
/// `Error::Plan`, ...) naming `arg`.
pub fn fs_path(obj: &Bound<'_, PyAny>, arg: &str, class: fn(String) -> Error) -> PyResult<PathBuf> {
    let py = obj.py();
    let encoded = py.import("os")?.call_method1("fsencode", (obj,));
    match encoded {
        Ok(b) => {
            let b = b.cast_into::<PyBytes>().map_err(|_| {
                PyTypeError::new_err(format!("{arg}: os.fsencode did not return bytes"))
            })?;
            Ok(PathBuf::from(OsStr::from_bytes(b.as_bytes())))
        }
        Err(e) if e.is_instance_of::<PyUnicodeEncodeError>(py) => {
            let shown = obj
                .repr()
                .map_or_else(|_| "?".to_string(), |r| r.to_string_lossy().into_owned());
            Err(to_pyerr(
                py,
                class(format!(
                    "{arg}: the path {shown} cannot be encoded for the file system ({})",
                    e.value(py)
                )),
            ))
        }
        Err(e) => Err(e),
    }
}
