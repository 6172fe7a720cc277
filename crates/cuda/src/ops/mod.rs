//! The checked operations every backend gets ([`GpuOps`], implemented once for every
//! [`Backend`]): uploads of weights and hot-neuron slabs, and one method per kernel that checks
//! shapes on the host and then queues the launch. Nothing here waits for the device except
//! `download`. Split per op family, as the kernels are (`kernels/*.cu`): `upload`, `rows`
//! (sparse_matvec.cu), `axpy` (axpy_down.cu), `predictor`, `norm_rope`, `attention`,
//! `elementwise`. Each check returns the same `Error` kind on every backend (`Shape`,
//! `Unsupported`, `ContextOverflow`); empty work returns `Ok` without a launch.

use powerinfer_core::{ensure, DType, Result, RopeStyle, Weight};

use crate::backend::{Backend, DeviceWeight, Elem, HotFfn, KvElem};
use crate::kernels::{is_gpu_dtype, GPU_DTYPES};
use crate::layout::{Act, AttnParams, FfnAct, RowSpace};

mod attention;
mod axpy;
mod compact;
mod elementwise;
mod norm_rope;
mod predictor;
mod rows;
mod upload;

pub use axpy::{down_splits, live_splits, part_len, SPLIT_ROWS};
pub use compact::Compacted;
pub use norm_rope::{QkNorms, MAX_ROPE_PAIRS};
pub use rows::XIn;

/// `Error::Unsupported` unless the GPU kernels take `dtype` ([`GPU_DTYPES`]; Q2_K and Q3_K run
/// on the CPU only, so far).
pub(crate) fn ensure_gpu_dtype(dtype: DType) -> Result<()> {
    ensure!(
        is_gpu_dtype(dtype),
        Unsupported,
        "{dtype} weights have no GPU kernels yet (supported on the GPU: {}); keep them on the \
         CPU (plan them with the planner, which does) or run this model on device=\"cpu\"",
        GPU_DTYPES.map(DType::name).join(", ")
    );
    Ok(())
}

/// Every operation of the executor, checked, on any backend.
#[allow(clippy::too_many_arguments)]
pub trait GpuOps: Backend {
    /// Copy `host` to a new buffer.
    fn upload<T: Elem>(&self, host: &[T]) -> Result<Self::Buf<T>> {
        upload::upload(self, host)
    }

    /// Copy a whole buffer back (waits for queued work).
    fn download<T: Elem>(&self, src: &Self::Buf<T>) -> Result<Vec<T>> {
        upload::download(self, src)
    }

    /// Upload a whole weight matrix (rows as stored).
    fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight<Self>> {
        upload::upload_weight(self, w)
    }

