//! Asking for a device that is not there is a clear error, in the CUDA build and without it
//! (device names are `powerinfer_core::Device`'s to parse).

use powerinfer_cuda::CudaDevice;

#[test]
fn missing_device_is_a_clear_error() {
    // No GPU: a Cuda (or, without the feature, Unsupported) error, never a panic.
    let n = powerinfer_cuda::device_count();
    let err = CudaDevice::new(n).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("CUDA") || msg.contains("cuda"), "{msg}");
}
