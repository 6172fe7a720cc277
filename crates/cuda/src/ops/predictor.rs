//! The kernels of `predictor.cu`: one layer's activation predictor (fc1 with ReLU is a row
//! matvec, then fc2 over the nonzero hidden units and the threshold), the ordered compaction of
//! flags into an index list, and the split of the flags between hot slots and the cold set.

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, DeviceWeight, HotFfn, Launch};
use crate::layout::{Act, MAX_RANK};
use crate::ops::rows::matvec_rows;

/// The predictor of one layer: `hidden = ReLU(fc1 · x)`, `logits = fc2 · hidden` over the
/// nonzero hidden units (`fc2_t` is `[rank, ffn]`), `flags[j] = logits[j] >= threshold`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn predictor<B: Backend>(
    dev: &B,
    fc1: &DeviceWeight<B>,
    fc2_t: &DeviceWeight<B>,
    threshold: f32,
    x: &B::Buf<f32>,
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
    matvec_rows(dev, fc1, x, None, rank, Act::Relu, hidden)?;
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

/// `out[0..count) = the i < n with flags[i] != 0`, ascending; `count[0] = count` (also for
/// n = 0, which writes count 0).
pub(crate) fn compact_flags<B: Backend>(
    dev: &B,
    flags: &B::Buf<i32>,
    n: usize,
    out: &mut B::Buf<i32>,
    count: &mut B::Buf<i32>,
) -> Result<()> {
    ensure!(
        flags.len() >= n && out.len() >= n,
        Shape,
        "compact_flags: buffers < {n}"
    );
    ensure!(
        !count.is_empty(),
        Shape,
        "compact_flags: empty count buffer"
    );
    let launch = Launch::CompactFlags {
        flags,
        n,
        out,
        count,
    };
    dev.launch(launch, Checked(()))
}

/// Split a layer's active flags between the devices: `slot_flags[r] = flags[id(r)]` for the hot
/// slots, and every hot neuron's flag cleared in `flags`, which is left holding the CPU's cold
/// active set. `flags` has one entry per FFN neuron.
pub(crate) fn split_hot_flags<B: Backend>(
    dev: &B,
    ffn: &HotFfn<B>,
    flags: &mut B::Buf<i32>,
    slot_flags: &mut B::Buf<i32>,
) -> Result<()> {
    let l = &ffn.layout;
    ensure!(
        slot_flags.len() >= l.n_hot,
        Shape,
        "split_hot_flags: slot flags < {}",
        l.n_hot
    );
    if l.n_hot == 0 {
        return Ok(());
    }
    let launch = Launch::SplitHotFlags {
        ids_base: &ffn.data,
        ids_l: l.ids,
        n: l.n_hot,
        flags,
        slot_flags,
    };
    dev.launch(launch, Checked(()))
}
