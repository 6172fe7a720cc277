//! The accumulation kernel of `axpy_down.cu` (`y += Σ a[k] · W[row k]` over rows of a matrix):
//! the hot neurons' down pass over their slabs' down_t rows.

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn, Launch};
use crate::layout::RowLayout;

/// Most row splits (gridDim.y of axpy_rows).
const MAX_SPLITS: usize = 65_535;

/// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots.
pub(crate) fn hot_down<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    h: &B::Buf<f32>,
    y: &mut B::Buf<f32>,
    splits: usize,
) -> Result<()> {
    let l = &ffn.layout;
    ensure!(
        y.len() == l.dim,
        Shape,
        "hot_down: y {} for dim {}",
        y.len(),
        l.dim
    );
    ensure!(
        h.len() >= l.n_hot,
        Shape,
        "hot_down: h {} for {} hot",
        h.len(),
        l.n_hot
    );
    launch_axpy(
        dev,
        l.down_dtype,
        &ffn.data,
        l.down,
        l.dim,
        None,
        h,
        l.n_hot,
        y,
        splits,
    )
}

/// Queue axpy_rows after the callers' checks: nothing for no rows or no columns, `splits`
/// clamped to 1..=min(n, 65,535).
#[allow(clippy::too_many_arguments)]
fn launch_axpy<B: Backend>(
    dev: &B,
    dtype: DType,
    w: &B::Buf<u8>,
    l: RowLayout,
    cols: usize,
    idx: Option<&B::Buf<i32>>,
    a: &B::Buf<f32>,
    n: usize,
    y: &mut B::Buf<f32>,
    splits: usize,
) -> Result<()> {
    if n == 0 || cols == 0 {
        return Ok(());
    }
    let launch = Launch::AxpyRows {
        dtype,
        w,
        l,
        cols,
        idx,
        a,
        n,
        y,
        splits: splits.clamp(1, n.min(MAX_SPLITS)),
    };
    dev.launch(launch, Checked(()))
}
