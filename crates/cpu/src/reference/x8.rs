//! The int8 quantization of activations, written plainly: the definition that the SIMD
//! quantizer (`kernels::avx2::int8::X8`) reproduces bit for bit, and the x̂ that the kernel
//! tests' float64 oracle dots with.
//!
//! x is cut into blocks of 32 values (the weight formats' blocks), each with a scale per
//! 16-value half: d = max|x| / 127 over the half, and q = round_ties_even(x · (127 / max|x|)), so
//! |q| <= 127 and x ≈ d·q. A half of zeros (or one so small that 127 / max|x| overflows) has
//! q = 0. Halves, not whole blocks: one outlier costs 15 values their precision, not 31. On
//! SmolLM2 (float64 reference of the same weights, 64 positions of held-out text) scales per 32
//! values gave a mean KL divergence of 3.8e-3 (llama.cpp's int8 x: 4.1e-3), per 16 values 1.9e-3.

/// Largest quant magnitude.
pub const X8_MAX: f32 = 127.0;

/// Values sharing one scale.
pub const X8_SCALE_RUN: usize = 16;

/// x quantized to int8 in blocks of 32: `(q, d)` with `q.len() == x.len()` and one `d` per
/// 16-value half-block; `None` when x holds a NaN or an infinity, or its length is not a
/// multiple of 32.
pub fn quantize_x8(x: &[f32]) -> Option<(Vec<i8>, Vec<f32>)> {
    match x.len().is_multiple_of(32) {
        true => quantize_runs(x, X8_SCALE_RUN),
        false => None,
    }
}

/// The values the int8 x stands for, d·q, in f32 (each product rounded once to f32);
/// `None` as for [`quantize_x8`].
pub fn x8_hat(x: &[f32]) -> Option<Vec<f32>> {
    match x.len().is_multiple_of(32) {
        true => hat_runs(x, X8_SCALE_RUN),
        false => None,
    }
}

/// x quantized to int8 with one scale per `run` values (the rule above; `x.len()` a multiple
/// of `run`): `(q, d)`; `None` when x holds a NaN or an infinity or is not whole runs.
pub(crate) fn quantize_runs(x: &[f32], run: usize) -> Option<(Vec<i8>, Vec<f32>)> {
    if !x.len().is_multiple_of(run) || x.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut q = vec![0i8; x.len()];
    let mut d = Vec::with_capacity(x.len() / run);
    for (xb, qb) in x.chunks_exact(run).zip(q.chunks_exact_mut(run)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let inv = match X8_MAX / amax {
            inv if amax > 0.0 && inv.is_finite() => inv,
            _ => 0.0,
        };
        for (o, &v) in qb.iter_mut().zip(xb) {
            *o = (v * inv).round_ties_even() as i8;
        }
        d.push(amax / X8_MAX);
    }
    Some((q, d))
}

/// d·q of [`quantize_runs`], in f32.
pub(crate) fn hat_runs(x: &[f32], run: usize) -> Option<Vec<f32>> {
    let (q, d) = quantize_runs(x, run)?;
    Some(
        q.chunks_exact(run)
            .zip(&d)
            .flat_map(|(qb, &db)| qb.iter().map(move |&v| v as f32 * db))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quants_are_within_half_a_step_and_bounded() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let (q, d) = quantize_x8(&x).unwrap();
        for (i, &v) in x.iter().enumerate() {
            let back = q[i] as f32 * d[i / 16];
            assert!((back - v).abs() <= 0.5 * d[i / 16] * 1.0001);
            assert!(q[i] != i8::MIN);
        }
        assert!(quantize_x8(&[0.0; 32]).unwrap().0.iter().all(|&v| v == 0));
        assert!(quantize_x8(&[1e-39; 32]).unwrap().0.iter().all(|&v| v == 0));
        assert!(quantize_x8(&[1.0; 31]).is_none());
        let mut bad = vec![1.0f32; 64];
        bad[40] = f32::INFINITY;
        assert!(quantize_x8(&bad).is_none());
    }
}
