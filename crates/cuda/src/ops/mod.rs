//! The checked operations every backend gets ([`GpuOps`], implemented once for every
//! [`Backend`]): uploads of weights and hot-neuron slabs, and one method per kernel that checks
//! shapes on the host and then queues the launch. Nothing here waits for the device except
//! `download`. Split per op family, as the kernels are (`kernels/*.cu`).

use powerinfer_core::{Result, RopeStyle, Weight};

use crate::backend::{Backend, DeviceWeight, Elem, HotFfn};
use crate::layout::Act;

/// Every operation of the executor, checked, on any backend.
#[allow(clippy::too_many_arguments)]
pub trait GpuOps: Backend {
    /// Copy `host` to a new buffer.
    fn upload<T: Elem>(&self, host: &[T]) -> Result<Self::Buf<T>> {
        let _ = host;
        todo!()
    }

    /// Copy a whole buffer back (waits for queued work).
    fn download<T: Elem>(&self, src: &Self::Buf<T>) -> Result<Vec<T>> {
        let _ = src;
        todo!()
    }

    /// Upload a whole weight matrix (rows as stored).
    fn upload_weight(&self, w: &Weight) -> Result<DeviceWeight<Self>> {
        let _ = w;
        todo!()
    }

    /// Upload rows `ids` of `w` (in that order) as a compact matrix.
    fn upload_rows(&self, w: &Weight, ids: &[u32]) -> Result<DeviceWeight<Self>> {
        let _ = (w, ids);
        todo!()
    }

    /// Pack one layer's hot neurons in slabs of `bucket` and upload them (the plan's `ffn_hot`).
    fn upload_hot_ffn(
        &self,
        gate: &Weight,
        up: &Weight,
        down_t: &Weight,
        ids: &[u32],
        bucket: usize,
    ) -> Result<HotFfn<Self>> {
        let _ = (gate, up, down_t, ids, bucket);
        todo!()
    }

    /// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k.
    fn matvec_rows(
        &self,
        w: &DeviceWeight<Self>,
        x: &Self::Buf<f32>,
        idx: Option<&Self::Buf<i32>>,
        n: usize,
        act: Act,
        y: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let _ = (w, x, idx, n, act, y);
        todo!()
    }

    /// The hot neurons' gate/up pass: `h[r] = act(dot(gate[r], x)) · dot(up[r], x)` for every
    /// hot slot r; with `flags` (one i32 per FFN neuron) inactive neurons give 0 unread.
    fn hot_gate_up(
        &self,
        ffn: &HotFfn<Self>,
        x: &Self::Buf<f32>,
        flags: Option<&Self::Buf<i32>>,
        act: Act,
        h: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let _ = (ffn, x, flags, act, h);
        todo!()
    }

    /// `y[c] += Σ_k a[k] · W[row k][c]` for k in 0..n (row k = idx[k] or k).
    fn axpy_rows(
        &self,
        w: &DeviceWeight<Self>,
        idx: Option<&Self::Buf<i32>>,
        a: &Self::Buf<f32>,
        n: usize,
        y: &mut Self::Buf<f32>,
        splits: usize,
    ) -> Result<()> {
        let _ = (w, idx, a, n, y, splits);
        todo!()
    }

    /// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots.
    fn hot_down(
        &self,
        ffn: &HotFfn<Self>,
        h: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        splits: usize,
    ) -> Result<()> {
        let _ = (ffn, h, y, splits);
        todo!()
    }

    /// One layer's predictor: `hidden = ReLU(fc1 · x)`, `flags[j] = (fc2 · hidden)[j] >=
    /// threshold` (`fc2_t` is `[rank, ffn]`), logits kept when asked.
    fn predictor(
        &self,
        fc1: &DeviceWeight<Self>,
        fc2_t: &DeviceWeight<Self>,
        threshold: f32,
        x: &Self::Buf<f32>,
        hidden: &mut Self::Buf<f32>,
        flags: &mut Self::Buf<i32>,
        logits: Option<&mut Self::Buf<f32>>,
    ) -> Result<()> {
        let _ = (fc1, fc2_t, threshold, x, hidden, flags, logits);
        todo!()
    }

    /// `out[0..count) = the i < n with flags[i] != 0`, ascending; `count[0] = count`.
    fn compact_flags(
        &self,
        flags: &Self::Buf<i32>,
        n: usize,
        out: &mut Self::Buf<i32>,
        count: &mut Self::Buf<i32>,
    ) -> Result<()> {
        let _ = (flags, n, out, count);
        todo!()
    }

    /// `slot_flags[r] = flags[id(r)]` for the hot slots, then every hot flag cleared in `flags`.
    fn split_hot_flags(
        &self,
        ffn: &HotFfn<Self>,
        flags: &mut Self::Buf<i32>,
        slot_flags: &mut Self::Buf<i32>,
    ) -> Result<()> {
        let _ = (ffn, flags, slot_flags);
        todo!()
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
        let _ = (x, w, rows, eps, out);
        todo!()
    }

    /// Rotate every head of `x` (n_heads × head_dim) in place for position `pos`.
    fn rope(
        &self,
        x: &mut Self::Buf<f32>,
        head_dim: usize,
        pos: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()> {
        let _ = (x, head_dim, pos, theta, style);
        todo!()
    }

    /// Write position `pos`'s keys and values into the f16 caches.
    fn kv_store(
        &self,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        pos: usize,
        cache_k: &mut Self::Buf<u16>,
        cache_v: &mut Self::Buf<u16>,
    ) -> Result<()> {
        let _ = (k, v, pos, cache_k, cache_v);
        todo!()
    }

    /// Decode attention for one token over positions 0..n_pos of the caches.
    fn attention(
        &self,
        q: &Self::Buf<f32>,
        cache_k: &Self::Buf<u16>,
        cache_v: &Self::Buf<u16>,
        n_pos: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let _ = (
            q, cache_k, cache_v, n_pos, n_heads, n_kv_heads, head_dim, out,
        );
        todo!()
    }

    /// `g[i] = act(g[i]) · u[i]`.
    fn act_mul(&self, g: &mut Self::Buf<f32>, u: &Self::Buf<f32>, act: Act) -> Result<()> {
        let _ = (g, u, act);
        todo!()
    }

    /// `y[i] += x[i]`.
    fn add(&self, y: &mut Self::Buf<f32>, x: &Self::Buf<f32>) -> Result<()> {
        let _ = (y, x);
        todo!()
    }

    /// `h[i] = 0` where `|h[i]| < t`, for i in 0..n.
    fn threshold_mask(&self, h: &mut Self::Buf<f32>, n: usize, t: f32) -> Result<()> {
        let _ = (h, n, t);
        todo!()
    }
}

impl<B: Backend> GpuOps for B {}
