//! The contract of the predictor kernel (predictor.cu) on host memory: fc2 over the positive hidden units, with its threshold.

use powerinfer_core::Result;

use crate::host::view::Rows;

/// `logit[j] = Σ_{h : hidden[h] > 0} hidden[h] · fc2_t[h][j]` (summed in h order),
/// `flags[j] = logit[j] >= threshold`, `logits[j] = logit[j]` when given; `fc2_t` has `ffn`
/// columns, `flags` and `logits` hold ffn values, `hidden` the rank.
pub(crate) fn predictor_fc2(
    fc2_t: &Rows<'_>,
    hidden: &[f32],
    threshold: f32,
    flags: &mut [i32],
    logits: Option<&mut [f32]>,
) -> Result<()> {
    let mut sum = vec![0f32; fc2_t.cols];
    let mut row = vec![0f32; fc2_t.cols];
    for (h, &v) in hidden.iter().enumerate() {
        if v > 0.0 {
            fc2_t.decode(h, &mut row)?;
            for (s, &w) in sum.iter_mut().zip(&row) {
                *s += v * w;
            }
        }
    }
    for (f, &s) in flags.iter_mut().zip(&sum) {
        *f = i32::from(s >= threshold);
    }
    if let Some(logits) = logits {
        logits.copy_from_slice(&sum);
    }
    Ok(())
}
