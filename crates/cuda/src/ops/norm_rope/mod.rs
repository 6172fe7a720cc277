//! The norm and rotary family (`kernels/norm_rope.cu`): RMSNorm and LayerNorm over rows
//! (optionally quantizing their output for the integer dots in the same launch), and rotary
//! embeddings in place (optionally after the per-head q/k norm), checked ([`NormRopeOps`]),
//! launched ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, Result, RopeStyle};

use crate::backend::{Backend, Checked, DeviceSlice};
use crate::layout::xq_bytes;

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

pub use launch::MAX_ROPE_PAIRS;
use launch::{LayerNorm, RmsNorm, Rope};

/// RMSNorm of `rows` rows of `w.len()` values: `out = x / sqrt(mean(x²) + eps) · w`; with `xq`
/// also `out` quantized for the integer dots (as `quantize_x` would,
/// row after row).
fn rms_norm<B: Backend>(
    dev: &B,
    x: &B::Buf<f32>,
    w: &B::Buf<f32>,
    rows: usize,
    eps: f32,
    out: &mut B::Buf<f32>,
    xq: Option<&mut B::Buf<u8>>,
) -> Result<()> {
    let n = check_rows::<B>("rms_norm", x, w, rows, out)?;
    check_xq::<B>("rms_norm", rows, n, xq.as_deref())?;
    if rows == 0 {
        return Ok(());
    }
    let launch = RmsNorm {
        x,
        w,
        rows,
        n,
        eps,
        out,
        xq,
    };
    dev.launch(launch, Checked(()))
}

/// Error unless `xq` (when given) holds `rows` rows of `n` values quantized: whole blocks of 32.
fn check_xq<B: Backend>(what: &str, rows: usize, n: usize, xq: Option<&B::Buf<u8>>) -> Result<()> {
    let Some(xq) = xq else {
        return Ok(());
    };
    ensure!(
        n.is_multiple_of(32),
        Shape,
        "{what}: rows of {n} values, not whole blocks of 32 to quantize"
    );
    let need = rows * xq_bytes(n);
    ensure!(
        xq.len() >= need,
        Shape,
        "{what}: {} bytes for {rows} rows of {n} values quantized ({need} needed)",
        xq.len()
    );
    Ok(())
}

/// The width `w.len()` of a norm over `rows` rows, after checking `x` and `out` hold them.
fn check_rows<B: Backend>(
    what: &str,
    x: &B::Buf<f32>,
    w: &B::Buf<f32>,
    rows: usize,
    out: &B::Buf<f32>,
) -> Result<usize> {
    let n = w.len();
    ensure!(
        x.len() == rows * n && out.len() == rows * n,
        Shape,
        "{what}: x {}, out {} for {rows} rows of {n}",
        x.len(),
        out.len()
    );
    Ok(n)
}

/// LayerNorm of `rows` rows of `w.len()` values: `out = (x − mean) / sqrt(var + eps) · w + b`
/// (the biased variance, as the CPU's `layer_norm`); `xq` as [`rms_norm`]'s.
#[allow(clippy::too_many_arguments)]
fn layer_norm<B: Backend>(
    dev: &B,
    x: &B::Buf<f32>,
    w: &B::Buf<f32>,
    b: &B::Buf<f32>,
    rows: usize,
    eps: f32,
    out: &mut B::Buf<f32>,
    xq: Option<&mut B::Buf<u8>>,
) -> Result<()> {
    let n = check_rows::<B>("layer_norm", x, w, rows, out)?;
    check_xq::<B>("layer_norm", rows, n, xq.as_deref())?;
    ensure!(
        b.len() == n,
        Shape,
        "layer_norm: bias {} for a weight of {n}",
        b.len()
    );
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let launch = LayerNorm {
        x,
        w,
        b,
        rows,
        n,
        eps,
        out,
        xq,
    };
    dev.launch(launch, Checked(()))
}

