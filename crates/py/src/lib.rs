//! `powerinfer_rs._core`: the PyO3 extension module. Thin wrappers over the engine: arguments are
//! extracted into owned Rust values, compute runs with the GIL released, and every error (and any
//! panic) becomes a `powerinfer_rs.errors.PowerInferError` subclass.

mod convert;
mod cuda;
mod exceptions;
mod model;
mod session;

use pyo3::prelude::*;

/// Which SIMD path the CPU kernels use on this machine ("avx2+fma+f16c", "scalar", ...).
#[pyfunction]
fn simd_level() -> &'static str {
    powerinfer_cpu::simd_level()
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
    exceptions::run_detached(py, move || {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| powerinfer_core::Error::Other(e.to_string()))?;
        Ok(pool.install(|| powerinfer_cpu::measure_read_bandwidth(bytes, iters.max(1))))
    })
}

/// Read and validate a plan / neuron-table file for a model of `n_layers` layers of `ffn`
/// neurons; returns each layer's hot (GPU) neuron ids, ascending.
#[pyfunction]
fn read_neuron_table(
    py: Python<'_>,
    path: std::path::PathBuf,
    n_layers: usize,
    ffn: usize,
) -> PyResult<Vec<Vec<u32>>> {
    let table = exceptions::run_detached(py, move || {
        powerinfer_core::NeuronTable::load(&path, n_layers, ffn)
    })?;
    Ok(table.layers.into_iter().map(|l| l.hot).collect())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::PyModel>()?;
    m.add_class::<session::PySession>()?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    m.add_function(wrap_pyfunction!(measure_read_bandwidth, m)?)?;
    m.add_function(wrap_pyfunction!(read_neuron_table, m)?)?;
    cuda::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
