//! The launch of `kernels/predictor.cu`: its fields the kernel's parameters in order.

use powerinfer_core::DType;

use super::host;
use crate::backend::kernel;
use crate::host::view::{prefix, prefix_mut, Rows};
use crate::kernels::{dtype_suffix, KernelSource};
use crate::launch_spec::{tile_geometry, LaunchSpec, ROW_THREADS};
use crate::layout::{to_i32, RowLayout};

/// `kernels/predictor.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "predictor",
    include_str!("../../../kernels/predictor.cu"),
    &[],
)
.per_dtype(&["predictor_fc2"]);

kernel! {
    /// `predictor_fc2_<dtype>`: `logit[j] = Σ_{hidden[h] > 0} hidden[h] · fc2_t[h][j]`,
    /// `flags[j] = logit[j] >= threshold`.
    struct PredictorFc2<'a, B> {
        dtype: DType,
        fc2_t: &'a B::Buf<u8>,
        l: RowLayout,
        hidden: &'a B::Buf<f32>,
        rank: usize,
        ffn: usize,
        threshold: f32,
        flags: &'a mut B::Buf<i32>,
        logits: Option<&'a mut B::Buf<f32>>,
    }
    entry(k) = format!("predictor_fc2_{}", dtype_suffix(k.dtype));
    spec(k, dev, a) {
        // predictor_fc2_<dtype>(fc2_t, l, hidden, rank, ffn, threshold, flags, logits,
        // units_pb): the geometry from tile_geometry.
        let entry = k.entry();
        a.ptr(dev.addr(k.fc2_t))
            .layout(&k.l)
            .ptr(dev.addr(k.hidden));
        a.i32(to_i32(k.rank, "rank")?)
            .i32(to_i32(k.ffn, "ffn")?)
            .f32(k.threshold);
        a.ptr(dev.addr_mut(k.flags));
        a.ptr(k.logits.map_or(0, |b| dev.addr_mut(b)));
        let (gx, units_pb, smem) = tile_geometry(k.dtype, k.ffn)?;
        a.i32(to_i32(units_pb, "units per block")?);
        Ok(LaunchSpec::new(&SOURCE, entry, [gx, 1], ROW_THREADS, smem, a))
    }
    host(k) {
        let fc2_t = Rows::new(B::data(k.fc2_t), k.l, k.dtype, k.ffn, "fc2_t")?;
        let hidden = prefix(B::data(k.hidden), k.rank, "hidden")?;
        let flags = prefix_mut(B::data_mut(k.flags), k.ffn, "flags")?;
        let logits = match k.logits {
            Some(l) => Some(prefix_mut(B::data_mut(l), k.ffn, "logits")?),
            None => None,
        };
        host::predictor_fc2(&fc2_t, hidden, k.threshold, flags, logits)
    }
}
