//! The kernel of `predictor.cu`: one layer's activation predictor (fc1 with ReLU is a row
//! matvec, then fc2 over the nonzero hidden units and the threshold).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight, Launch};
use crate::layout::{Act, MAX_RANK};
use crate::ops::rows::{matvec_rows, XIn};

/// The predictor of one layer: `hidden = ReLU(fc1 · x)`, `logits = fc2 · hidden` over the
/// nonzero hidden units (`fc2_t` is `[rank, ffn]`), `flags[j] = logits[j] >= threshold`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn predictor<B: Backend>(
    dev: &B,
    fc1: &DeviceWeight<B>,
    fc2_t: &DeviceWeight<B>,
    threshold: f32,
    x: XIn<'_, B>,
    hidden: &mut B::Buf<f32>,
    flags: &mut B::Buf<i32>,
    logits: Option<&mut B::Buf<f32>>,
) -> Result<()> {
    let (rank, ffn) = (fc1.rows, fc2_t.cols);
    ensure!(
        fc2_t.rows == rank,
        Shape,
        "predictor: fc1 rank {rank}, fc2_t {}",
        fc2_t.rows
    );
    ensure!(
        rank <= MAX_RANK,
        Unsupported,
        "predictor rank {rank} > {MAX_RANK}"
    );
    ensure!(
        flags.len() >= ffn,
        Shape,
        "predictor: {} flags for ffn {ffn}",
        flags.len()
    );
    if let Some(l) = &logits {
        ensure!(
            l.len() >= ffn,
            Shape,
            "predictor: {} logits for ffn {ffn}",
            l.len()
        );
    }
    matvec_rows(dev, fc1, x, None, rank, Act::Relu, false, hidden)?;
    let launch = Launch::PredictorFc2 {
        dtype: fc2_t.dtype,
        fc2_t: &fc2_t.data,
        l: fc2_t.layout,
        hidden,
        rank,
        ffn,
        threshold,
        flags,
        logits,
    };
    dev.launch(launch, Checked(()))
}
