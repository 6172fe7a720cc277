//! `_core.read_plan`: the plan file read by the engine's reader
//! ([`powerinfer_core::PlanRecord`]) without a model, for `formats.plan.load_plan`: one reader
//! and one error path for both languages.

use numpy::{IntoPyArray, PyArray1};
use powerinfer_core::{Error, PlanRecord};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::exceptions::run_detached;
use crate::paths::fs_path;

fn ids<'py>(py: Python<'py>, list: &[u32]) -> Bound<'py, PyArray1<i64>> {
    list.iter()
        .map(|&i| i64::from(i))
        .collect::<Vec<_>>()
        .into_pyarray(py)
}

/// Read the plan file at `path` (PlanError, naming it, for anything malformed): a dict of what
/// the engine reads (`model_fingerprint`, `n_layers`, `ffn_dim` (the widest layer's),
/// `layer_neurons` (each layer's), `bucket`, `context`,
/// `kv_cache`, `budget_bytes`, `gpu_bytes`, `attention`, `predictor`, `ffn_buckets`, `output`,
/// `predictor_allocations`, `predictor_ranks`, `gpu_neurons`: int64 arrays per layer), the RAM
/// tier's `ram_neurons` (int64 arrays per layer, or None) and `json`, the whole `plan`
/// metadata as text, for the planner's own sections.
#[pyfunction]
fn read_plan<'py>(py: Python<'py>, path: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    let path = fs_path(path, "plan", Error::Plan)?;
    let r = run_detached(py, move || PlanRecord::read(&path))?;
    let f = &r.file;
    let d = PyDict::new(py);
    d.set_item("model_fingerprint", &f.model_fingerprint)?;
    d.set_item("n_layers", f.table.layers.len())?;
    let counts: Vec<usize> = f.table.layers.iter().map(|l| l.ffn()).collect();
    d.set_item("ffn_dim", counts.iter().copied().max().unwrap_or(0))?;
    d.set_item("layer_neurons", counts)?;
    d.set_item("bucket", f.bucket)?;
    d.set_item("context", f.context)?;
    d.set_item("kv_cache", f.kv_cache.name())?;
    d.set_item("budget_bytes", f.budget_bytes)?;
    d.set_item("gpu_bytes", f.gpu_bytes)?;
    d.set_item("attention", f.attention.clone())?;
    d.set_item("predictor", f.predictor.clone())?;
    d.set_item("ffn_buckets", f.ffn_buckets.clone())?;
    d.set_item("output", f.output)?;
    d.set_item("predictor_allocations", f.predictor_allocations.clone())?;
    d.set_item("predictor_ranks", f.predictor_ranks.clone())?;
    let hot: Vec<_> = f.table.layers.iter().map(|l| ids(py, &l.hot)).collect();
    d.set_item("gpu_neurons", hot)?;
    let ram: Option<Vec<_>> = r
        .ram_neurons
        .as_ref()
        .map(|layers| layers.iter().map(|l| ids(py, l)).collect());
    d.set_item("ram_neurons", ram)?;
    d.set_item("json", &r.json)?;
    Ok(d)
}

/// Add the function to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_plan, m)?)
}
