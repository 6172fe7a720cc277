//! `powerinfer_rs._core`: the PyO3 extension module. Thin wrappers over the engine: arguments are
//! extracted into owned Rust values, compute runs with the GIL released, and every error (and any
//! panic) becomes a `PowerInferError` subclass; the exception classes are created here and
//! re-exported by `powerinfer_rs.errors`. No engine logic lives in this crate.

mod blocks;
mod config;
mod convert;
mod cuda;
mod exceptions;
mod facts;
mod model;
mod paths;
mod plan;
mod plan_record;
mod predictors;
mod session;
mod slots;

use pyo3::prelude::*;

/// Which SIMD path the CPU kernels use on this machine ("avx2+fma+f16c", "scalar", ...).
#[pyfunction]
fn simd_level() -> &'static str {
    powerinfer_cpu::simd_level()
}

/// Which activations the quantized products take on the x86 levels: "int16" (the default) or
/// "int8" (opt-in, `POWERINFER_RS_NUMERICS=int8` before the first product).
#[pyfunction]
fn numerics() -> &'static str {
    powerinfer_cpu::numerics().name()
}

/// Run `f` on a fresh pool of `threads` threads (0 = all cores), detached from the GIL: the
/// machine probes' common frame.
fn on_pool<T: Send>(
    py: Python<'_>,
    threads: usize,
    f: impl FnOnce() -> powerinfer_core::Result<T> + Send,
) -> PyResult<T> {
    exceptions::run_detached(py, move || {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| powerinfer_core::Error::Other(e.to_string()))?;
        pool.install(f)
    })
}

/// Measure this machine's memory read bandwidth in GB/s with `threads` threads (0 = all cores):
/// sums a buffer of `bytes` bytes `iters` times and returns the best pass.
#[pyfunction]
#[pyo3(signature = (bytes = 1 << 30, iters = 5, threads = 0))]
fn measure_read_bandwidth(
    py: Python<'_>,
    bytes: usize,
    iters: usize,
    threads: usize,
) -> PyResult<f64> {
    on_pool(py, threads, || {
        Ok(powerinfer_cpu::measure_read_bandwidth(bytes, iters.max(1)))
    })
}

/// The rate in GB/s at which `threads` threads (0 = all cores) run a matvec over `bytes` of
/// weights in format `dtype` (e.g. "Q4_0"), the best of `iters`: what the CPU reaches on that
/// format where decoding it costs more than reading it.
#[pyfunction]
#[pyo3(signature = (dtype, bytes = 128 << 20, iters = 3, threads = 0))]
fn measure_format_bandwidth(
    py: Python<'_>,
    dtype: &str,
    bytes: usize,
    iters: usize,
    threads: usize,
) -> PyResult<f64> {
    let dtype =
        powerinfer_core::DType::from_name(dtype).map_err(|e| exceptions::to_pyerr(py, e))?;
    on_pool(py, threads, || {
        powerinfer_cpu::measure_format_bandwidth(dtype, bytes, iters)
    })
}

/// The rate in GB/s of weight bytes read at which `threads` threads (0 = all cores) run the
/// engine's sparse FFN by rows (gate, up and down_t rows of `dtype`, `bytes` of them in all):
/// `listed` of the neurons' gate rows read, `fire` of those firing (their up and down_t rows
/// read too); the best of `iters`. What a plan's cold neurons cost on the CPU.
#[pyfunction]
#[pyo3(signature = (dtype, listed, fire, bytes = 96 << 20, iters = 3, threads = 0))]
fn measure_rows_bandwidth(
    py: Python<'_>,
    dtype: &str,
    listed: f64,
    fire: f64,
    bytes: usize,
    iters: usize,
    threads: usize,
) -> PyResult<f64> {
    let dtype =
        powerinfer_core::DType::from_name(dtype).map_err(|e| exceptions::to_pyerr(py, e))?;
    for (name, v) in [("listed", listed), ("fire", fire)] {
        if !(v > 0.0 && v <= 1.0) {
            let msg = format!("{name} must be in (0, 1], got {v}");
            return Err(pyo3::exceptions::PyValueError::new_err(msg));
        }
    }
    on_pool(py, threads, || {
        powerinfer_cpu::measure_rows_bandwidth(dtype, bytes, listed, fire, iters)
    })
}

/// The delay, in seconds, until all of a pool of `threads` threads (0 = all cores) has started
/// a parallel region after `idle_us` microseconds without work: the median of `rounds`; with
/// `warm`, the pool warmed first as the hybrid executor does before each layer.
#[pyfunction]
#[pyo3(signature = (threads = 0, rounds = 21, idle_us = 2000, warm = false))]
fn measure_dispatch(
    py: Python<'_>,
    threads: usize,
    rounds: usize,
    idle_us: u64,
    warm: bool,
) -> PyResult<f64> {
    let idle = std::time::Duration::from_micros(idle_us);
    on_pool(py, threads, || {
        Ok(powerinfer_cpu::measure_dispatch(rounds, idle, warm))
    })
}

/// The neuron store's storage probe: random reads of `block` bytes over the file at `path` by
/// `threads` readers (O_DIRECT where allowed) for about `seconds`; (reads, seconds, direct).
#[pyfunction]
fn probe_storage_reads(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    block: usize,
    threads: usize,
    seconds: f64,
) -> PyResult<(u64, f64, bool)> {
    let path = paths::fs_path(path, "path", powerinfer_core::Error::ModelFile)?;
    exceptions::run_detached(py, move || {
        powerinfer_engine::neuron_store::io::probe_reads(&path, block, threads, seconds)
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::PyModelConfig>()?;
    m.add_class::<model::PyModel>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<predictors::PyPredictors>()?;
    m.add_class::<plan::PyPlan>()?;
    m.add_function(wrap_pyfunction!(slots::decode_slots, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(numerics, m)?)?;
    m.add_function(wrap_pyfunction!(measure_read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(measure_dispatch, m)?)?;
    m.add_function(wrap_pyfunction!(measure_format_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(measure_rows_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(probe_storage_reads, m)?)?;
    m.add_function(wrap_pyfunction!(blocks::quantize, m)?)?;
    m.add_function(wrap_pyfunction!(blocks::dequantize, m)?)?;
    let modes = powerinfer_engine::SparsityMode::ALL.map(|m| m.name());
    m.add("SPARSITY_MODES", pyo3::types::PyTuple::new(m.py(), modes)?)?;
    let kv_types = powerinfer_core::KvPrecision::ALL.map(|p| p.name());
    m.add(
        "KV_CACHE_TYPES",
        pyo3::types::PyTuple::new(m.py(), kv_types)?,
    )?;
    m.add(
        "INPUT_SITES",
        pyo3::types::PyTuple::new(m.py(), powerinfer_engine::INPUT_SITES)?,
    )?;
    exceptions::register(m)?;
    cuda::register(m)?;
    facts::register(m)?;
    plan_record::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The most reader threads a neuron store (or a storage probe) starts.
    m.add(
        "MAX_IO_THREADS",
        powerinfer_engine::neuron_store::io::MAX_IO_THREADS,
    )?;
    Ok(())
}
