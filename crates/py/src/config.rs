//! `_core.ModelConfig`: the engine's [`ModelConfig`] as Python builds and reads it. The field
//! list is declared once, in [`config_fields!`] below: each Python name and the place in the
//! Rust config it reads and writes. The loaders fill it directly
//! (`ModelConfig(**family.config, n_layers=..., ...)`) and `_core.Model` takes it as it is.
//!
//! Python sees a flat record: an unset optional number is `0` (the RoPE base of sliding layers,
//! the soft-caps, the window, ...), names stand for the enums (`rope_style="neox"`,
//! `activation="relu"`). Beside the engine's fields it carries what only the Python side uses:
//! the family's name (`arch`), the special token ids, `add_bos` and `tie_embeddings`.

use powerinfer_core::{
    bail, Activation, ArchFeatures, Error, Gating, ModelConfig, MoeFeatures, Result, RopeScaling,
    RopeStyle,
};
use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::exceptions::check;

/// A config value as Python holds it.
trait Flat: Sized {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>>;
    fn from_py(v: &Bound<'_, PyAny>, field: &str) -> Result<Self>;
}

/// A non-negative integer (a bool is refused, though Python counts it as one).
fn integer(v: &Bound<'_, PyAny>, field: &str) -> Result<u64> {
    let bad = || {
        Error::Shape(format!(
            "config {field} must be a non-negative integer, got {v}"
        ))
    };
    if v.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    v.extract::<u64>().map_err(|_| bad())
}

/// A number (int or float, not a bool), rounded to f32 as the engine computes with it.
fn number(v: &Bound<'_, PyAny>, field: &str) -> Result<f32> {
    let bad = || Error::Shape(format!("config {field} must be a number, got {v}"));
    if v.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    v.extract::<f64>().map(|x| x as f32).map_err(|_| bad())
}

/// The text of a name field.
fn text(v: &Bound<'_, PyAny>, field: &str) -> Result<String> {
    v.extract::<String>()
        .map_err(|_| Error::Shape(format!("config {field} must be a string, got {v}")))
}

/// `to_py` through pyo3's own conversion of `$ty`'s value.
macro_rules! flat_plain {
    ($($ty:ty => |$v:ident, $f:ident| $from:expr;)*) => {$(
        impl Flat for $ty {
            fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.clone().into_bound_py_any(py)
            }
            fn from_py($v: &Bound<'_, PyAny>, $f: &str) -> Result<Self> {
                $from
            }
        }
    )*};
}

flat_plain! {
    usize => |v, f| usize::try_from(integer(v, f)?).map_err(|e| Error::Shape(format!("config {f}: {e}")));
    f32 => |v, f| number(v, f);
    bool => |v, f| v.extract::<bool>().map_err(|_| Error::Shape(format!("config {f} must be a bool, got {v}")));
    String => |v, f| text(v, f);
    Vec<f32> => |v, f| {
        let items: Vec<Bound<'_, PyAny>> = v.try_iter().and_then(|i| i.collect()).map_err(|_| {
            Error::Shape(format!("config {f} must be a list of numbers, got {v}"))
        })?;
        items.iter().map(|x| number(x, f)).collect()
    };
    Vec<u32> => |v, f| {
        let items: Vec<Bound<'_, PyAny>> = v.try_iter().and_then(|i| i.collect()).map_err(|_| {
            Error::Shape(format!("config {f} must be a list of token ids, got {v}"))
        })?;
        items.iter().map(|x| <Option<u32>>::from_py(x, f)?.ok_or_else(|| {
            Error::Shape(format!("config {f}: a token id is None"))
        })).collect()
    };
}

/// A token id, or None.
impl Flat for Option<u32> {
    fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.into_bound_py_any(py)
    }
    fn from_py(v: &Bound<'_, PyAny>, field: &str) -> Result<Self> {
        if v.is_none() {
            return Ok(None);
        }
        let id = integer(v, field)?;
        u32::try_from(id)
            .map(Some)
            .map_err(|_| Error::Shape(format!("config {field}: token id {id} is too large")))
    }
}

/// The optional values (the soft-caps, scales, RoPE bases, the window): 0 (or None) means
/// "not set".
macro_rules! flat_unset_is_zero {
    ($($ty:ty => $zero:expr),*) => {$(
        impl Flat for Option<$ty> {
            fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.unwrap_or($zero).into_bound_py_any(py)
            }
            fn from_py(v: &Bound<'_, PyAny>, field: &str) -> Result<Self> {
                match v.is_none() {
                    true => Ok(None),
                    false => <$ty>::from_py(v, field).map(|x| (x != $zero).then_some(x)),
                }
            }
        }
    )*};
}

