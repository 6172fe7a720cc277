//! Python values into engine values: the config dict into a `ModelConfig`, and numpy arrays into
//! `Weight`s that borrow the array's memory (no copy) and keep the array alive.

use std::collections::HashMap;
use std::sync::Arc;

use numpy::{PyArrayDescrMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use powerinfer_core::{
    bail, ensure, Activation, ArchFeatures, Buffer, DType, Error, ModelConfig, Result, RopeScaling,
    RopeStyle, Weight,
};
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

/// An optional config field: `default` when absent or None.
fn field_or<'py, T: for<'a> FromPyObject<'a, 'py, Error = PyErr>>(
    d: &Bound<'py, PyDict>,
    key: &str,
    default: T,
) -> Result<T> {
    match d.get_item(key) {
        Ok(Some(v)) if !v.is_none() => v
            .extract::<T>()
            .map_err(|e| Error::ModelFile(format!("config field {key:?}: {e}"))),
        _ => Ok(default),
    }
}

/// The family's features from the config dict (all optional: absent means llama).
fn arch_from_dict(d: &Bound<'_, PyDict>) -> Result<ArchFeatures> {
    let window: usize = field_or(d, "sliding_window", 0)?;
    // 0 (or absent) means "not set" for the optional numbers.
    let opt = |key: &str| -> Result<Option<f32>> {
        let v: f32 = field_or(d, key, 0.0)?;
        Ok((v != 0.0).then_some(v))
    };
    Ok(ArchFeatures {
        qkv_bias: field_or(d, "qkv_bias", false)?,
        qk_norm: field_or(d, "qk_norm", false)?,
        sliding_window: (window > 0).then_some(window),
        swa_pattern: field_or(d, "swa_pattern", 0)?,
        rope_theta_local: opt("rope_theta_local")?,
        norm_offset: field_or(d, "norm_offset", 0.0)?,
        post_norms: field_or(d, "post_norms", false)?,
        embed_scale: opt("embed_scale")?,
        attn_scale: opt("attn_scale")?,
        attn_softcap: opt("attn_softcap")?,
        final_softcap: opt("final_softcap")?,
        relu_threshold: field_or(d, "relu_threshold", 0.0)?,
        up_act: field_or(d, "up_act", false)?,
        layer_norm: field_or(d, "layer_norm", false)?,
        learned_pos: field_or(d, "learned_pos", false)?,
        pos_offset: field_or(d, "pos_offset", 0)?,
        no_gate: field_or(d, "no_gate", false)?,
        ffn_bias: field_or(d, "ffn_bias", false)?,
        out_bias: field_or(d, "out_bias", false)?,
        parallel: field_or(d, "parallel", false)?,
    })
}

/// RoPE scaling and partial rotation from the config dict (all optional: absent means none).
fn rope_from_dict(d: &Bound<'_, PyDict>) -> Result<RopeScaling> {
    let linear: f32 = field_or(d, "rope_linear_factor", 0.0)?;
    Ok(RopeScaling {
        dims: field_or(d, "rope_dims", 0)?,
        linear_factor: (linear != 0.0).then_some(linear),
        freq_factors: field_or(d, "rope_freq_factors", Vec::new())?,
    })
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
        arch: arch_from_dict(d)?,
        rope: rope_from_dict(d)?,
    };
    cfg.validate()?;
    Ok(cfg)
}

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
fn weight_from_tuple(name: &str, t: &Bound<'_, PyTuple>, copy: bool) -> Result<Weight> {
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
    if copy && data.len() >= powerinfer_core::pages::HUGE_MIN {
        data = Buffer::from_bytes(data.as_slice());
    }
    named_weight(name, dtype, rows, cols, data)
}

/// A 2-D float16 or float32 array as a borrowed F16/F32 `Weight` of its shape, or a
/// `(dtype, rows, cols, uint8 array)` tuple as a borrowed `Weight` of that format (a block
/// format as a file stores it).
pub fn weight_from_matrix(name: &str, obj: &Bound<'_, PyAny>) -> Result<Weight> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return weight_from_tuple(name, t, false);
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
pub fn tensors_from_dict(d: &Bound<'_, PyDict>, copy: bool) -> Result<HashMap<String, Weight>> {
    let mut out = HashMap::with_capacity(d.len());
    for (k, v) in d.iter() {
        let name: String = k
            .extract()
            .map_err(|e| Error::ModelFile(format!("tensor name: {e}")))?;
        let tup = v
            .cast_into::<PyTuple>()
            .map_err(|_| Error::ModelFile(format!("tensor {name}: expected a tuple")))?;
        let w = weight_from_tuple(&name, &tup, copy)?;
        out.insert(name, w);
    }
    Ok(out)
}
