//! `_core.Session`: a KV cache and thread pool over a shared model; prefill and decode.

use std::sync::{Mutex, MutexGuard, TryLockError};

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use powerinfer_core::Error;
use powerinfer_engine::forward::Logits;
use powerinfer_engine::{
    token_ids, InputScore, InputSparsity, KvPrecision, KvTypes, Session, Sparsity, SparsityMode,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::exceptions::{check, run_detached, to_pyerr};
use crate::model::PyModel;
use crate::plan::PyPlan;
use crate::predictors::PyPredictors;

/// One context (KV cache) over a model, with its own worker threads. Calls from several
/// Python threads are serialised: each waits (with the GIL released) for the one running.
#[pyclass(module = "powerinfer_rs._core", name = "Session", frozen)]
pub struct PySession {
    inner: Mutex<Session>,
}

impl PySession {
    /// The session, once no other thread uses it (waiting with the GIL released; a panic that
    /// escaped a previous call leaves the session usable: every call checks its own input).
    pub(crate) fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Session> {
        loop {
            match self.inner.try_lock() {
                Ok(guard) => return guard,
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                // Wait for the holder without the GIL (it may need it), then try again.
                Err(TryLockError::WouldBlock) => py.detach(|| drop(self.inner.lock())),
            }
        }
    }
}

#[pymethods]
impl PySession {
    /// A fresh session: `threads` workers (0 = one per core), `n_ctx` positions (0 = the
    /// model's context length).
    /// `threads_of`: another session over the same model whose worker threads this one shares
    /// instead of starting its own (`threads` is then ignored): the server's slots, whose passes
    /// never run at once.
    #[new]
    #[pyo3(signature = (model, threads = 0, n_ctx = 0, threads_of = None))]
    fn new(
        py: Python<'_>,
        model: &PyModel,
        threads: usize,
        n_ctx: usize,
        threads_of: Option<&PySession>,
    ) -> PyResult<Self> {
        let weights = model.weights.clone();
        let inner = match threads_of {
            None => check(Session::new(weights, threads, n_ctx))?,
            Some(other) => {
                let other = other.lock(py);
                if !std::sync::Arc::ptr_eq(other.model_arc(), &weights) {
                    let msg = "threads_of: a session over another model".to_string();
                    return Err(to_pyerr(py, Error::Unsupported(msg)));
                }
                Session::sharing_threads(&other, n_ctx)
            }
        };
        Ok(PySession {
            inner: Mutex::new(inner),
        })
    }

    /// Append `tokens` to the context and return float32 logits: shape (1, vocab) for the last
    /// token, or (len(tokens), vocab) with `all_logits=True`. On error the context is unchanged.
    #[pyo3(signature = (tokens, all_logits = false))]
    fn feed<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
        all_logits: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let mut guard = self.lock(py);
        let vocab = guard.model().config.vocab_size;
        let ids = check(token_ids(&tokens, vocab))?;
        let which = if all_logits {
            Logits::All
        } else {
            Logits::Last
        };
        let session = &mut *guard;
        let logits = run_detached(py, move || {
            let check_signals =
                || Python::attach(|py| py.check_signals()).map_err(|_| Error::Interrupted);
            session.feed(&ids, which, check_signals)
        })?;
        matrix(py, vocab, logits)
    }

    /// Append `tokens` to the context and return every token's final hidden state, after the
    /// output norm and before the output head (which is not computed): float32 of shape
    /// (len(tokens), dim), the rows that `feed(tokens, all_logits=True)` multiplies by the
    /// output matrix (embeddings pool these). On error the context is unchanged.
    #[pyo3(signature = (tokens))]
    fn feed_hidden<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let mut guard = self.lock(py);
        let config = &guard.model().config;
        let (vocab, dim) = (config.vocab_size, config.dim);
        let ids = check(token_ids(&tokens, vocab))?;
        let session = &mut *guard;
        let rows = run_detached(py, move || {
            let check_signals =
                || Python::attach(|py| py.check_signals()).map_err(|_| Error::Interrupted);
            session.feed(&ids, Logits::Hidden, check_signals)
        })?;
        matrix(py, dim, rows)
    }

    /// Append `tokens` to the context as successive one-token decode steps would, in one pass
    /// (speculative verification): float32 logits of shape (len(tokens), vocab), row i
    /// bit-identical to what `feed([tokens[i]])` gives after the tokens before it. The
    /// products share their weight reads; attention and the sparse FFN modes run per token
    /// (the input mode, and the hybrid executor, one decode step per token). On error the
    /// context is unchanged.
    #[pyo3(signature = (tokens))]
    fn decode<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<i64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let mut guard = self.lock(py);
        let vocab = guard.model().config.vocab_size;
        let ids = check(token_ids(&tokens, vocab))?;
        let session = &mut *guard;
        let logits = run_detached(py, move || {
            let check_signals =
                || Python::attach(|py| py.check_signals()).map_err(|_| Error::Interrupted);
            session.feed(&ids, Logits::Steps, check_signals)
        })?;
        matrix(py, vocab, logits)
    }

    /// Positions 0..n of the KV cache as bytes (every layer's keys and values at the cache's
    /// precision), for a prefix cache: `kv_restore` gives them back to a session over the same
    /// model at the same precision. UnsupportedError on the hybrid executor.
    #[pyo3(signature = (n))]
    fn kv_snapshot<'py>(&self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        let guard = self.lock(py);
        let data = check(guard.kv_snapshot(n))?;
        Ok(PyBytes::new(py, &data))
    }

    /// Make the context exactly the `n` positions of a `kv_snapshot` (ShapeError, and the
    /// context unchanged, when `data` is not n positions of this session's cache).
    #[pyo3(signature = (data, n))]
    fn kv_restore(&self, py: Python<'_>, data: &[u8], n: usize) -> PyResult<()> {
        let mut guard = self.lock(py);
        check(guard.kv_restore(data, n))
    }

    /// Bytes per position of a `kv_snapshot`.
    #[getter]
    fn kv_snapshot_bytes_per_position(&self, py: Python<'_>) -> usize {
        self.lock(py).kv_snapshot_bytes_per_position()
    }

    /// Set the FFN sparsity: one of `SPARSITY_MODES`. "threshold" needs one threshold per layer
    /// on |act(gate)·up|, "predictor" a `Predictors`, "input" per layer four thresholds (the
    /// sites `INPUT_SITES`), the output head's (0: dense) and the score ("teal" or "wina").
    #[pyo3(signature = (mode, thresholds = None, predictors = None, input_thresholds = None, input_output = 0.0, input_score = "teal"))]
    #[allow(clippy::too_many_arguments)]
    fn set_sparsity(
        &self,
        py: Python<'_>,
        mode: &str,
        thresholds: Option<Vec<f32>>,
        predictors: Option<PyRef<'_, PyPredictors>>,
        input_thresholds: Option<Vec<[f32; 4]>>,
        input_output: f32,
        input_score: &str,
    ) -> PyResult<()> {
        let mode: SparsityMode = check(mode.parse())?;
        let sparsity = match (mode, input_thresholds) {
            (SparsityMode::Input, Some(t)) => Sparsity::Input(InputSparsity {
                thresholds: t,
                output: input_output,
                score: check(input_score.parse::<InputScore>())?,
            }),
            _ => check(Sparsity::new(
                mode,
                thresholds,
                predictors.map(|p| p.inner.clone()),
            ))?,
        };
        let mut guard = self.lock(py);
        let session = &mut *guard;
        run_detached(py, move || session.set_sparsity(sparsity))
    }

    /// Hold the KV cache at `precision`: "f16" (the default, as llama.cpp's), "f32", or ggml's
    /// blocks "q8_0", "q4_0", "q4_1" (CPU only), for keys and values, or "k/v" for each
    /// ("q8_0/f16"); `v` sets the values' apart. One setting for the CPU and the GPU layers.
    /// The context is forgotten. UnsupportedError for an unknown type, a block type on the
    /// hybrid executor, or a head_dim no multiple of 32 with a block type.
    #[pyo3(signature = (precision, v = None))]
    fn set_kv_cache(&self, py: Python<'_>, precision: &str, v: Option<&str>) -> PyResult<()> {
        let mut t = check(KvTypes::from_name(precision))?;
        if let Some(v) = v {
            t.v = check(KvPrecision::from_name(v))?;
        }
        let mut guard = self.lock(py);
        let session = &mut *guard;
        run_detached(py, move || session.set_kv_types(t))
    }

    /// The KV cache's precision: one name where keys and values share it ("f16", "f32",
    /// "q8_0", "q4_0", "q4_1"), else "k/v" ("q8_0/f16").
    #[getter]
    fn kv_cache(&self, py: Python<'_>) -> String {
        self.lock(py).kv_types().name()
    }

    /// The keys' precision alone.
    #[getter]
    fn kv_cache_k(&self, py: Python<'_>) -> &'static str {
        self.lock(py).kv_types().k.name()
    }

    /// The values' precision alone.
    #[getter]
    fn kv_cache_v(&self, py: Python<'_>) -> &'static str {
        self.lock(py).kv_types().v.name()
    }

    /// Adopt a plan from `Model.load_plan` (of this session's model), or drop it with None. On
    /// a GPU device the plan's GPU side is uploaded again.
    #[pyo3(signature = (plan))]
    fn set_plan(&self, py: Python<'_>, plan: Option<PyRef<'_, PyPlan>>) -> PyResult<()> {
        let plan = plan.map(|p| std::sync::Arc::clone(&p.inner));
        let mut guard = self.lock(py);
        let session = &mut *guard;
        run_detached(py, move || session.set_placement(plan))
    }

    /// Run the plan's GPU side on `device`: "cpu", "gpu-sim" (the host backend) or "cuda[:N]".
    /// `vram_budget` (bytes) caps the device memory the plan may use (and sizes gpu-sim's
    /// memory). Raises VramBudgetError when the plan does not fit, PlanError without a plan.
    #[pyo3(signature = (device, vram_budget = None))]
    fn set_device(&self, py: Python<'_>, device: &str, vram_budget: Option<usize>) -> PyResult<()> {
        let device = device.to_string();
        let mut guard = self.lock(py);
        let session = &mut *guard;
        run_detached(py, move || session.set_device(&device, vram_budget))
    }

    /// The device: "cpu", "gpu-sim" or "cuda:N".
    #[getter]
    fn device(&self, py: Python<'_>) -> String {
        self.lock(py).device().to_string()
    }

    /// The GPU side, or None: a dict with `device` (its description), `allocations` ([(name,
    /// bytes)]), `allocated_bytes` (what the backend counts, or None), `free_bytes`,
    /// `total_bytes`, `steps` (decode steps run), `transfers` (per layer, the output head
    /// last: (uploads, downloads, bytes up, bytes down)), `kernel_launches` ({entry: count}
    /// where the backend counts them, as gpu-emu does; else None) and `graphs` (with
    /// POWERINFER_RS_GPU_GRAPHS=1 on cuda or gpu-emu, the launch batches' counters: batches,
    /// built, replayed, nodes_updated, kernels, explicit; else None) and `phases` (each decode
    /// step's wall time by phase: see `phases_dict`).
    fn gpu_info<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let guard = self.lock(py);
        let Some(h) = guard.hybrid() else {
            return Ok(None);
        };
        let (free, total) = check(h.mem_info())?;
        let st = h.transfers();
        let transfers: Vec<(u64, u64, u64, u64)> = st
            .layers
            .iter()
            .map(|t| (t.uploads, t.downloads, t.bytes_up, t.bytes_down))
            .collect();
        let d = PyDict::new(py);
        d.set_item("device", h.describe())?;
        d.set_item("allocations", h.allocations().to_vec())?;
        d.set_item("allocated_bytes", h.allocated_bytes())?;
        d.set_item("free_bytes", free)?;
        d.set_item("total_bytes", total)?;
        d.set_item("steps", st.steps)?;
        d.set_item("transfers", transfers)?;
        d.set_item("kernel_launches", h.kernel_launches())?;
        let graphs = h.graph_stats().map(|g| {
            g.entries()
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>()
        });
        d.set_item("graphs", graphs)?;
        let phases = phases_dict(py, h.phases())?;
        phases.set_item("decode_seconds", guard.hybrid_decode_seconds())?;
        d.set_item("phases", phases)?;
        Ok(Some(d))
    }

    /// Zero the GPU side's transfer counts and phase times.
    fn reset_transfers(&self, py: Python<'_>) {
        self.lock(py).reset_hybrid_stats();
    }

    /// Turn per-phase timing of the forward passes on (from zero) or off (benchmarks).
    fn set_phase_timing(&self, py: Python<'_>, on: bool) {
        self.lock(py).set_phase_timing(on);
    }

    /// Seconds per phase since timing was turned on (attention, predictor, gate, up, down,
    /// output, other; plus "passes" and "tokens"), or None when it is off.
    fn phase_times<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let guard = self.lock(py);
        let Some(t) = guard.phase_times() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        for (name, secs) in t.by_name() {
            d.set_item(name, secs)?;
        }
        d.set_item("passes", t.passes)?;
        d.set_item("tokens", t.tokens)?;
        Ok(Some(d))
    }

    /// Share of active neurons above which threshold decoding takes the dense down product
    /// instead of an axpy over the active down_t rows (layer 0's, from a table of the formats,
    /// or pinned by POWERINFER_RS_DOWN_CROSSOVER).
    #[getter]
    fn down_crossover(&self, py: Python<'_>) -> PyResult<f32> {
        let guard = self.lock(py);
        let model = guard.model();
        run_detached(py, || model.down_crossover())
    }

    /// The sparsity mode's name.
    #[getter]
    fn sparsity(&self, py: Python<'_>) -> &'static str {
        self.lock(py).sparsity().name()
    }

    /// Start counting, per layer and neuron, the tokens in which each FFN neuron is active
    /// (ReLU semantics without `thresholds`, |act| >= threshold with them); with `capture`,
    /// also keep (FFN input, activation) rows for predictor training.
    /// With `capture_sites`, keep the input mode's site rows instead (`take_sites`).
    #[pyo3(signature = (thresholds = None, capture = false, capture_sites = false))]
    fn start_profiling(
        &self,
        py: Python<'_>,
        thresholds: Option<Vec<f32>>,
        capture: bool,
        capture_sites: bool,
    ) -> PyResult<()> {
        let mut guard = self.lock(py);
        check(guard.start_profiling(thresholds, capture))?;
        if capture_sites {
            check(guard.capture_sites())?;
        }
        Ok(())
    }

    /// Site rows captured since the last call: per layer a list of the four sites' float32
    /// matrices (`INPUT_SITES` order, one row per token), then the output head's input rows.
    #[allow(clippy::type_complexity)]
    fn take_sites<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        Vec<Vec<Bound<'py, PyArray2<f32>>>>,
        Bound<'py, PyArray2<f32>>,
    )> {
        let mut guard = self.lock(py);
        let c = &guard.model().config;
        let widths = [c.dim, c.q_dim(), c.dim, c.ffn_dim];
        let dim = c.dim;
        let (sites, out) = guard.take_sites();
        let mut layers = Vec::with_capacity(sites.len());
        for layer in sites {
            let mut four = Vec::with_capacity(4);
            for (rows, w) in layer.into_iter().zip(widths) {
                four.push(matrix(py, w, rows)?);
            }
            layers.push(four);
        }
        Ok((layers, matrix(py, dim, out)?))
    }

    /// Tokens counted by the running profile (0 when not profiling).
    #[getter]
    fn profile_tokens(&self, py: Python<'_>) -> u64 {
        self.lock(py).profiler().map_or(0, |p| p.tokens)
    }

    /// Activation counts of the running profile, int64 of shape (n_layers, ffn): row l holds
    /// layer l's neurons (`ModelConfig.layer_routed_neurons`); a narrower layer than the
    /// widest (a mixture of experts' leading dense layer, or its layers of experts) is padded
    /// with zeros past its own.
    fn profile_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        let guard = self.lock(py);
        let p = guard
            .profiler()
            .ok_or_else(|| to_pyerr(py, Error::Plan("not profiling".into())))?;
        let cols = p.counts.iter().map(Vec::len).max().unwrap_or(0);
        let flat = p
            .counts
            .iter()
            .flat_map(|l| (0..cols).map(|j| l.get(j).map_or(0, |&c| c as i64)))
            .collect();
        matrix(py, cols, flat)
    }

    /// Tokens routed to each expert in the running profile, int64 of shape (n_layers,
    /// n_expert); None for a dense model.
    fn profile_expert_counts<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyArray2<i64>>>> {
        let guard = self.lock(py);
        let p = guard
            .profiler()
            .ok_or_else(|| to_pyerr(py, Error::Plan("not profiling".into())))?;
        let Some(cols) = p.expert_counts.first().map(Vec::len) else {
            return Ok(None);
        };
        let flat = p
            .expert_counts
            .iter()
            .flatten()
            .map(|&c| c as i64)
            .collect();
        matrix(py, cols, flat).map(Some)
    }

    /// Stop profiling (counts are dropped; read them first).
    fn stop_profiling(&self, py: Python<'_>) {
        self.lock(py).stop_profiling();
    }

    /// Rows captured since the last call, per layer: (x float32 (n, dim), act float32 (n, ffn));
    /// a mixture of experts' layer of experts: (x, act float32 (n, n_expert_used *
    /// expert_ffn), routes int64 (n, n_expert_used)), each token's routed experts' activations
    /// in route order and the experts they are (its leading dense layers: (x, act) as a dense
    /// model's).
    fn take_captured<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut guard = self.lock(py);
        let c = guard.model().config.clone();
        let k = c.moe.n_expert_used;
        let dim = c.dim;
        let mut out = Vec::new();
        for (l, cap) in guard.take_captured().into_iter().enumerate() {
            let moe = c.is_moe_layer(l);
            let ffn = match moe {
                true => k * c.moe.expert_ffn(c.ffn_dim),
                false => c.ffn_dim,
            };
            let x = matrix(py, dim, cap.x)?.into_any();
            let act = matrix(py, ffn, cap.act)?.into_any();
            let t = match moe {
                true => {
                    let routes = cap.routes.iter().map(|&e| e as i64).collect();
                    let routes = matrix(py, k, routes)?.into_any();
                    PyTuple::new(py, [x, act, routes])?
                }
                false => PyTuple::new(py, [x, act])?,
            };
            out.push(t);
        }
        Ok(out)
    }

    /// Forget the whole context.
    fn reset(&self, py: Python<'_>) {
        self.lock(py).reset();
    }

    /// Keep only the first `n` positions of the context.
    fn truncate(&self, py: Python<'_>, n: usize) {
        self.lock(py).truncate(n);
    }

    /// Positions in the context.
    #[getter]
    fn n_past(&self, py: Python<'_>) -> usize {
        self.lock(py).n_past()
    }

    /// Context size in positions.
    #[getter]
    fn n_ctx(&self, py: Python<'_>) -> usize {
        self.lock(py).n_ctx()
    }

    /// Worker threads.
    #[getter]
    fn threads(&self, py: Python<'_>) -> usize {
        self.lock(py).threads()
    }

    /// Bytes the KV cache holds now.
    #[getter]
    fn kv_cache_bytes(&self, py: Python<'_>) -> usize {
        self.lock(py).kv_cache_bytes()
    }
}

