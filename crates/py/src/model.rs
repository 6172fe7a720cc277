//! `_core.Model`: the weights of one model, shared by any number of sessions.

use std::path::PathBuf;
use std::sync::Arc;

use powerinfer_cuda::Allocation;
use powerinfer_engine::{Layouts, ModelWeights, Placement};
use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::PyModelConfig;
use crate::convert::tensors_from_dict;
use crate::exceptions::{check, run_detached};
use crate::paths::fs_path;
use crate::plan::PyPlan;
use powerinfer_core::Error;
use powerinfer_cpu::MatrixRef;

/// Model weights handed over from Python without copies (numpy arrays kept alive inside).
#[pyclass(module = "powerinfer_rs._core", name = "Model", frozen)]
pub struct PyModel {
    pub weights: Arc<ModelWeights>,
}

#[pymethods]
impl PyModel {
    /// Build from a `ModelConfig` and `{name: (dtype, rows, cols, uint8 array)}`: the arrays
    /// borrowed, or with `copy_weights` every one of 2 MiB or more copied onto huge pages
    /// (faster scattered row reads than a memory-mapped file's 4 KiB pages). The attention's
    /// projections and the head are interleaved where their format allows; with
    /// `interleave_ffn` a dense FFN's matrices too (a model decoded dense on the CPU).
    #[new]
    #[pyo3(signature = (config, tensors, copy_weights = false, interleave_ffn = false))]
    fn new(
        py: Python<'_>,
        config: PyRef<'_, PyModelConfig>,
        tensors: &Bound<'_, PyDict>,
        copy_weights: bool,
        interleave_ffn: bool,
    ) -> PyResult<Self> {
        let cfg = config.core.clone();
        let layouts = Layouts {
            ffn: interleave_ffn,
            ..Layouts::DEFAULT
        };
        // A tensor the load repacks is read once from the file's map, never copied as it is.
        let copy = |name: &str, shape| copy_weights && !layouts.repacks(name, shape);
        let map = check(tensors_from_dict(tensors, copy))?;
        let weights = run_detached(py, move || {
            ModelWeights::from_tensors_with(cfg, map, layouts)
        })?;
        Ok(PyModel {
            weights: Arc::new(weights),
        })
    }