flat_unset_is_zero!(f32 => 0.0, usize => 0);

/// The enums by their names.
macro_rules! flat_named {
    ($($ty:ty),*) => {$(
        impl Flat for $ty {
            fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
                self.name().into_bound_py_any(py)
            }
            fn from_py(v: &Bound<'_, PyAny>, field: &str) -> Result<Self> {
                <$ty>::from_name(&text(v, field)?)
            }
        }
    )*};
}

flat_named!(RopeStyle, Activation, Gating);

/// The model config (see the module docs). Build it with keywords, the required ones being
/// `arch`, the eight sizes, `rms_eps`, `rope_theta`, `rope_style` and `activation`; read and
/// set any field as an attribute (checked for its type as it is set); `validate()` checks that
/// the values fit together.
#[pyclass(
    module = "powerinfer_rs._core",
    name = "ModelConfig",
    eq,
    skip_from_py_object
)]
#[derive(Clone, Debug, PartialEq)]
pub struct PyModelConfig {
    /// What the engine takes.
    pub core: ModelConfig,
    /// The family's name (`powerinfer_rs.loading.archs`).
    arch: String,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    /// Whether the tokenizer puts the BOS token first.
    add_bos: bool,
    /// Whether the output head is the embedding table.
    tie_embeddings: bool,
}

/// Declares the fields: the Python name, then the place in [`PyModelConfig`] it reads and
/// writes. Generates [`FIELDS`], [`REQUIRED`] and the by-name access.
macro_rules! config_fields {
    (
        required { $($r:ident: $($rp:ident).+;)* }
        optional { $($o:ident: $($op:ident).+;)* }
    ) => {
        /// Every field, in declaration order.
        const FIELDS: &[&str] = &[$(stringify!($r),)* $(stringify!($o),)*];
        /// The fields without a default.
        const REQUIRED: &[&str] = &[$(stringify!($r),)*];

        impl PyModelConfig {
            /// Field `name`'s value, or None for no such field.
            fn get_field<'py>(
                &self,
                py: Python<'py>,
                name: &str,
            ) -> PyResult<Option<Bound<'py, PyAny>>> {
                Ok(Some(match name {
                    $(stringify!($r) => self.$($rp).+.to_py(py)?,)*
                    $(stringify!($o) => self.$($op).+.to_py(py)?,)*
                    _ => return Ok(None),
                }))
            }

            /// Set field `name` (false: no such field).
            fn set_field(&mut self, name: &str, v: &Bound<'_, PyAny>) -> Result<bool> {
                match name {
                    $(stringify!($r) => self.$($rp).+ = Flat::from_py(v, name)?,)*
                    $(stringify!($o) => self.$($op).+ = Flat::from_py(v, name)?,)*
                    _ => return Ok(false),
                }
                Ok(true)
            }
        }
    };
}

