//! The predictor family (`kernels/predictor.cu`): one layer's activation predictor (fc1 with
//! ReLU is a row matvec, then fc2 over the nonzero hidden units and the threshold), checked
//! ([`PredictorOps`]), launched ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight};
use crate::layout::{Act, MAX_RANK};
use crate::ops::rows::{RowOps, XIn};

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

use launch::PredictorFc2;

/// The predictor, checked, on any backend.
pub trait PredictorOps: Backend {
    /// The predictor of one layer: `hidden = ReLU(fc1 · x)`, `logits = fc2 · hidden` over the
    /// nonzero hidden units (`fc2_t` is `[rank, ffn]`), `flags[j] = logits[j] >= threshold`.
    #[allow(clippy::too_many_arguments)]
    fn predictor(
        &self,
        fc1: &DeviceWeight<Self>,
        fc2_t: &DeviceWeight<Self>,
        threshold: f32,
        x: XIn<'_, Self>,
        hidden: &mut Self::Buf<f32>,
        flags: &mut Self::Buf<i32>,
        logits: Option<&mut Self::Buf<f32>>,
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
        self.matvec_rows(fc1, x, None, rank, Act::Relu, hidden)?;
        let launch = PredictorFc2 {
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
        self.launch(launch, Checked(()))
    }
}

impl<B: Backend> PredictorOps for B {}
