//! `_core.Plan`: a placement plan adopted by a model, read once by the engine
//! ([`powerinfer_engine::Placement`]), which keeps its neuron table; Python reads the figures.

use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1};
use powerinfer_cuda::Allocation;
use powerinfer_engine::Placement;
use pyo3::prelude::*;

/// A plan file checked against one model (see `Model.load_plan`).
#[pyclass(module = "powerinfer_rs._core", name = "Plan", frozen)]
pub struct PyPlan {
    pub inner: Arc<Placement>,
    /// The file it was read from.
    #[pyo3(get)]
    pub path: String,
}

#[pymethods]
impl PyPlan {
    /// Device bytes the plan needs (equal to the sum of `allocations`).
    #[getter]
    fn gpu_bytes(&self) -> usize {
        self.inner.gpu_bytes()
    }

    /// The VRAM budget the planner was given.
    #[getter]
    fn budget_bytes(&self) -> usize {
        self.inner.file.budget_bytes
    }

    /// Fingerprint of the model the plan was made for.
    #[getter]
    fn model_fingerprint(&self) -> &str {
        &self.inner.file.model_fingerprint
    }

    /// KV positions the GPU buffers are sized for.
    #[getter]
    fn context(&self) -> usize {
        self.inner.file.context
    }

    /// The precision of the GPU layers' KV caches: "f16", "f32", "q8_0", "q4_0", "q4_1", or
    /// "k/v" where keys and values differ.
    #[getter]
    fn kv_cache(&self) -> String {
        self.inner.file.kv_cache.name()
    }

    /// Every device allocation the engine makes to run the plan, `[(name, bytes), ...]`.
    #[getter]
    fn allocations(&self) -> Vec<Allocation> {
        self.inner.allocations.clone()
    }

    /// Each layer's hot (GPU) neuron ids, ascending, as int64 arrays.
    #[getter]
    fn hot_neurons<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyArray1<i64>>> {
        self.inner
            .file
            .table
            .layers
            .iter()
            .map(|l| {
                l.hot
                    .iter()
                    .map(|&i| i64::from(i))
                    .collect::<Vec<_>>()
                    .into_pyarray(py)
            })
            .collect()
    }

    /// Per layer: attention on the GPU.
    #[getter]
    fn attention(&self) -> Vec<bool> {
        self.inner.file.attention.clone()
    }

    /// Output head on the GPU.
    #[getter]
    fn output(&self) -> bool {
        self.inner.file.output
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan({:?}, gpu_bytes={}, layers={})",
            self.path,
            self.inner.gpu_bytes(),
            self.inner.file.table.layers.len()
        )
    }
}