    /// Pack one layer's hot neurons in slabs of `bucket` and upload them (the plan's `ffn_hot`);
    /// `up` None for a gate-less FFN (OPT, Falcon: the slabs hold no up rows).
    fn upload_hot_ffn(
        &self,
        gate: &Weight,
        up: Option<&Weight>,
        down_t: &Weight,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn<Self>> {
        upload::upload_hot_ffn(self, gate, up, down_t, ids, bucket)
    }

    /// [`GpuOps::upload_hot_ffn`] over row spaces: a mixture of experts' flattened neurons (each
    /// expert's rows, then the shared expert's), packed without copying the experts first.
    fn upload_hot_rows(
        &self,
        gate: &RowSpace<'_>,
        up: Option<&RowSpace<'_>>,
        down_t: &RowSpace<'_>,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn<Self>> {
        upload::upload_hot_rows(self, gate, up, down_t, ids, bucket)
    }

    /// `x` (all of it: a multiple of 32 values) quantized to the int16 blocks the row kernels of
    /// the quantized formats read, into `xq` (at least [`crate::layout::xq_bytes`] of x's
    /// length): once per vector, before the row operations that read it ([`XIn::quantized`]).
    fn quantize_x(&self, x: &Self::Buf<f32>, xq: &mut Self::Buf<u8>) -> Result<()> {
        rows::quantize_x(self, x, xq)
    }

    /// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k; x quantized when
    /// W is.
    fn matvec_rows(
        &self,
        w: &DeviceWeight<Self>,
        x: XIn<'_, Self>,
        idx: Option<&Self::Buf<i32>>,
        n: usize,
        act: Act,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        rows::matvec_rows(self, w, x, idx, n, act, false, y)
    }

    /// `y[k] += dot(W[row k], x)` for k in 0..n (a dense matvec added into `y` in the same
    /// launch: the attention's output into the residual); x quantized when W is.
    fn matvec_add(
        &self,
        w: &DeviceWeight<Self>,
        x: XIn<'_, Self>,
        n: usize,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        rows::matvec_rows(self, w, x, None, n, Act::None, true, y)
    }

    /// The hot neurons' gate/up pass, for every hot slot r: `h[r] = g · u'` with
    /// `g = act(dot(gate[r], x) + gate_bias[id])` and `u' = dot(up[r], x)` (`act(u)` with
    /// `act.up_act`; 1 for slabs without up rows), `act` with its FATReLU threshold. With
    /// `flags` (one i32 per FFN neuron) inactive neurons give 0 unread; `gate_bias` holds one
    /// value per FFN neuron (OPT's fc1 bias), indexed by the slot's neuron id; x quantized when the slabs are.
    fn hot_gate_up(
        &self,
        ffn: &HotFfn<Self>,
        x: XIn<'_, Self>,
        flags: Option<&Self::Buf<i32>>,
        act: FfnAct,
        gate_bias: Option<&Self::Buf<f32>>,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        rows::hot_gate_up(self, ffn, x, flags, act, gate_bias, h)
    }

    /// The hot slots of `ffn` whose neuron's flag is set (one i32 per FFN neuron, nonzero =
    /// active), gathered on the GPU in slot order into `out` (room for `n_hot`; its count stays
    /// on the device).
    fn active_slots(
        &self,
        ffn: &HotFfn<Self>,
        flags: &Self::Buf<i32>,
        out: &mut Compacted<Self>,
    ) -> Result<()> {
        compact::active_slots(self, ffn, flags, out)
    }

    /// [`GpuOps::hot_gate_up`] over the slots of `slots` ([`GpuOps::active_slots`]) only:
    /// `h[k]` for the k-th of them (the entries past their count untouched).
    fn hot_gate_up_listed(
        &self,
        ffn: &HotFfn<Self>,
        x: XIn<'_, Self>,
        slots: &Compacted<Self>,
        act: FfnAct,
        gate_bias: Option<&Self::Buf<f32>>,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        rows::hot_gate_up_listed(self, ffn, x, slots, act, gate_bias, h)
    }

    /// The rows of the down pass: the hot slots whose activation in `h` is not 0 (one per hot
    /// slot, or with `slots` one per entry of that list), with their activation, gathered on
    /// the GPU in slot order into `out` (room for `n_hot`, with coefficients).
    fn nonzero_rows(
        &self,
        ffn: &HotFfn<Self>,
        h: &Self::Buf<f32>,
        slots: Option<&Compacted<Self>>,
        out: &mut Compacted<Self>,
    ) -> Result<()> {
        compact::nonzero_rows(self, ffn, h, slots, out)
    }

    /// The hot neurons' down pass over the rows of `rows` ([`GpuOps::nonzero_rows`]):
    /// `y += Σ_j a[j] · down_t[idx[j]]`, split as [`GpuOps::hot_down`] over one split per 128
    /// rows (at most `splits`, chosen on the GPU from the count): the same bits on every run.
    fn hot_down_listed(
        &self,
        ffn: &HotFfn<Self>,
        rows: &Compacted<Self>,
        part: &mut Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        splits: usize,
    ) -> Result<()> {
        axpy::hot_down_listed(self, ffn, rows, part, y, splits)
    }

    /// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots, the rows cut
    /// into `splits` runs (clamped to 1..=min(n_hot, 65,535)) whose partial sums go through
    /// `part` (at least splits · dim floats; [`down_splits`] and [`part_len`] size it) and are
    /// added in a fixed order: the result is the same bits on every run.
    fn hot_down(
        &self,
        ffn: &HotFfn<Self>,
        h: &Self::Buf<f32>,
        part: &mut Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        splits: usize,
    ) -> Result<()> {
        axpy::hot_down(self, ffn, h, part, y, splits)
    }

    /// One layer's predictor: `hidden = ReLU(fc1 · x)`, `flags[j] = (fc2 · hidden)[j] >=
    /// threshold` (`fc2_t` is `[rank, ffn]`), logits kept when asked.
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
        predictor::predictor(self, fc1, fc2_t, threshold, x, hidden, flags, logits)
    }

