//! Deterministic data for tests and benchmarks across the crates: a small llama config and
//! pseudo-random values (an LCG, so every crate's tests see the same numbers without a
//! dependency on a random-number crate).

use crate::config::{Activation, ModelConfig, RopeStyle};
use crate::{quantize_row, Buffer, DType, Weight};

/// A small llama config: 2 layers, dim 64, ffn 96, 4 heads of 16 over 2 KV heads, vocab 100,
/// context 128, RMS eps 1e-5, RoPE theta 10000 (normal style). Change fields with struct update
/// syntax: `ModelConfig { vocab_size: 50, ..tiny_config(Activation::Relu) }`.
pub fn tiny_config(activation: Activation) -> ModelConfig {
    ModelConfig {
        n_layers: 2,
        dim: 64,
        ffn_dim: 96,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        vocab_size: 100,
        max_context: 128,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::Norm,
        activation,
        arch: Default::default(),
        rope: Default::default(),
        moe: Default::default(),
    }
}

/// `n` pseudo-random values in [-1, 1), the same for the same `seed`.
pub fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    const A: u64 = 6364136223846793005;
    const C: u64 = 1442695040888963407;
    let mut s = seed.wrapping_mul(A).wrapping_add(C);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(A).wrapping_add(C);
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// A `rows × cols` weight in `dtype`: [`pseudo_random`] values of `seed`, quantized row by row.
pub fn random_weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    quantized_weight(dtype, rows, cols, &pseudo_random(rows * cols, seed))
}

/// A `rows × cols` weight in `dtype` from the row-major f32 `vals`, quantized row by row.
pub fn quantized_weight(dtype: DType, rows: usize, cols: usize, vals: &[f32]) -> Weight {
    let rb = dtype.row_bytes(cols).expect("cols fit the format's blocks");
    let mut bytes = vec![0u8; rb * rows];
    for (r, row) in bytes.chunks_exact_mut(rb).enumerate() {
        quantize_row(dtype, &vals[r * cols..(r + 1) * cols], row).expect("quantizing a row");
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).expect("a weight of whole rows")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_deterministic_and_in_range() {
        let a = pseudo_random(1000, 7);
        assert_eq!(a, pseudo_random(1000, 7));
        assert_ne!(a, pseudo_random(1000, 8));
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
        assert!(tiny_config(Activation::Silu).validate().is_ok());
    }
}
