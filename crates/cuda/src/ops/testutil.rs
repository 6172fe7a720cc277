//! Test helpers of the host backend: random weights in every format, uploads and downloads,
//! the launch token, tolerant comparisons.

use powerinfer_core::testing::pseudo_random;
pub(crate) use powerinfer_core::testing::random_weight as weight;
use powerinfer_core::{DType, Error, Result, Weight};

use crate::host::{HostBackend, HostBuf};
use crate::kernels::GPU_DTYPES;

/// The float64 decode attention the attention kernels are checked against (shared with the
/// integration tests).
#[path = "../../tests/support/attention_ref.rs"]
mod attention_ref;
/// The x the quantized formats' kernels multiply, computed independently (shared with the
/// integration tests).
#[path = "../../tests/support/x_hat.rs"]
mod x_hat;
use crate::backend::{Backend, Checked, Elem, Kernel};
use crate::layout::{pack_hot_slabs, Act, SlabLayout};
use crate::ops::rows::launch::{QuantizeX, XArg};
pub(crate) use attention_ref::attention_ref;
pub(crate) use x_hat::x_hat;

/// Launch on the host backend (the tests stand in for the checked ops).
pub(crate) fn launch<K: Kernel<HostBackend>>(be: &HostBackend, kernel: K) -> Result<()> {
    be.launch(kernel, Checked(()))
}

/// A buffer holding `host`.
pub(crate) fn upload<T: Elem>(be: &HostBackend, host: &[T]) -> HostBuf<T> {
    let mut b = be.zeros(host.len()).unwrap();
    be.write(host, &mut b, 0).unwrap();
    b
}

/// A buffer holding the rows of `w` as an upload lays them out on a device (the 32-weight
/// quantized formats repacked, [`crate::repack`]).
pub(crate) fn upload_rows(be: &HostBackend, w: &Weight) -> HostBuf<u8> {
    upload(
        be,
        &crate::repack::repack_rows(w.dtype, w.cols, w.bytes()).unwrap(),
    )
}

/// x as the row kernels of a format read it: the floats, and for a quantized format the same
/// quantized by the host's quantize_x.
pub(crate) struct HostX {
    x: HostBuf<f32>,
    q: Option<HostBuf<u8>>,
}

impl HostX {
    pub(crate) fn new(be: &HostBackend, dtype: DType, x: &[f32]) -> HostX {
        let dx = upload(be, x);
        let q = dtype.is_quantized().then(|| {
            let mut q = be.zeros(crate::layout::xq_bytes(x.len())).unwrap();
            let cols = x.len();
            launch(
                be,
                QuantizeX {
                    x: &dx,
                    cols,
                    xq: &mut q,
                },
            )
            .unwrap();
            q
        });
        HostX { x: dx, q }
    }

    /// What a launch takes.
    pub(crate) fn arg(&self) -> XArg<'_, HostBackend> {
        match &self.q {
            Some(q) => XArg::Quant(q),
            None => XArg::F32(&self.x),
        }
    }
}

/// A buffer's contents.
pub(crate) fn download<T: Elem>(be: &HostBackend, b: &HostBuf<T>) -> Vec<T> {
    let mut out = vec![T::default(); b.as_slice().len()];
    be.read(b, 0, &mut out).unwrap();
    out
}

/// Whether `r` failed with `Error::Shape`.
pub(crate) fn is_shape(r: Result<()>) -> bool {
    matches!(r, Err(Error::Shape(_)))
}

/// Columns for `dtype` that are not a round number: odd for the float formats, an odd count of
/// blocks (32-weight blocks or 256-weight super-blocks) for the quantized ones.
pub(crate) fn odd_cols(dtype: DType) -> usize {
    if dtype.is_quantized() {
        dtype.block_size() * if dtype.is_super_block() { 3 } else { 7 }
    } else {
        203
    }
}

