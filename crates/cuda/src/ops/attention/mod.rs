//! The attention family (`kernels/attention.cu`): storing one position's keys and values in
//! the caches (f16 or f32, [`KvElem`]), and decode attention of one query over the cached
//! positions (flash-decoding chunks and their merge), checked ([`AttentionOps`]), launched
//! ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice};
use crate::layout::{att_chunking, AttnParams, MAX_HEAD_DIM};

pub(crate) mod host;
pub mod kv;
pub mod launch;
#[cfg(test)]
mod tests;

pub use kv::{KvCaches, KvCachesMut, KvElem};
use launch::{AttentionDecode, AttentionMerge, KvStore};

/// Storing into the KV caches and decode attention, checked, on any backend.
pub trait AttentionOps: Backend {
    /// Write position `pos`'s keys and values (kv_dim f32 each) into the caches of `T` ([context,
    /// kv_dim] each); `Error::ContextOverflow` past the cache's end.
    fn kv_store<T: KvElem>(
        &self,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        pos: usize,
        cache_k: &mut Self::Buf<T>,
        cache_v: &mut Self::Buf<T>,
    ) -> Result<()> {
        let kv_dim = k.len();
        ensure!(
            v.len() == kv_dim,
            Shape,
            "kv_store: k {} and v {}",
            kv_dim,
            v.len()
        );
        ensure!(
            (pos + 1) * kv_dim <= cache_k.len() && cache_k.len() == cache_v.len(),
            ContextOverflow,
            "kv_store: position {pos} does not fit a cache of {} values",
            cache_k.len()
        );
        if kv_dim == 0 {
            return Ok(());
        }
        let launch = KvStore {
            k,
            v,
            kv_dim,
            pos,
            caches: T::caches_mut::<Self>(cache_k, cache_v),
        };
        self.launch(launch, Checked(()))
    }

    /// Decode attention for the token at position `n_pos − 1`: `q` is n_heads × head_dim, the
    /// caches hold positions 0..n_pos (rows of n_kv_heads × head_dim), `out` is n_heads × head_dim;
    /// the query attends to positions `p.first(n_pos)..n_pos`, scores `(q·k)·p.scale`, soft-capped
    /// to `c · tanh(s / c)` with `p.softcap = Some(c)`; with `sinks` (n_heads values: gpt-oss's
    /// `attn_sinks`) head h's sink logit joins the softmax's max and normaliser as a score
    /// without a value, once (in the merge when the positions take several chunks), as the CPU
    /// side's `SoftmaxExtras` adds it. Flash-decoding: the positions are cut into
    /// as many chunks as `part` holds partial states for ([`att_chunking`], at least
    /// [`crate::layout::ATT_MIN_CHUNK`] positions each), merged by a second launch; one chunk (a
    /// short context, or an empty `part`) is one launch. `Error::Unsupported` for head_dim >
    /// [`MAX_HEAD_DIM`], a scale that is no finite number or a cap that is no positive one;
    /// `Error::Shape` for a window of 0 positions or sinks of another length than n_heads.
    #[allow(clippy::too_many_arguments)]
    fn attention<T: KvElem>(
        &self,
        q: &Self::Buf<f32>,
        cache_k: &Self::Buf<T>,
        cache_v: &Self::Buf<T>,
        n_pos: usize,
        p: &AttnParams,
        sinks: Option<&Self::Buf<f32>>,
        part: &mut Self::Buf<f32>,
        out: &mut Self::Buf<f32>,
    ) -> Result<()> {
        let AttnParams {
            n_heads,
            n_kv_heads,
            head_dim,
            window,
            scale,
            softcap,
        } = *p;
        ensure!(
            n_heads > 0 && n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            Shape,
            "attention: {n_heads} heads, {n_kv_heads} kv heads"
        );
        ensure!(
            head_dim > 0 && head_dim <= MAX_HEAD_DIM,
            Unsupported,
            "head_dim {head_dim}"
        );
        ensure!(
            q.len() == n_heads * head_dim && out.len() == q.len(),
            Shape,
            "attention: q {} / out {} for {n_heads} x {head_dim}",
            q.len(),
            out.len()
        );
        let kv_dim = n_kv_heads * head_dim;
        ensure!(
            n_pos > 0 && n_pos * kv_dim <= cache_k.len() && n_pos * kv_dim <= cache_v.len(),
            Shape,
            "attention: {n_pos} positions do not fit the cache"
        );
        ensure!(
            sinks.is_none_or(|s| s.len() == n_heads),
            Shape,
            "attention: {} sinks for {n_heads} heads",
            sinks.map_or(0, |s| s.len())
        );
        ensure!(
            window != Some(0),
            Shape,
            "attention: a sliding window of 0 positions"
        );
        ensure!(
            scale.is_finite(),
            Unsupported,
            "attention: query scale {scale}"
        );
        ensure!(
            softcap.is_none_or(|c| c > 0.0 && c.is_finite()),
            Unsupported,
            "attention: the soft-cap {softcap:?} must be a positive number"
        );
        let first = p.first(n_pos);
        let (n_chunks, chunk) = att_chunking(n_pos - first, part.len(), n_heads, head_dim);
        let launch = AttentionDecode {
            q,
            caches: T::caches::<Self>(cache_k, cache_v),
            first,
            n_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            softcap: softcap.unwrap_or(0.0),
            sinks,
            chunk,
            part,
            out,
        };
        self.launch(launch, Checked(()))?;
        if n_chunks > 1 {
            let merge = AttentionMerge {
                part,
                n_heads,
                head_dim,
                n_chunks,
                sinks,
                out,
            };
            self.launch(merge, Checked(()))?;
        }
        Ok(())
    }
}

impl<B: Backend> AttentionOps for B {}
