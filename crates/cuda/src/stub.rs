//! The device entry points of a build without the `cuda` feature: no device is ever found and
//! opening one returns `Error::Unsupported("built without CUDA")`, so callers that only ask
//! whether a GPU exists compile unchanged. The kernels' launch API (buffers, weights, ops) exists
//! only in the CUDA build; the executor reaches the GPU through the backend interface, whose host
//! implementation is always built.

use powerinfer_core::{Error, Result};

/// Always false without the `cuda` feature.
pub fn driver_available() -> bool {
    false
}

/// Always 0 without the `cuda` feature.
pub fn device_count() -> usize {
    0
}

/// Always false without the `cuda` feature.
pub fn is_available() -> bool {
    false
}

/// A GPU: never constructed in this build.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    _never: std::convert::Infallible,
}

impl CudaDevice {
    /// `Error::Unsupported`: this build has no CUDA.
    pub fn new(_ordinal: usize) -> Result<CudaDevice> {
        Err(Error::Unsupported("built without CUDA".into()))
    }
}