    /// Address of a tensor's first byte as the engine reads it (for zero-copy checks);
    /// `KeyError` for a name the engine holds no matrix under.
    fn tensor_address(&self, name: &str) -> PyResult<usize> {
        let w = self
            .weights
            .tensor(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_string()))?;
        Ok(w.as_ptr() as usize)
    }

    /// How the engine keeps tensor `name`'s rows: `"rows"` (the file's layout, borrowed or
    /// copied), `"interleaved"` (rows interleaved by eight at load, in place of the file's
    /// layout) or, for a merged expert tensor, `"rows+interleaved"` (the file's rows and an
    /// interleaved copy the one-token pass reads); `KeyError` for a name the engine holds no
    /// matrix under.
    fn tensor_layout(&self, name: &str) -> PyResult<&'static str> {
        let w = self
            .weights
            .tensor(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_string()))?;
        Ok(
            match (w.is_interleaved(), self.weights.has_packed_copy(name)) {
                (true, _) => "interleaved",
                (false, true) => "rows+interleaved",
                (false, false) => "rows",
            },
        )
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

    /// Take the transposed down projections from the file at `path`, memory-mapped (written
    /// first unless it holds them for `fingerprint`); false when they were already built.
    fn map_down_t(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        fingerprint: String,
    ) -> PyResult<bool> {
        let path = fs_path(path, "path", Error::ModelFile)?;
        let w = Arc::clone(&self.weights);
        run_detached(py, move || w.map_down_t(&path, &fingerprint))
    }

    /// The file the transposed down projections are memory-mapped from, if they are.
    #[getter]
    fn down_t_file(&self) -> Option<PathBuf> {
        self.weights.down_t_file().map(|p| p.to_path_buf())
    }

    /// Bytes of the input mode's input-major copies built so far (0 before).
    #[getter]
    fn input_copies_bytes(&self) -> usize {
        self.weights.input_copies_bytes()
    }

    /// The input mode's crossovers once its copies are built: (format, rows, cols, share) per
    /// matrix shape, the share of kept inputs above which a decode step takes the dense product
    /// of the masked input instead of the input-major one; empty before the mode's first use.
    #[getter]
    fn input_crossovers(&self) -> Vec<(String, usize, usize, f32)> {
        let mut v: Vec<(String, usize, usize, f32)> = self
            .weights
            .built_input_copies()
            .map(|c| {
                c.crossover
                    .iter()
                    .map(|(&(d, r, k), &x)| (d.name().to_string(), r, k, x))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by_key(|a| (a.1, a.2));
        v
    }

    /// WINA's column norms ‖W[:, i]‖ of layer `layer`'s four input sites (`INPUT_SITES`: q/k/v
    /// together, o, gate/up together, down), or of the output head (`layer` = n_layers), as
    /// float32 arrays; computed in float64 from the weights as stored.
    fn input_column_norms<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
    ) -> PyResult<Vec<Bound<'py, numpy::PyArray1<f32>>>> {
        let w = self.weights.clone();
        let norms = run_detached(py, move || -> powerinfer_core::Result<Vec<Vec<f32>>> {
            use powerinfer_engine::input_sparse::column_norms;
            if layer == w.layers.len() {
                return Ok(vec![column_norms(&[w.output.view()])?]);
            }
            let Some(l) = w.layers.get(layer) else {
                powerinfer_core::bail!(Shape, "layer {layer} of a {}-layer model", w.layers.len());
            };
            let gated = w.program.layers[layer].ffn_kind().gated;
            let ffn_in: Vec<MatrixRef<'_>> = match gated {
                true => vec![l.w_gate.view(), l.w_up.view()],
                false => vec![l.w_gate.view()],
            };
            Ok(vec![
                column_norms(&[l.wq.view(), l.wk.view(), l.wv.view()])?,
                column_norms(&[l.wo.view()])?,
                column_norms(&ffn_in)?,
                column_norms(&[l.w_down.view()])?,
            ])
        })?;
        Ok(norms
            .into_iter()
            .map(|v| numpy::PyArray1::from_vec(py, v))
            .collect())
    }

    /// Read the plan file at `plan` once and check it against this model: `PlanError` when it
    /// is unreadable, made for another model (shape, or a fingerprint other than `fingerprint`)
    /// or counts other GPU bytes than the engine would allocate; `VramBudgetError` when those
    /// exceed `budget` bytes (when given).
    #[pyo3(signature = (plan, fingerprint = None, budget = None))]
    fn load_plan(
        &self,
        py: Python<'_>,
        plan: &Bound<'_, PyAny>,
        fingerprint: Option<String>,
        budget: Option<usize>,
    ) -> PyResult<PyPlan> {
        let plan = fs_path(plan, "plan", Error::Plan)?;
        let weights = Arc::clone(&self.weights);
        let path = plan.display().to_string();
        let placement = run_detached(py, move || {
            Placement::load(&weights, &plan, fingerprint.as_deref(), budget)
        })?;
        Ok(PyPlan {
            inner: Arc::new(placement),
            path,
        })
    }

    /// Every GPU allocation the engine makes to run the plan at `plan` on this model, as
    /// `[(name, bytes), ...]` (each a multiple of 256; empty for a CPU-only plan). Derived from
    /// the loaded weights' formats, the plan's neuron table and placement, independently of
    /// `planning.accounting.gpu_allocation`, which it must equal. Raises `PlanError` for a plan
    /// file that is unreadable or does not fit this model (nor its `fingerprint`, when given).
    #[pyo3(signature = (plan, fingerprint = None))]
    fn gpu_allocation_report(
        &self,
        py: Python<'_>,
        plan: &Bound<'_, PyAny>,
        fingerprint: Option<String>,
    ) -> PyResult<Vec<Allocation>> {
        let plan = fs_path(plan, "plan", Error::Plan)?;
        let weights = Arc::clone(&self.weights);
        run_detached(py, move || {
            Placement::read(&weights, &plan, fingerprint.as_deref()).map(|p| p.allocations)
        })
    }

    /// Write this model's neuron store (its FFN neurons' rows by cluster of `cluster`, for
    /// reads from storage) to `path`; returns the file's bytes. `fingerprint` is recorded and
    /// checked when the store is opened.
    #[pyo3(signature = (path, cluster, fingerprint))]
    fn write_neuron_store(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        cluster: usize,
        fingerprint: String,
    ) -> PyResult<u64> {
        let path = fs_path(path, "path", Error::ModelFile)?;
        let w = Arc::clone(&self.weights);
        run_detached(py, move || {
            powerinfer_engine::neuron_store::write_store(&w, &path, cluster, &fingerprint)
        })
    }

    /// Read the sparse FFN's rows from the neuron store at `path` from now on, through a cache
    /// of `cache_bytes` and `io_threads` readers; `fingerprint`, when given, must be the one it
    /// was written for; `read_ahead`: predictor mode reads the clusters the next layer's
    /// predictor names ahead of it. Returns (cache slots, whether reads bypass the page cache).
    #[pyo3(signature = (path, cache_bytes, io_threads, fingerprint = None, read_ahead = false))]
    fn open_neuron_store(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        cache_bytes: usize,
        io_threads: usize,
        fingerprint: Option<String>,
        read_ahead: bool,
    ) -> PyResult<(usize, bool)> {
        let path = fs_path(path, "path", Error::ModelFile)?;
        let w = Arc::clone(&self.weights);
        run_detached(py, move || {
            use powerinfer_engine::neuron_store::NeuronStore;
            let fp = fingerprint.as_deref();
            let store = NeuronStore::open(&w, &path, cache_bytes, io_threads, fp)?;
            store.set_read_ahead(read_ahead);
            let info = (store.cache_slots(), store.direct());
            w.set_neuron_store(Some(Arc::new(store)));
            Ok(info)
        })
    }

    /// Load the clusters `clusters[layer]` of the open neuron store and keep them resident
    /// (never evicted); returns how many were loaded (at most all but one cache slot).
    fn neuron_store_load_resident(
        &self,
        py: Python<'_>,
        clusters: Vec<Vec<u32>>,
    ) -> PyResult<usize> {
        let w = Arc::clone(&self.weights);
        run_detached(py, move || match w.neuron_store() {
            Some(store) => store.load_resident(&clusters),
            None => powerinfer_core::bail!(Plan, "no neuron store is open"),
        })
    }

    /// Stop reading from the neuron store (the resident weights again).
    fn close_neuron_store(&self) {
        self.weights.set_neuron_store(None);
    }

    /// The neuron store's counts: {"hits", "misses", "bytes_read", "read_s", "ahead",
    /// "ahead_used", "read_ahead", "cluster",
    /// "cluster_bytes", "file_bytes"}, or None without a store. With `reset`, zeroed after.
    #[pyo3(signature = (reset = false))]
    fn neuron_store_stats<'py>(
        &self,
        py: Python<'py>,
        reset: bool,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(store) = self.weights.neuron_store() else {
            return Ok(None);
        };
        let s = store.stats();
        if reset {
            store.reset_stats();
        }
        let l = store.layout();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("read_s", s.read_s)?;
        d.set_item("ahead", s.ahead)?;
        d.set_item("ahead_used", s.ahead_used)?;
        d.set_item("read_ahead", store.read_ahead())?;
        d.set_item("cluster", l.cluster)?;
        let bytes: Vec<usize> = l.layers.iter().map(|x| x.cluster_bytes).collect();
        d.set_item("cluster_bytes", bytes)?;
        d.set_item("file_bytes", l.file_bytes())?;
        d.set_item("direct", store.direct())?;
        d.set_item("cache_slots", store.cache_slots())?;
        d.set_item("resident_slots", store.resident_slots())?;
        Ok(Some(d))
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