    /// RMSNorm of `rows` rows of `w.len()` values.
    fn rms_norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        norm_rope::rms_norm(self, x, w, rows, eps, out, None)
    }

    /// [`rms_norm`](Self::rms_norm), and `out` quantized into `xq` in the same launch (the
    /// bytes [`quantize_x`](Self::quantize_x) would write for it, row after row; rows of whole
    /// blocks of 32): the quantized matvecs reading a norm need no launch of their own.
    fn rms_norm_quantized(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
        xq: &mut Self::Buf<u8>,
    ) -> Result<()> {
        norm_rope::rms_norm(self, x, w, rows, eps, out, Some(xq))
    }

    /// LayerNorm of `rows` rows of `w.len()` values: `out = (x − mean) / sqrt(var + eps) · w +
    /// b`, the biased variance (OPT, Falcon).
    fn layer_norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        b: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        norm_rope::layer_norm(self, x, w, b, rows, eps, out, None)
    }

    /// [`layer_norm`](Self::layer_norm), and `out` quantized into `xq` in the same launch (as
    /// [`rms_norm_quantized`](Self::rms_norm_quantized)).
    fn layer_norm_quantized(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        b: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
        xq: &mut Self::Buf<u8>,
    ) -> Result<()> {
        norm_rope::layer_norm(self, x, w, b, rows, eps, out, Some(xq))
    }

    /// Rotate every head of `x` (n_heads × head_dim) in place for position `pos`: pair i of
    /// the first `2 · inv_freqs.len()` values of each head by `pos · inv_freqs[i]`.
    fn rope(
        &self,
        x: &mut Self::Buf<f32>,
        head_dim: usize,
        pos: usize,
        inv_freqs: &[f64],
        style: RopeStyle,
    ) -> Result<()> {
        norm_rope::rope(self, x, None, head_dim, pos, inv_freqs, style, None)
    }

    /// [`rope`](Self::rope) of the queries `q` and the keys `k` in one launch; with `norms`
    /// (the q and k weights of head_dim values, and eps) each head RMS-normed first, in the
    /// same launch (the per-head q/k norm).
    fn rope_qk(
        &self,
        q: &mut Self::Buf<f32>,
        k: &mut Self::Buf<f32>,
        head_dim: usize,
        pos: usize,
        inv_freqs: &[f64],
        style: RopeStyle,
        norms: Option<QkNorms<'_, Self>>,
    ) -> Result<()> {
        norm_rope::rope(self, q, Some(k), head_dim, pos, inv_freqs, style, norms)
    }

    /// Write position `pos`'s keys and values into the caches: f16 (`u16` bits, rounded to
    /// nearest even) or f32 ([`KvElem`]).
    fn kv_store<T: KvElem>(
        &self,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        pos: usize,
        cache_k: &mut Self::Buf<T>,
        cache_v: &mut Self::Buf<T>,
    ) -> Result<()> {
        attention::kv_store(self, k, v, pos, cache_k, cache_v)
    }

    /// Decode attention for the token at position `n_pos − 1` over the cached positions
    /// `p.first(n_pos)..n_pos` (a sliding window, or all), scores `(q·k)·p.scale`, soft-capped
    /// with `p.softcap`, then softmax. The caches are f16 or f32 ([`KvElem`]). `part` is the
    /// flash-decoding scratch ([`crate::layout::att_part_len`] values for the context; empty:
    /// one chunk, as for a short context).
    #[allow(clippy::too_many_arguments)]
    fn attention<T: KvElem>(
        &self,
        q: &Self::Buf<f32>,
        cache_k: &Self::Buf<T>,
        cache_v: &Self::Buf<T>,
        n_pos: usize,
        p: &AttnParams,
        part: &mut Self::Buf<f32>,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        attention::attention(self, q, cache_k, cache_v, n_pos, p, part, out)
    }

    /// `y[i] += x[i]`.
    fn add(&self, y: &mut Self::Buf<f32>, x: &Self::Buf<f32>) -> Result<()> {
        elementwise::add(self, y, x)
    }

    /// `h[i] = 0` where `|h[i]| < t`, for i in 0..n.
    fn threshold_mask(&self, h: &mut Self::Buf<f32>, n: usize, t: f32) -> Result<()> {
        elementwise::threshold_mask(self, h, n, t)
    }

    /// `y[i] = cap · tanh(y[i] / cap)` for i in 0..n (Gemma 2's final logits); `cap > 0`.
    fn softcap(&self, y: &mut Self::Buf<f32>, n: usize, cap: f32) -> Result<()> {
        elementwise::softcap(self, y, n, cap)
    }

    /// `dst[i] = src[i]` over `src.len()` values (`dst` at least as long).
    fn copy(&self, dst: &mut Self::Buf<f32>, src: &Self::Buf<f32>) -> Result<()> {
        elementwise::copy(self, dst, src)
    }

    /// `y[i] = v` for every value of `y`.
    fn fill(&self, y: &mut Self::Buf<f32>, v: f32) -> Result<()> {
        elementwise::fill(self, y, v)
    }

    /// A mixture of experts' routing as flags over its flattened neurons: `flags[j]` for every
    /// j in `flags` is whether neuron j's expert has a nonzero weight in `w` (n_expert + 1
    /// values: each expert's weight for the token, 0 where not routed, then the shared
    /// expert's scale). Neuron `j < routed` belongs to expert `j / expert_ffn`, the rest to the
    /// shared expert.
    fn expert_flags(
        &self,
        w: &Self::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        flags: &mut Self::Buf<i32>,
    ) -> Result<()> {
        elementwise::expert_flags(self, w, expert_ffn, routed, flags)
    }

    /// Each hot slot's value of `h` times its neuron's expert weight in `w` (as
    /// [`GpuOps::expert_flags`]), before the down pass sums the slots.
    fn expert_scale(
        &self,
        ffn: &HotFfn<Self>,
        w: &Self::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        elementwise::expert_scale(self, ffn, w, expert_ffn, routed, h)
    }
}

impl<B: Backend> GpuOps for B {}
