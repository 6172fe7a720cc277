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
    let mut t = HashMap::new();
    let mut seed = 0;
    let mut add = |name: String, rows: usize, cols: usize, scale: f32| {
        seed += 1;
        let w = Weight::from_f32(rows, cols, &values(rows * cols, seed, scale)).unwrap();
        t.insert(name, w);
    };
    add("token_embd".into(), c.vocab_size, c.dim, 1.0);
    add("output_norm".into(), 1, c.dim, 1.0);
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
    Arc::new(ModelWeights::from_tensors(c, t).unwrap())
}
