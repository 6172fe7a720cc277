//! The tiny random model the integration tests share.

#![allow(dead_code)] // each test binary uses part of it

use std::collections::HashMap;
use std::sync::Arc;

use powerinfer_core::testing::{pseudo_random, tiny_config};
use powerinfer_core::{Activation, ModelConfig, Weight};
use powerinfer_engine::ModelWeights;

pub fn config(activation: Activation) -> ModelConfig {
    ModelConfig {
        vocab_size: 50,
        max_context: 600,
        ..tiny_config(activation)
    }
}

/// Deterministic pseudo-random values in [-scale, scale).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    pseudo_random(n, seed)
        .into_iter()
        .map(|v| v * scale)
        .collect()
}

pub fn model(activation: Activation) -> Arc<ModelWeights> {
    let c = config(activation);
    Arc::new(ModelWeights::from_tensors(c.clone(), tensors(&c)).unwrap())
}

/// The check a forward pass runs between layers that never stops it (the tests' "no cancel").
pub fn no_check() -> powerinfer_core::Result<()> {
    Ok(())
}

/// `(‖a − b‖, ‖b‖)`: the distance of `a` from the reference `b` and the reference's norm.
pub fn diff_and_norm(a: &[f32], b: &[f32]) -> (f32, f32) {
    let norm: f32 = b.iter().map(|v| v * v).sum::<f32>().sqrt();
    let diff: f32 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f32>()
        .sqrt();
    (diff, norm)
}

/// The tensors of [`model`], its matrices (not the norms) quantized to `dtype`.
pub fn quantized_tensors(
    c: &ModelConfig,
    dtype: powerinfer_core::DType,
) -> HashMap<String, Weight> {
    tensors(c)
        .into_iter()
        .map(|(name, w)| {
            if w.rows == 1 {
                return (name, w);
            }
            let rb = dtype.row_bytes(w.cols).unwrap();
            let mut bytes = vec![0u8; w.rows * rb];
            for (r, out) in bytes.chunks_exact_mut(rb).enumerate() {
                let row: Vec<f32> = w
                    .row(r)
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                powerinfer_core::quantize_row(dtype, &row, out).unwrap();
            }
            let data = powerinfer_core::Buffer::from_bytes(&bytes);
            (name, Weight::new(dtype, w.rows, w.cols, data).unwrap())
        })
        .collect()
}

/// The f32 tensors of [`model`].
pub fn tensors(c: &ModelConfig) -> HashMap<String, Weight> {
    let c = c.clone();
    let mut t = HashMap::new();
    let mut seed = 0;
    let mut add = |name: String, rows: usize, cols: usize, scale: f32| {
        seed += 1;
        let w = Weight::from_f32(rows, cols, &values(rows * cols, seed, scale)).unwrap();
        t.insert(name, w);
    };
    add("token_embd".into(), c.vocab_size, c.dim, 1.0);
    add("output_norm".into(), 1, c.dim, 1.0);
    add_layers(&c, add);
    t
}

/// Every layer's tensors of config `c`, in order, given to `add` as (name, rows, cols, the
/// scale of its random values): the norms (scale 1), then the attention and FFN matrices
/// (scale 1/sqrt(dim)).
pub fn add_layers(c: &ModelConfig, mut add: impl FnMut(String, usize, usize, f32)) {
    for i in 0..c.n_layers {
        let s = 1.0 / (c.dim as f32).sqrt();
        add(format!("blk.{i}.attn_norm"), 1, c.dim, 1.0);
        add(format!("blk.{i}.ffn_norm"), 1, c.dim, 1.0);
        add(format!("blk.{i}.attn_q"), c.q_dim(), c.dim, s);
        add(format!("blk.{i}.attn_k"), c.kv_dim(), c.dim, s);
        add(format!("blk.{i}.attn_v"), c.kv_dim(), c.dim, s);
        add(format!("blk.{i}.attn_output"), c.dim, c.q_dim(), s);
        add(format!("blk.{i}.ffn_gate"), c.ffn_dim, c.dim, s);
        add(format!("blk.{i}.ffn_up"), c.ffn_dim, c.dim, s);
        add(format!("blk.{i}.ffn_down"), c.dim, c.ffn_dim, s);
    }
}
