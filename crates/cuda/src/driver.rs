//! Driver errors as the crate reports them (feature `cuda`).

use cudarc::driver::DriverError;
use powerinfer_core::Error;

/// Map a driver error to `Error::Cuda`, saying what was being done.
pub(crate) fn driver_err(what: &str) -> impl FnOnce(DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}