config_fields! {
    required {
        arch: arch;
        n_layers: core.n_layers;
        dim: core.dim;
        ffn_dim: core.ffn_dim;
        n_heads: core.n_heads;
        n_kv_heads: core.n_kv_heads;
        head_dim: core.head_dim;
        vocab_size: core.vocab_size;
        max_context: core.max_context;
        rms_eps: core.rms_eps;
        rope_theta: core.rope_theta;
        rope_style: core.rope_style;
        activation: core.activation;
    }
    optional {
        bos_token_id: bos_token_id;
        eos_token_ids: eos_token_ids;
        add_bos: add_bos;
        tie_embeddings: tie_embeddings;
        qkv_bias: core.arch.qkv_bias;
        qk_norm: core.arch.qk_norm;
        qk_norm_full: core.arch.qk_norm_full;
        sliding_window: core.arch.sliding_window;
        swa_pattern: core.arch.swa_pattern;
        swa_dense_first: core.arch.swa_dense_first;
        no_rope_step: core.arch.no_rope_step;
        rope_theta_local: core.arch.rope_theta_local;
        norm_offset: core.arch.norm_offset;
        post_norms: core.arch.post_norms;
        embed_scale: core.arch.embed_scale;
        attn_scale: core.arch.attn_scale;
        attn_softcap: core.arch.attn_softcap;
        final_softcap: core.arch.final_softcap;
        relu_threshold: core.arch.relu_threshold;
        up_act: core.arch.up_act;
        layer_norm: core.arch.layer_norm;
        learned_pos: core.arch.learned_pos;
        pos_offset: core.arch.pos_offset;
        no_gate: core.arch.no_gate;
        ffn_bias: core.arch.ffn_bias;
        out_bias: core.arch.out_bias;
        parallel: core.arch.parallel;
        mla_kv_lora_rank: core.arch.mla.kv_lora_rank;
        mla_q_lora_rank: core.arch.mla.q_lora_rank;
        mla_qk_nope: core.arch.mla.qk_nope;
        mla_v_head_dim: core.arch.mla.v_head_dim;
        rope_dims: core.rope.dims;
        rope_linear_factor: core.rope.linear_factor;
        rope_freq_factors: core.rope.freq_factors;
        rope_attn_factor: core.rope.attn_factor;
        rope_long_factors: core.rope.long_factors;
        rope_original_context: core.rope.original_context;
        n_expert: core.moe.n_expert;
        n_expert_used: core.moe.n_expert_used;
        expert_ffn_dim: core.moe.expert_ffn_dim;
        shared_ffn_dim: core.moe.shared_ffn_dim;
        shared_expert_gate: core.moe.shared_gate;
        expert_gating: core.moe.gating;
        expert_norm_weights: core.moe.norm_weights;
        expert_weights_scale: core.moe.weights_scale;
        router_on_residual: core.moe.router_on_residual;
        dense_lead_layers: core.moe.dense_lead;
        expert_score_bias: core.moe.score_bias;
        expert_groups: core.moe.n_group;
        expert_groups_used: core.moe.topk_group;
        attn_sinks: core.arch.attn_sinks;
        expert_bias: core.moe.expert_bias;
        swiglu_limit: core.moe.swiglu_limit;
    }
}

impl PyModelConfig {
    /// Every field at its default (the required ones zero until set).
    fn blank() -> PyModelConfig {
        PyModelConfig {
            core: ModelConfig {
                n_layers: 0,
                dim: 0,
                ffn_dim: 0,
                n_heads: 0,
                n_kv_heads: 0,
                head_dim: 0,
                vocab_size: 0,
                max_context: 0,
                rms_eps: 0.0,
                rope_theta: 0.0,
                rope_style: RopeStyle::Norm,
                activation: Activation::Silu,
                arch: ArchFeatures::default(),
                rope: RopeScaling::default(),
                moe: MoeFeatures::default(),
            },
            arch: String::new(),
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            add_bos: false,
            tie_embeddings: false,
        }
    }

    /// Set each keyword; a name that is no field is a `TypeError`, as for any Python call.
    fn set_all(&mut self, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<String>> {
        let mut given = Vec::new();
        for (k, v) in kwargs.into_iter().flatten() {
            let name: String = k.extract()?;
            if !check(self.set_field(&name, &v))? {
                return Err(PyTypeError::new_err(format!(
                    "ModelConfig has no field {name:?} (fields: {})",
                    FIELDS.join(", ")
                )));
            }
            given.push(name);
        }
        Ok(given)
    }

    /// The engine's checks, and that the special tokens lie in the vocabulary.
    fn check(&self) -> Result<()> {
        self.core.validate()?;
        for &t in self.eos_token_ids.iter().chain(&self.bos_token_id) {
            if t as usize >= self.core.vocab_size {
                bail!(
                    Shape,
                    "special token id {t} outside the vocabulary ({})",
                    self.core.vocab_size
                );
            }
        }
        Ok(())
    }
}

/// `(name, rows, cols, required)` of each [`powerinfer_core::TensorShape`].
type TensorRow = (&'static str, usize, usize, bool);

fn tensor_rows(shapes: Vec<powerinfer_core::TensorShape>) -> Vec<TensorRow> {
    shapes
        .into_iter()
        .map(|t| (t.name, t.rows, t.cols, t.required))
        .collect()
}

#[pymethods]
impl PyModelConfig {
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut c = PyModelConfig::blank();
        let given = c.set_all(kwargs)?;
        let missing: Vec<&str> = REQUIRED
            .iter()
            .copied()
            .filter(|r| !given.iter().any(|g| g == r))
            .collect();
        if !missing.is_empty() {
            return Err(PyTypeError::new_err(format!(
                "ModelConfig lacks {}",
                missing.join(", ")
            )));
        }
        Ok(c)
    }

    /// The field names, in declaration order.
    #[classattr]
    #[allow(non_snake_case)]
    fn FIELDS(py: Python<'_>) -> PyResult<Py<PyTuple>> {
        Ok(PyTuple::new(py, FIELDS)?.unbind())
    }

    fn __getattr__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.get_field(py, name)?.ok_or_else(|| {
            PyAttributeError::new_err(format!("'ModelConfig' object has no attribute {name:?}"))
        })
    }

