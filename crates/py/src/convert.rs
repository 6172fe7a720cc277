//! Python values into engine values: the config dict into a `ModelConfig`, and numpy byte arrays
//! into `Weight`s that borrow the array's memory (no copy) and keep the array alive.

use std::collections::HashMap;
use std::sync::Arc;

use numpy::{PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use powerinfer_core::{Activation, Buffer, DType, Error, ModelConfig, Result, RopeStyle, Weight};
use powerinfer_engine::LayerPredictor;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Keeps a numpy array alive while Rust reads its memory.
struct PyOwner(#[allow(dead_code)] Py<PyAny>);

fn field<'py, T: for<'a> FromPyObject<'a, 'py, Error = PyErr>>(
    d: &Bound<'py, PyDict>,
    key: &str,
) -> Result<T> {
    let v = d
        .get_item(key)
        .map_err(|e| Error::ModelFile(format!("config: {e}")))?
        .ok_or_else(|| Error::ModelFile(format!("config lacks {key:?}")))?;
    v.extract::<T>()
        .map_err(|e| Error::ModelFile(format!("config field {key:?}: {e}")))
}

/// Build a `ModelConfig` from the loader's config (a dict of its fields).
pub fn config_from_dict(d: &Bound<'_, PyDict>) -> Result<ModelConfig> {
    let rope: String = field(d, "rope_style")?;
    let rope_style = match rope.as_str() {
        "norm" => RopeStyle::Norm,
        "neox" => RopeStyle::Neox,
        other => return Err(Error::Unsupported(format!("rope style {other:?}"))),
    };
    let act: String = field(d, "activation")?;
    let cfg = ModelConfig {
        n_layers: field(d, "n_layers")?,
        dim: field(d, "dim")?,
        ffn_dim: field(d, "ffn_dim")?,
        n_heads: field(d, "n_heads")?,
        n_kv_heads: field(d, "n_kv_heads")?,
        head_dim: field(d, "head_dim")?,
        vocab_size: field(d, "vocab_size")?,
        max_context: field(d, "max_context")?,
        rms_eps: field(d, "rms_eps")?,
        rope_theta: field(d, "rope_theta")?,
        rope_style,
        activation: Activation::from_name(&act)?,
    };
    cfg.validate()?;
    Ok(cfg)
}

/// One `(dtype, rows, cols, uint8 array)` tuple into a borrowed `Weight`.
fn weight_from_tuple(name: &str, t: &Bound<'_, PyTuple>) -> Result<Weight> {
    let bad = |e: PyErr| Error::ModelFile(format!("tensor {name}: {e}"));
    if t.len() != 4 {
        return Err(Error::ModelFile(format!(
            "tensor {name}: expected (dtype, rows, cols, array), got {} items",
            t.len()
        )));
    }
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
    if !arr.is_c_contiguous() {
        return Err(Error::ModelFile(format!(
            "tensor {name}: data must be contiguous"
        )));
    }
    let ptr = arr.as_raw_array().as_ptr();
    let len = arr.len();
    let owner: Arc<dyn Send + Sync> = Arc::new(PyOwner(obj.unbind()));
    // SAFETY: the array is C-contiguous with `len` bytes at `ptr`; `owner` holds a reference to
    // it, so the memory stays mapped for the Buffer's lifetime. The loaders hand over read-only
    // memory maps, which nothing mutates.
    let data = unsafe { Buffer::borrowed(ptr, len, owner) };
    Weight::new(dtype, rows, cols, data).map_err(|e| match e {
        Error::Shape(m) => Error::Shape(format!("tensor {name}: {m}")),
        other => other,
    })
}

/// The tensors dict (`name -> (dtype, rows, cols, uint8 array)`) into weights.
pub fn tensors_from_dict(d: &Bound<'_, PyDict>) -> Result<HashMap<String, Weight>> {
    let mut out = HashMap::with_capacity(d.len());
    for (k, v) in d.iter() {
        let name: String = k
            .extract()
            .map_err(|e| Error::ModelFile(format!("tensor name: {e}")))?;
        let tup = v
            .cast_into::<PyTuple>()
            .map_err(|_| Error::ModelFile(format!("tensor {name}: expected a tuple")))?;
        let w = weight_from_tuple(&name, &tup)?;
        out.insert(name, w);
    }
    Ok(out)
}

/// Predictors from `{"blk.N.fc1": tuple, "blk.N.fc2": tuple, "blk.N.threshold": float}`;
/// fc2 ([ffn, rank]) is transposed once so its rows are per hidden unit.
pub fn predictors_from_dict(d: &Bound<'_, PyDict>, n_layers: usize) -> Result<Vec<LayerPredictor>> {
    let mut out = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let get = |name: String| -> Result<Bound<'_, PyAny>> {
            d.get_item(&name)
                .map_err(|e| Error::Plan(format!("{name}: {e}")))?
                .ok_or_else(|| Error::Plan(format!("predictors lack {name}")))
        };
        let tuple = |name: String| -> Result<Weight> {
            let v = get(name.clone())?;
            let t = v
                .cast_into::<PyTuple>()
                .map_err(|_| Error::Plan(format!("{name}: expected a tuple")))?;
            weight_from_tuple(&name, &t)
        };
        let fc1 = tuple(format!("blk.{i}.fc1"))?;
        let fc2 = tuple(format!("blk.{i}.fc2"))?;
        let threshold: f32 = get(format!("blk.{i}.threshold"))?
            .extract()
            .map_err(|e| Error::Plan(format!("blk.{i}.threshold: {e}")))?;
        if fc2.cols != fc1.rows {
            return Err(Error::Plan(format!(
                "predictor {i}: fc1 has rank {} but fc2 has {} columns",
                fc1.rows, fc2.cols
            )));
        }
        let fc2_t = powerinfer_engine::transpose::transpose(&fc2)?;
        out.push(LayerPredictor {
            fc1,
            fc2_t,
            threshold,
        });
    }
    Ok(out)
}
