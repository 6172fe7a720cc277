//! The int8 quantization of activations in blocks of 256 (ggml's `block_q8_K`), written
//! plainly: the definition that the SIMD quantizer (`kernels::avx2::int8_k::X8K`) reproduces
//! bit for bit, and the x̂ that the kernel tests' float64 oracle dots with.
//!
//! x is cut into blocks of 256 values with one scale each: d = max|x| / 127 over the block, and
//! q = round_ties_even(x · (127 / max|x|)), so |q| <= 127 and x ≈ d·q; a block of zeros (or one
//! so small that 127 / max|x| overflows) has q = 0. The same rule as [`super::x8`] over a longer
//! run: the formats whose sub-block scales are small integers (the 2-bit lattice i-quants) take
//! their whole 256-weight block as one integer dot against it, with one float step per block.

use super::x8::{hat_runs, quantize_runs};

/// Values sharing one scale.
pub const X8K_BLOCK: usize = 256;

/// x quantized to int8 in blocks of 256: `(q, d)` with `q.len() == x.len()` and one `d` per
/// block; `None` when x holds a NaN or an infinity, or its length is not a multiple of 256.
pub fn quantize_x8k(x: &[f32]) -> Option<(Vec<i8>, Vec<f32>)> {
    quantize_runs(x, X8K_BLOCK)
}

/// The values the int8 x stands for, d·q, in f32 (each product rounded once to f32);
/// `None` as for [`quantize_x8k`].
pub fn x8k_hat(x: &[f32]) -> Option<Vec<f32>> {
    hat_runs(x, X8K_BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quants_are_within_half_a_step_and_bounded() {
        let x: Vec<f32> = (0..768)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let (q, d) = quantize_x8k(&x).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let back = q[i] as f32 * d[i / 256];
            assert!((back - v).abs() <= 0.5 * d[i / 256] * 1.0001);
            assert!(q[i] != i8::MIN);
        }
        assert!(quantize_x8k(&[0.0; 256]).unwrap().0.iter().all(|&v| v == 0));
        assert!(quantize_x8k(&[1.0; 32]).is_none());
        let mut bad = vec![1.0f32; 512];
        bad[300] = f32::NAN;
        assert!(quantize_x8k(&bad).is_none());
    }
}
