//! CUDA availability, asked without ever failing: the module imports on machines with no CUDA
//! at all (libcuda is opened only here, lazily, and its absence means "no device").

use pyo3::prelude::*;

/// True when this build has CUDA support and at least one CUDA device can be used.
#[pyfunction]
fn cuda_available() -> bool {
    powerinfer_cuda::is_available()
}

/// Number of CUDA devices (0 without a driver, a device, or CUDA support in this build).
#[pyfunction]
fn cuda_device_count() -> usize {
    powerinfer_cuda::device_count()
}

/// Add the functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add("built_with_cuda", powerinfer_cuda::BUILT_WITH_CUDA)?;
    m.add("built_with_emu", powerinfer_cuda::BUILT_WITH_EMU)?;
    let formats = powerinfer_cuda::GPU_DTYPES.map(|d| d.name());
    m.add("GPU_DTYPES", pyo3::types::PyTuple::new(m.py(), formats)?)?;
    let upload_as = pyo3::types::PyDict::new(m.py());
    for d in powerinfer_core::DType::ALL
        .into_iter()
        .filter(|d| powerinfer_cuda::is_converted(*d))
    {
        upload_as.set_item(d.name(), powerinfer_cuda::device_dtype(d).name())?;
    }
    m.add("GPU_UPLOAD_AS", upload_as)?;
    Ok(())
}