/// A slab test's data of format pair `i`: gate and up in `GPU_DTYPES[i]`, down_t `shift`
/// formats further on, their [`hot_dim`] width, the hot neurons of `seeds[0]`, x as uploaded
/// (of `seeds[1]`) and as the kernels multiply it ([`x_hat`]), and [`FFN`] flags of `seeds[2]`.
pub(crate) struct SlabCase {
    /// The hot neurons (their rows' width: `hot.gate.cols`).
    pub hot: Hot,
    /// x as uploaded.
    pub x0: Vec<f32>,
    /// x as the kernels multiply it (int16 for the quantized formats).
    pub x: Vec<f32>,
    /// Per neuron of the FFN: active or not.
    pub flags: Vec<i32>,
}

impl SlabCase {
    pub fn new(be: &HostBackend, i: usize, shift: usize, seeds: [u64; 3]) -> SlabCase {
        let dtype = GPU_DTYPES[i];
        let down = GPU_DTYPES[(i + shift) % GPU_DTYPES.len()];
        let dim = hot_dim(dtype, down);
        let hot = hot(be, dtype, down, dim, seeds[0]);
        let x0 = pseudo_random(dim, seeds[1]);
        SlabCase {
            hot,
            x: x_hat(dtype, &x0),
            x0,
            flags: flags(FFN, seeds[2]),
        }
    }
}

/// Width for hot slabs of gate/up in `a` and down_t in `b`: odd unless one is quantized, a
/// whole number of super-blocks when one is a K-quant.
pub(crate) fn hot_dim(a: DType, b: DType) -> usize {
    [a, b]
        .into_iter()
        .max_by_key(|d| d.block_size())
        .map_or(203, odd_cols)
}

/// Assert `got` is `want` within `rel · max(1, |want|)` per element.
pub(crate) fn assert_close(got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rel * w.abs().max(1.0);
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w}");
    }
}

/// `act(x)` by the core crate's activation (identity for [`Act::None`]): the reference.
pub(crate) fn act_ref(act: Act, x: f32) -> f32 {
    use powerinfer_core::Activation;
    match act {
        Act::None => x,
        Act::Relu => Activation::Relu.apply(x),
        Act::Silu => Activation::Silu.apply(x),
        Act::Gelu => Activation::Gelu.apply(x),
        Act::GeluErf => Activation::GeluErf.apply(x),
    }
}

/// Every activation code.
pub(crate) const ACTS: [Act; 5] = [Act::None, Act::Relu, Act::Silu, Act::Gelu, Act::GeluErf];

/// One layer's hot neurons in slabs on the host backend, with the weights they came from.
pub(crate) struct Hot {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    /// Hot neuron ids in slot order.
    pub ids: Vec<u32>,
    pub layout: SlabLayout,
    pub buf: HostBuf<u8>,
}

impl Hot {
    /// Slots including the padding of the partial last slab.
    pub fn slots(&self) -> usize {
        self.layout.n_slabs * self.layout.bucket
    }

    /// The neuron id of slot `r`, None for padding.
    pub fn id(&self, r: usize) -> Option<usize> {
        self.ids.get(r).map(|&i| i as usize)
    }
}

/// FFN width of [`hot`] (prime, so the ids `(7i + 3) % FFN` are distinct).
pub(crate) const FFN: usize = 61;

/// 21 hot neurons of an FFN of [`FFN`] and width `dim`, in slabs of 8 (the last one partial):
/// gate and up in `dtype`, down_t in `down`.
pub(crate) fn hot(be: &HostBackend, dtype: DType, down: DType, dim: usize, seed: u64) -> Hot {
    let gate = weight(dtype, FFN, dim, seed);
    let up = weight(dtype, FFN, dim, seed + 1);
    let down_w = weight(down, FFN, dim, seed + 2);
    let ids: Vec<u32> = (0..21).map(|i| (7 * i + 3) % FFN as u32).collect();
    let (layout, bytes) = pack_hot_slabs(&gate, Some(&up), &down_w, &ids, 8).unwrap();
    assert_eq!(layout.n_slabs, 3);
    Hot {
        gate,
        up,
        down: down_w,
        ids,
        layout,
        buf: upload(be, &bytes),
    }
}

/// One flag per FFN neuron, about a third of them 0.
pub(crate) fn flags(n: usize, seed: u64) -> Vec<i32> {
    pseudo_random(n, seed)
        .iter()
        .map(|&v| i32::from(v > -0.3))
        .collect()
}
