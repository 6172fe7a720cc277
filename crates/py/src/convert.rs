//! Python values into engine values: numpy arrays into `Weight`s that borrow the array's memory
//! (no copy) and keep the array alive.

use std::collections::HashMap;
use std::sync::Arc;

use numpy::{PyArrayDescrMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use powerinfer_core::{bail, ensure, Buffer, DType, Error, MatrixShape, Result, Weight};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Keeps a numpy array alive while Rust reads its memory.
struct PyOwner(#[allow(dead_code)] Py<PyAny>);

/// The bytes of a C-contiguous numpy array, borrowed (no copy): the buffer keeps the array alive.
fn borrow_bytes(name: &str, obj: &Bound<'_, PyAny>) -> Result<Buffer> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        Error::ModelFile(format!(
            "{name}: expected a numpy array, got {}",
            obj.get_type()
        ))
    })?;
    ensure!(
        arr.is_c_contiguous(),
        Shape,
        "{name}: the array must be C-contiguous"
    );
    let len = arr.len() * arr.dtype().itemsize();
    // SAFETY: `as_array_ptr` is a live PyArrayObject (we hold a reference to it through `obj`),
    // whose `data` field points at its first element.
    let ptr = unsafe { (*arr.as_array_ptr()).data } as *const u8;
    let owner: Arc<dyn Send + Sync> = Arc::new(PyOwner(obj.clone().unbind()));
    // SAFETY: the array is C-contiguous with `len` bytes at `ptr`; `owner` holds a reference to
    // it, so the memory stays allocated for the Buffer's lifetime. The loaders hand over
    // read-only memory maps and the predictors' arrays, which nothing mutates while an engine
    // uses them.
    Ok(unsafe { Buffer::borrowed(ptr, len, owner) })
}

/// `Weight::new` with the tensor's name in a shape error.
fn named_weight(
    name: &str,
    dtype: DType,
    rows: usize,
    cols: usize,
    data: Buffer,
) -> Result<Weight> {
    Weight::new(dtype, rows, cols, data).map_err(|e| match e {
        Error::Shape(m) => Error::Shape(format!("tensor {name}: {m}")),
        other => other,
    })
}

/// One `(dtype, rows, cols, uint8 array)` tuple into a borrowed `Weight`, or with `copy` (and
/// at least a huge page of bytes) into a copy of its own on huge pages (see
/// [`powerinfer_core::pages`]): a memory-mapped file is on 4 KiB pages, so a scattered row read
/// there misses the TLB on nearly every row, and the hardware prefetcher stops at each page.
fn weight_from_tuple(
    name: &str,
    t: &Bound<'_, PyTuple>,
    copy: impl Fn(MatrixShape) -> bool,
) -> Result<Weight> {
    let bad = |e: PyErr| Error::ModelFile(format!("tensor {name}: {e}"));
    ensure!(
        t.len() == 4,
        ModelFile,
        "tensor {name}: expected (dtype, rows, cols, array), got {} items",
        t.len()
    );
    let dtype = DType::from_name(
        &t.get_item(0)
            .and_then(|v| v.extract::<String>())
            .map_err(bad)?,
    )?;
    let rows: usize = t.get_item(1).and_then(|v| v.extract()).map_err(bad)?;
    let cols: usize = t.get_item(2).and_then(|v| v.extract()).map_err(bad)?;
    let obj = t.get_item(3).map_err(bad)?;
    let arr: PyReadonlyArray1<'_, u8> = obj.extract().map_err(|e| {
        Error::ModelFile(format!(
            "tensor {name}: data must be a 1-D uint8 array ({e})"
        ))
    })?;
    drop(arr);
    let mut data = borrow_bytes(name, &obj)?;
    if data.len() >= powerinfer_core::pages::HUGE_MIN && copy(MatrixShape { dtype, rows, cols }) {
        data = Buffer::from_bytes(data.as_slice());
    }
    named_weight(name, dtype, rows, cols, data)
}

/// A 2-D float16 or float32 array as a borrowed F16/F32 `Weight` of its shape, or a
/// `(dtype, rows, cols, uint8 array)` tuple as a borrowed `Weight` of that format (a block
/// format as a file stores it).
pub fn weight_from_matrix(name: &str, obj: &Bound<'_, PyAny>) -> Result<Weight> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return weight_from_tuple(name, t, |_| false);
    }
    let arr = obj
        .cast::<PyUntypedArray>()
        .map_err(|_| Error::Plan(format!("{name}: expected a 2-D numpy array")))?;
    ensure!(
        arr.ndim() == 2,
        Shape,
        "{name}: expected a 2-D array, got {} dimensions",
        arr.ndim()
    );
    let dtype = match arr.dtype().char() {
        b'e' => DType::F16,
        b'f' => DType::F32,
        c => bail!(
            Unsupported,
            "{name}: dtype {:?} (use float16 or float32)",
            c as char
        ),
    };
    let (rows, cols) = (arr.shape()[0], arr.shape()[1]);
    named_weight(name, dtype, rows, cols, borrow_bytes(name, obj)?)
}

/// The tensors dict (`name -> (dtype, rows, cols, uint8 array)`) into weights: borrowed, or
/// with `copy` the large ones copied onto huge pages ([`weight_from_tuple`]).
/// The tensors of `d`, each borrowed, or copied onto huge pages where `copy(name, shape)` says
/// (see [`weight_from_tuple`]).
pub fn tensors_from_dict(
    d: &Bound<'_, PyDict>,
    copy: impl Fn(&str, MatrixShape) -> bool,
) -> Result<HashMap<String, Weight>> {
    let mut out = HashMap::with_capacity(d.len());
    for (k, v) in d.iter() {
        let name: String = k
            .extract()
            .map_err(|e| Error::ModelFile(format!("tensor name: {e}")))?;
        let tup = v
            .cast_into::<PyTuple>()
            .map_err(|_| Error::ModelFile(format!("tensor {name}: expected a tuple")))?;
        let w = weight_from_tuple(&name, &tup, |shape| copy(&name, shape))?;
        out.insert(name, w);
    }
    Ok(out)
}
