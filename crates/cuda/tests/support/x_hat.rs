//! The x the quantized formats' row kernels multiply, computed independently of the crate: per
//! 32 values, scale · q with scale = max|x| / 32639 and q = round-to-nearest-even(x · (32639 /
//! max|x|)) (the CPU engine's int16 x, which `quantize_x` reproduces on the device). References
//! of those kernels multiply it; x itself for the float formats.

use powerinfer_core::DType;

/// x̂ of `x` for weights of `dtype`.
pub fn x_hat(dtype: DType, x: &[f32]) -> Vec<f32> {
    if !dtype.is_quantized() {
        return x.to_vec();
    }
    x.chunks(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let inv = match 32639.0 / amax {
                inv if amax > 0.0 && inv.is_finite() => inv,
                _ => 0.0, // zeros, or max|x| below ~1e-34
            };
            let scale = amax / 32639.0;
            b.iter().map(move |v| scale * (v * inv).round_ties_even())
        })
        .collect()
}