/// The per-head RMSNorm weights of the queries and of the keys, and eps, that `rope` applies
/// before rotating (Qwen3's and Gemma 3's q/k norm).
pub type QkNorms<'a, B> = (
    &'a <B as Backend>::Buf<f32>,
    &'a <B as Backend>::Buf<f32>,
    f32,
);

/// Rotate every head of `x` (and of `k`: the keys, in the same launch) in place for position
/// `pos`: the first `2 · inv_freqs.len()` values of each head, pair i by `pos · inv_freqs[i]`
/// ([`ModelConfig::rope_inv_freqs`](powerinfer_core::ModelConfig::rope_inv_freqs)); with
/// `norms`, each head RMS-normed first (x's with the first weight, k's with the second).
#[allow(clippy::too_many_arguments)]
fn rope<B: Backend>(
    dev: &B,
    x: &mut B::Buf<f32>,
    k: Option<&mut B::Buf<f32>>,
    head_dim: usize,
    pos: usize,
    inv_freqs: &[f64],
    style: RopeStyle,
    norms: Option<QkNorms<'_, B>>,
) -> Result<()> {
    let heads = |v: &B::Buf<f32>| v.len().is_multiple_of(head_dim.max(1));
    ensure!(
        head_dim > 0 && head_dim.is_multiple_of(2) && heads(x) && k.as_deref().is_none_or(heads),
        Shape,
        "rope: {} (and {}) values are not heads of even head_dim {head_dim}",
        x.len(),
        k.as_deref().map_or(0, |k| k.len())
    );
    ensure!(
        !inv_freqs.is_empty() && 2 * inv_freqs.len() <= head_dim,
        Shape,
        "rope: {} rotated pairs in heads of {head_dim}",
        inv_freqs.len()
    );
    ensure!(
        inv_freqs.len() <= MAX_ROPE_PAIRS,
        Unsupported,
        "rope: {} rotated pairs, the GPU kernel takes at most {MAX_ROPE_PAIRS} (head_dim {})",
        inv_freqs.len(),
        2 * MAX_ROPE_PAIRS
    );
    if let Some((qn, kn, _)) = norms {
        ensure!(
            qn.len() == head_dim && kn.len() == head_dim,
            Shape,
            "rope: q/k norm weights of {} and {} for heads of {head_dim}",
            qn.len(),
            kn.len()
        );
    }
    let n_heads = x.len() / head_dim;
    let k_heads = k.as_deref().map_or(0, |k| k.len() / head_dim);
    if n_heads + k_heads == 0 {
        return Ok(());
    }
    let launch = Rope {
        x,
        n_heads,
        k,
        k_heads,
        head_dim,
        pos,
        inv_freqs,
        neox: style == RopeStyle::Neox,
        x_norm: norms.map(|n| n.0),
        k_norm: norms.map(|n| n.1),
        eps: norms.map_or(0.0, |n| n.2),
    };
    dev.launch(launch, Checked(()))
}

/// The norms and rotary embeddings, checked, on any backend.
#[allow(clippy::too_many_arguments)]
pub trait NormRopeOps: Backend {
    /// RMSNorm of `rows` rows of `w.len()` values.
    fn rms_norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        rms_norm(self, x, w, rows, eps, out, None)
    }

    /// [`rms_norm`](Self::rms_norm), and `out` quantized into `xq` in the same launch (the
    /// bytes `quantize_x` would write for it, row after row; rows of whole blocks of 32): the
    /// quantized matvecs reading a norm need no launch of their own.
    fn rms_norm_quantized(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
        xq: &mut Self::Buf<u8>,
    ) -> Result<()> {
        rms_norm(self, x, w, rows, eps, out, Some(xq))
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
        layer_norm(self, x, w, b, rows, eps, out, None)
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
        layer_norm(self, x, w, b, rows, eps, out, Some(xq))
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
        rope(self, x, None, head_dim, pos, inv_freqs, style, None)
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
        rope(self, q, Some(k), head_dim, pos, inv_freqs, style, norms)
    }
}

impl<B: Backend> NormRopeOps for B {}
