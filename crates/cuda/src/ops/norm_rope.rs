//! The kernels of `norm_rope.cu`: RMSNorm over rows, and rotary embeddings in place.

use powerinfer_core::{ensure, Result, RopeStyle};

use crate::backend::{Backend, Checked, DeviceSlice, Launch};

/// RMSNorm of `rows` rows of `w.len()` values: `out = x / sqrt(mean(x²) + eps) · w`.
pub(crate) fn rms_norm<B: Backend>(
    dev: &B,
    x: &B::Buf<f32>,
    w: &B::Buf<f32>,
    rows: usize,
    eps: f32,
    out: &mut B::Buf<f32>,
) -> Result<()> {
    let n = w.len();
    ensure!(
        x.len() == rows * n && out.len() == rows * n,
        Shape,
        "rms_norm: x {}, out {} for {rows} rows of {n}",
        x.len(),
        out.len()
    );
    if rows == 0 {
        return Ok(());
    }
    let launch = Launch::RmsNorm {
        x,
        w,
        rows,
        n,
        eps,
        out,
    };
    dev.launch(launch, Checked(()))
}

/// Rotate every head of `x` (n_heads × head_dim) in place for position `pos`.
pub(crate) fn rope<B: Backend>(
    dev: &B,
    x: &mut B::Buf<f32>,
    head_dim: usize,
    pos: usize,
    theta: f32,
    style: RopeStyle,
) -> Result<()> {
    ensure!(
        head_dim > 0 && head_dim.is_multiple_of(2) && x.len().is_multiple_of(head_dim),
        Shape,
        "rope: {} values are not heads of even head_dim {head_dim}",
        x.len()
    );
    let n_heads = x.len() / head_dim;
    if n_heads == 0 {
        return Ok(());
    }
    let launch = Launch::Rope {
        x,
        n_heads,
        head_dim,
        pos,
        theta,
        neox: style == RopeStyle::Neox,
    };
    dev.launch(launch, Checked(()))
}
