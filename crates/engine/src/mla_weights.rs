//! A latent-attention layer's own weights (DeepSeek-V2/V3): the query's compression, the
//! latent's norm and the per-head absorptions, viewed out of the file's tensors; below the
//! layer's weights ([`crate::layer_weights`]) and the pass that reads them ([`crate::mla`]).

use powerinfer_core::{bail, ensure, ModelConfig, Result, Weight};
use powerinfer_cpu::Matrix;

/// A latent-attention layer's weights beyond `wq` (`attn_q_b`, or `attn_q`), `wk`
/// (`attn_kv_a_mqa`) and `wo` (`attn_output`) of its [`LayerWeights`].
#[derive(Clone, Debug)]
pub struct MlaWeights {
    /// The query's compression (`attn_q_a`) and its norm (`attn_q_a_norm`); None where the
    /// query is one projection (DeepSeek-V2-Lite).
    pub q_a: Option<(Matrix, Vec<f32>)>,
    /// The latent's norm (`attn_kv_a_norm`, `kv_lora_rank` values).
    pub kv_norm: Vec<f32>,
    /// Per head, `attn_k_b`'s `kv_lora_rank` rows of `qk_nope` (row views, no copy).
    pub k_b: Vec<Weight>,
    /// Per head, `attn_v_b`'s `v_head_dim` rows of `kv_lora_rank`.
    pub v_b: Vec<Weight>,
}

/// `w`'s rows as `n` equal consecutive blocks, each a weight of its own (no copy).
fn row_blocks(w: &Weight, n: usize, what: &str) -> Result<Vec<Weight>> {
    ensure!(
        n > 0 && w.rows.is_multiple_of(n),
        Shape,
        "{what}: {} rows do not split into {n} heads",
        w.rows
    );
    let rows = w.rows / n;
    let bytes = rows * w.row_bytes();
    (0..n)
        .map(|h| match w.data.slice(h * bytes..(h + 1) * bytes) {
            Some(b) => Weight::new(w.dtype, rows, w.cols, b),
            None => bail!(Shape, "{what}: head {h} lies outside its tensor"),
        })
        .collect()
}

impl MlaWeights {
    /// The extra weights from the layer's tensors: the query's compression and its norm
    /// (`q_a`, where the config has a `q_lora_rank`), the latent's norm, and `attn_k_b` and
    /// `attn_v_b` viewed per head.
    pub(crate) fn new(
        c: &ModelConfig,
        q_a: Option<(Weight, Vec<f32>)>,
        kv_norm: Vec<f32>,
        k_b: &Weight,
        v_b: &Weight,
    ) -> Result<MlaWeights> {
        Ok(MlaWeights {
            q_a: q_a.map(|(w, n)| (Matrix::Rows(w), n)),
            kv_norm,
            k_b: row_blocks(k_b, c.n_heads, "attn_k_b")?,
            v_b: row_blocks(v_b, c.n_heads, "attn_v_b")?,
        })
    }
}
