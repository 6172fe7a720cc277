//! `_core.Model`: the weights of one model, shared by any number of sessions.

use std::path::PathBuf;
use std::sync::Arc;

use powerinfer_core::{PlanFile, Result};
use powerinfer_cuda::{Allocation, LayerTensors, ModelTensors};
use powerinfer_engine::ModelWeights;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{config_from_dict, tensors_from_dict};
use crate::exceptions::{check, run_detached};

/// The GPU executor's view of `w`: every matrix as loaded, `down_t` in the format the engine
/// builds it in.
fn model_tensors(w: &ModelWeights) -> ModelTensors<'_> {
    let layers = w
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| LayerTensors {
            wq: &l.wq,
            wk: &l.wk,
            wv: &l.wv,
            wo: &l.wo,
            gate: &l.w_gate,
            up: &l.w_up,
            down_t: w.down_t_dtype(i),
        })
        .collect();
    ModelTensors {
        config: &w.config,
        layers,
        output: &w.output,
    }
}

/// The device allocations of the plan at `path` on `w` (see `powerinfer_cuda::alloc_plan`).
fn allocation_report(w: &ModelWeights, path: &std::path::Path) -> Result<Vec<Allocation>> {
    let plan = PlanFile::load(path, w.config.n_layers, w.config.ffn_dim)?;
    powerinfer_cuda::gpu_allocations(&model_tensors(w), &plan)
}

/// Model weights handed over from Python without copies (numpy arrays kept alive inside).
#[pyclass(module = "powerinfer_rs._core", name = "Model", frozen)]
pub struct PyModel {
    pub weights: Arc<ModelWeights>,
}

#[pymethods]
impl PyModel {
    /// Build from a config dict and `{name: (dtype, rows, cols, uint8 array)}`.
    #[new]
    fn new(
        py: Python<'_>,
        config: &Bound<'_, PyDict>,
        tensors: &Bound<'_, PyDict>,
    ) -> PyResult<Self> {
        let cfg = check(py, config_from_dict(config))?;
        let map = check(py, tensors_from_dict(tensors))?;
        let weights = check(py, ModelWeights::from_tensors(cfg, map))?;
        Ok(PyModel {
            weights: Arc::new(weights),
        })
    }

    /// Address of a tensor's first byte as the engine reads it (for zero-copy checks).
    fn tensor_address(&self, name: &str) -> PyResult<usize> {
        let w = &self.weights;
        let weight = match name {
            "token_embd" => &w.token_embd,
            "output" => &w.output,
            _ => {
                let (blk, rest) = name
                    .strip_prefix("blk.")
                    .and_then(|s| s.split_once('.'))
                    .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
                let i: usize = blk
                    .parse()
                    .map_err(|_| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
                let l = w
                    .layers
                    .get(i)
                    .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(name.to_string()))?;
                match rest {
                    "attn_q" => &l.wq,
                    "attn_k" => &l.wk,
                    "attn_v" => &l.wv,
                    "attn_output" => &l.wo,
                    "ffn_gate" => &l.w_gate,
                    "ffn_up" => &l.w_up,
                    "ffn_down" => &l.w_down,
                    _ => return Err(pyo3::exceptions::PyKeyError::new_err(name.to_string())),
                }
            }
        };
        Ok(weight.data.as_ptr() as usize)
    }

    /// Weight bytes one decoded token reads (every matrix once, one embedding row, norms).
    #[getter]
    fn bytes_per_token(&self) -> usize {
        self.weights.bytes_per_token()
    }

    /// Bytes of the transposed down projections the sparse modes built (0 before).
    #[getter]
    fn down_t_bytes(&self) -> usize {
        self.weights.down_t_bytes()
    }

    /// Every GPU allocation the engine makes to run the plan at `plan` on this model, as
    /// `[(name, bytes), ...]` (each a multiple of 256; empty for a CPU-only plan). Derived from
    /// the loaded weights' formats, the plan's neuron table and placement, independently of
    /// `planning.accounting.gpu_allocation`, which it must equal. Raises `PlanError` for a plan
    /// file that is unreadable or does not fit this model.
    fn gpu_allocation_report(&self, py: Python<'_>, plan: PathBuf) -> PyResult<Vec<Allocation>> {
        let weights = Arc::clone(&self.weights);
        run_detached(py, move || allocation_report(&weights, &plan))
    }

    /// Layers.
    #[getter]
    fn n_layers(&self) -> usize {
        self.weights.config.n_layers
    }

    /// Vocabulary size.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.weights.config.vocab_size
    }
}