    fn __setattr__(&mut self, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        match check(self.set_field(name, value))? {
            true => Ok(()),
            false => Err(PyAttributeError::new_err(format!(
                "ModelConfig has no field {name:?}"
            ))),
        }
    }

    fn __dir__(slf: &Bound<'_, Self>) -> PyResult<Vec<String>> {
        let object = slf.py().get_type::<pyo3::types::PyAny>();
        let mut names: Vec<String> = object.call_method1("__dir__", (slf,))?.extract()?;
        names.extend(FIELDS.iter().map(|f| f.to_string()));
        Ok(names)
    }

    /// Every field by name.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for name in FIELDS {
            d.set_item(name, self.get_field(py, name)?)?;
        }
        Ok(d)
    }

    /// A copy with the given fields changed.
    #[pyo3(signature = (**changes))]
    fn replace(&self, changes: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let mut c = self.clone();
        c.set_all(changes)?;
        Ok(c)
    }

    /// Check that the values fit together: `ShapeError` (sizes, heads, numbers, RoPE, token
    /// ids) or `UnsupportedError` (FATReLU without ReLU) naming the first that does not.
    fn validate(&self) -> PyResult<()> {
        check(self.check())
    }

    /// This config for a context of `n_ctx` positions: LongRoPE's long factors
    /// (`rope_long_factors`) as `rope_freq_factors` when `n_ctx` is above
    /// `rope_original_context`, the short ones otherwise, and no long factors left (llama.cpp's
    /// rule); the same config without long factors.
    fn for_context(&self, n_ctx: usize) -> Self {
        PyModelConfig {
            core: self.core.for_context(n_ctx),
            ..self.clone()
        }
    }

    /// Values of each head that RoPE rotates (`rope_dims`, or all of `head_dim`).
    #[getter]
    fn rotary_dims(&self) -> usize {
        self.core.rope_dims()
    }

    /// The neurons of one layer's FFN as plans count them: `ffn_dim`, or for a mixture of
    /// experts `n_expert · expert_ffn` routed neurons (neuron `e · expert_ffn + j` is row j of
    /// expert e) followed by the shared expert's `shared_ffn_dim`.
    #[getter]
    fn n_neurons(&self) -> usize {
        self.core.n_neurons()
    }

    /// Each layer's neurons as plans count them: `n_neurons` for a layer of experts, `ffn_dim`
    /// for a dense one (a mixture of experts' first `dense_lead_layers`).
    #[getter]
    fn layer_neurons(&self) -> Vec<usize> {
        self.core.neuron_counts()
    }

    /// Each layer's neurons the profiler counts and the sparse modes choose among: a layer of
    /// experts' routed ones (`n_expert · expert_ffn`, its shared expert always runs), a dense
    /// layer's `ffn_dim`.
    #[getter]
    fn layer_routed_neurons(&self) -> Vec<usize> {
        (0..self.core.n_layers)
            .map(|l| self.core.layer_routed_neurons(l))
            .collect()
    }

    /// `[(name, rows, cols, required), ...]` of the tensors outside the layers.
    fn global_tensors(&self) -> Vec<TensorRow> {
        tensor_rows(self.core.global_tensors())
    }

    /// `[(suffix, rows, cols, required), ...]` of layer `layer`'s tensors (names after
    /// `blk.N.`; None: a layer past the leading dense ones): what the engine's weight table
    /// reads, and the loaders check.
    #[pyo3(signature = (layer=None))]
    fn layer_tensors(&self, layer: Option<usize>) -> Vec<TensorRow> {
        tensor_rows(match layer {
            Some(l) => self.core.layer_tensors_at(l),
            None => self.core.layer_tensors(),
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = Vec::with_capacity(FIELDS.len());
        for name in FIELDS {
            if let Some(v) = self.get_field(py, name)? {
                parts.push(format!("{name}={}", v.repr()?));
            }
        }
        Ok(format!("ModelConfig({})", parts.join(", ")))
    }

    fn __copy__(&self) -> Self {
        self.clone()
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> Self {
        self.clone()
    }

    /// Pickling: rebuilt from its fields as keywords.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        Ok((PyTuple::empty(py), self.to_dict(py)?))
    }
}