/// Row-major `values` as a numpy array of `cols` columns (0 rows when `cols` is 0).
pub(crate) fn matrix<T: numpy::Element>(
    py: Python<'_>,
    cols: usize,
    values: Vec<T>,
) -> PyResult<Bound<'_, PyArray2<T>>> {
    let rows = values.len().checked_div(cols).unwrap_or(0);
    let arr = Array2::from_shape_vec((rows, cols), values)
        .map_err(|e| to_pyerr(py, Error::Other(e.to_string())))?;
    Ok(arr.into_pyarray(py))
}

/// The hybrid decode steps' phase times as Python sees them: `names` (the phases, in order),
/// `total` ({phase: seconds} over every slot), `per_layer` (per slot, the layers then the
/// output head: seconds per phase in `names` order), `steps`, `step_seconds` (their wall time
/// on the phases' own clock reads: the phases add up to it), `switches` (phase switches timed, for the timers' cost) and
/// `cold_bytes` and `predictor_bytes` (per slot, bytes of FFN rows the CPU read for cold
/// neurons, and of the predictors it ran);
/// the caller adds `decode_seconds` (the session's own clock around the same steps).
fn phases_dict<'py>(
    py: Python<'py>,
    p: &powerinfer_engine::hybrid::PhaseStats,
) -> PyResult<Bound<'py, PyDict>> {
    use powerinfer_engine::hybrid::HybridPhase;
    let d = PyDict::new(py);
    let names: Vec<&str> = HybridPhase::ALL.iter().map(|p| p.name()).collect();
    let total = PyDict::new(py);
    for ph in HybridPhase::ALL {
        total.set_item(ph.name(), p.total(ph))?;
    }
    let per_layer: Vec<Vec<f64>> = p.slots.iter().map(|s| s.to_vec()).collect();
    d.set_item("names", names)?;
    d.set_item("total", total)?;
    d.set_item("per_layer", per_layer)?;
    d.set_item("steps", p.steps)?;
    d.set_item("step_seconds", p.step_seconds)?;
    d.set_item("switches", p.switches)?;
    d.set_item("cold_bytes", p.cold_bytes.clone())?;
    d.set_item("predictor_bytes", p.predictor_bytes.clone())?;
    Ok(d)
}
