//! The predictor call the kernel tests share (`gpu_kernels.rs` on every backend, `emu_kernels.rs`
//! on the emulator): the weights and x uploaded, one `predictor` launch, its logits and flags
//! downloaded for the test's own reference.

use powerinfer_core::Weight;
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{Backend, XIn};

/// `dev.predictor` of `fc1` (`[rank, dim]`) and `fc2_t` (`[rank, ffn]`) on `x` at `threshold`:
/// (the ffn logits, the ffn flags).
pub fn run_predictor<B: Backend>(
    dev: &B,
    fc1: &Weight,
    fc2_t: &Weight,
    x: &[f32],
    threshold: f32,
) -> (Vec<f32>, Vec<i32>) {
    let (rank, ffn) = (fc1.rows, fc2_t.cols);
    let (d1, d2, dx) = (
        dev.upload_weight(fc1).unwrap(),
        dev.upload_weight(fc2_t).unwrap(),
        dev.upload(x).unwrap(),
    );
    let mut dh = dev.zeros::<f32>(rank).unwrap();
    let mut dflags = dev.zeros::<i32>(ffn).unwrap();
    let mut dlog = dev.zeros::<f32>(ffn).unwrap();
    dev.predictor(
        &d1,
        &d2,
        threshold,
        XIn::floats(&dx),
        &mut dh,
        &mut dflags,
        Some(&mut dlog),
    )
    .unwrap();
    (dev.download(&dlog).unwrap(), dev.download(&dflags).unwrap())
}
