//! The norm and rotary family (`kernels/norm_rope.cu`): RMSNorm and LayerNorm over rows
//! (optionally quantizing their output for the integer dots in the same launch), and rotary
//! embeddings in place (optionally after the per-head q/k norm), checked ([`NormRopeOps`]),
//! launched ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, Result, RopeFreqs, RopeStyle};

use crate::backend::{Backend, Checked, DeviceSlice};
use crate::layout::xq_bytes;

pub(crate) mod host;
pub mod launch;
#[cfg(test)]
mod tests;

pub use launch::MAX_ROPE_PAIRS;
use launch::{Norm, Rope};

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

/// The per-head RMSNorm weights of the queries and of the keys, and eps, that `rope` applies
/// before rotating (Qwen3's and Gemma 3's q/k norm).
pub type QkNorms<'a, B> = (
    &'a <B as Backend>::Buf<f32>,
    &'a <B as Backend>::Buf<f32>,
    f32,
);

/// The norms and rotary embeddings, checked, on any backend.
#[allow(clippy::too_many_arguments)]
pub trait NormRopeOps: Backend {
    /// RMSNorm of `rows` rows of `w.len()` values (`norm` without bias or quantized copy).
    fn rms_norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        self.norm(x, w, None, rows, eps, out, None)
    }

    /// RMSNorm (`bias` None: `out = x / sqrt(mean(x²) + eps) · w`) or LayerNorm (`out = (x −
    /// mean) / sqrt(var + eps) · w + b`, the biased variance: OPT, Falcon) of `rows` rows of
    /// `w.len()` values; with `xq`, `out` also quantized into it in the same launch (the bytes
    /// `quantize_x` would write for it, row after row; rows of whole blocks of 32): the
    /// quantized matvecs reading a norm need no launch of their own.
    fn norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        bias: Option<&Self::Buf<f32>>,
        rows: usize,
        eps: f32,
        out: &mut Self::Buf<f32>,
        xq: Option<&mut Self::Buf<u8>>,
    ) -> Result<()> {
        let what = if bias.is_some() {
            "layer_norm"
        } else {
            "rms_norm"
        };
        let n = check_rows::<Self>(what, x, w, rows, out)?;
        check_xq::<Self>(what, rows, n, xq.as_deref())?;
        if let Some(b) = bias {
            ensure!(
                b.len() == n,
                Shape,
                "layer_norm: bias {} for a weight of {n}",
                b.len()
            );
        }
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let launch = Norm {
            x,
            w,
            bias,
            rows,
            n,
            eps,
            out,
            xq,
        };
        self.launch(launch, Checked(()))
    }

    /// Rotate every head of `x` (and of `k`: the keys, in the same launch) in place for position
    /// `pos`: the first `2 · freqs.pairs()` values of each head, pair i by `pos · freqs.inv[i]`,
    /// times `freqs.mscale` ([`RopeFreqs::cos_sin`], from
    /// [`ModelConfig::rope_freqs`](powerinfer_core::ModelConfig::rope_freqs)); with
    /// `norms`, each head RMS-normed first (x's with the first weight, k's with the second).
    fn rope(
        &self,
        x: &mut Self::Buf<f32>,
        k: Option<&mut Self::Buf<f32>>,
        head_dim: usize,
        pos: usize,
        freqs: &RopeFreqs,
        style: RopeStyle,
        norms: Option<QkNorms<'_, Self>>,
    ) -> Result<()> {
        let heads = |v: &Self::Buf<f32>| v.len().is_multiple_of(head_dim.max(1));
        ensure!(
            head_dim > 0
                && head_dim.is_multiple_of(2)
                && heads(x)
                && k.as_deref().is_none_or(heads),
            Shape,
            "rope: {} (and {}) values are not heads of even head_dim {head_dim}",
            x.len(),
            k.as_deref().map_or(0, |k| k.len())
        );
        ensure!(
            freqs.pairs() > 0 && 2 * freqs.pairs() <= head_dim,
            Shape,
            "rope: {} rotated pairs in heads of {head_dim}",
            freqs.pairs()
        );
        ensure!(
            freqs.pairs() <= MAX_ROPE_PAIRS,
            Unsupported,
            "rope: {} rotated pairs, the GPU kernel takes at most {MAX_ROPE_PAIRS} (head_dim {})",
            freqs.pairs(),
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
            freqs,
            neox: style == RopeStyle::Neox,
            x_norm: norms.map(|n| n.0),
            k_norm: norms.map(|n| n.1),
            eps: norms.map_or(0.0, |n| n.2),
        };
        self.launch(launch, Checked(()))
    }
}

impl<B: Backend> NormRopeOps for B {}
