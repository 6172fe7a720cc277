//! The facts Rust owns and Python asks for instead of restating: the device grammar
//! (`parse_device`, `check_device`) and which sparsity mode runs where (`sparsity_modes`,
//! `mode_refusal`). Every text of a refusal comes from the engine.

use powerinfer_core::Device;
use powerinfer_engine::modes::{refusal, Place, MODE_TABLE};
use powerinfer_engine::SparsityMode;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::exceptions::CoreError;

/// The device name in `device`, or the one refusal of a value that is not a string.
fn device_name(device: &Bound<'_, PyAny>) -> Result<String, CoreError> {
    match device.cast::<PyString>() {
        Ok(s) => Ok(s
            .to_cow()
            .map_err(|_| Device::not_a_name("a string that is not UTF-8"))?
            .into_owned()),
        Err(_) => {
            let repr = device.repr().map_or_else(|_| "?".into(), |r| r.to_string());
            Err(Device::not_a_name(&repr).into())
        }
    }
}

/// `(kind, index)` of a device name: kind "cpu", "gpu-sim", "gpu-emu" or "cuda", index the CUDA
/// ordinal (None for the others). UnsupportedError for a name outside the grammar.
#[pyfunction]
fn parse_device(device: &Bound<'_, PyAny>) -> Result<(&'static str, Option<usize>), CoreError> {
    let d = Device::parse(&device_name(device)?)?;
    Ok((d.kind(), d.index()))
}

/// The canonical name ("cpu", "gpu-sim", "gpu-emu", "cuda:N") of a device this build and
/// machine can run: UnsupportedError outside the grammar or for gpu-emu without the emulator,
/// CudaError for CUDA without CUDA support or an ordinal past the devices found.
#[pyfunction]
fn check_device(device: &Bound<'_, PyAny>) -> Result<String, CoreError> {
    let name = device_name(device)?;
    Ok(powerinfer_engine::device::check_device(&name)?.to_string())
}

/// The mode table, one dict per mode in `SPARSITY_MODES` order: `name`, a bool per place
/// (`cpu`, `gpu`, `moe_cpu`, `moe_gpu`, `store`, `moe_store`), `relu_only` and `needs` (the
/// file it takes, or None).
#[pyfunction]
fn sparsity_modes(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    MODE_TABLE
        .iter()
        .map(|r| {
            let d = PyDict::new(py);
            d.set_item("name", r.mode.name())?;
            for p in Place::ALL {
                d.set_item(p.name(), r.runs(p))?;
            }
            d.set_item("relu_only", r.relu_only)?;
            d.set_item("needs", r.needs)?;
            Ok(d)
        })
        .collect()
}

/// Why `mode` does not run at `place` (a column of `sparsity_modes()`), or None where it does:
/// the engine's own text. UnsupportedError for an unknown mode or place.
#[pyfunction]
fn mode_refusal(mode: &str, place: &str) -> Result<Option<String>, CoreError> {
    let mode: SparsityMode = mode.parse()?;
    let place = Place::from_name(place)?;
    Ok(refusal(mode, place))
}

/// Add the functions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(check_device, m)?)?;
    m.add_function(wrap_pyfunction!(sparsity_modes, m)?)?;
    m.add_function(wrap_pyfunction!(mode_refusal, m)?)?;
    Ok(())
}
