//! Encoding f32 rows into the ternary formats (TQ1_0, TQ2_0; layouts in [`crate::dtype`]) with
//! ggml's reference rounding (`quantize_row_tq1_0_ref`, `quantize_row_tq2_0_ref`): d = max|x|
//! per 256 weights, each weight round(x / d) in {−1, 0, 1}.

use half::f16;

/// The block's d = max|x| (stored as f16) and the trits round(x / d) + 1 in {0, 1, 2}, in
/// weight order (ggml's `lroundf`: halves away from zero).
fn trits(x: &[f32]) -> (f32, [u8; 256]) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut t = [0u8; 256];
    for (ti, &v) in t.iter_mut().zip(x) {
        *ti = ((v * id).round() as i32 + 1) as u8;
    }
    (d, t)
}

/// One TQ2_0 block (66 bytes) of 256 weights: weight 128j + 32l + m in bits 2l of qs[32j + m].
pub(crate) fn tq2_0_block(x: &[f32], out: &mut [u8]) {
    let (d, t) = trits(x);
    for (byte, o) in out[..64].iter_mut().enumerate() {
        let (j, m) = (byte / 32, byte % 32);
        *o = (0..4).fold(0u8, |q, l| q | (t[128 * j + 32 * l + m] & 3) << (2 * l));
    }
    out[64..66].copy_from_slice(&f16::from_f32(d).to_le_bytes());
}

/// Five (or four, then a 0) trits, the first most significant, as TQ1_0's byte: the base-3
/// number as a fraction of 3^5 times 256, rounded up.
fn pack5(trits: impl Iterator<Item = u8>) -> u8 {
    let q = trits.fold(0u16, |q, t| q * 3 + t as u16);
    (q * 256).div_ceil(243) as u8
}

/// One TQ1_0 block (54 bytes) of 256 weights (the weight order in [`crate::dtype`]).
pub(crate) fn tq1_0_block(x: &[f32], out: &mut [u8]) {
    let (d, t) = trits(x);
    for m in 0..32 {
        out[m] = pack5((0..5).map(|n| t[m + 32 * n]));
    }
    for m in 0..16 {
        out[32 + m] = pack5((0..5).map(|n| t[160 + m + 16 * n]));
    }
    for j in 0..4 {
        out[48 + j] = pack5((0..4).map(|n| t[240 + j + 4 * n]).chain([0]));
    }
    out[52..54].copy_from_slice(&f16::from_f32(d).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use crate::{dequantize_row, quantize_row, DType};

    /// Weights whose every x / max|x| lies away from the ±0.5 rounding edges: the round trip
    /// gives back round(x / d)·d with d the f16 max.
    #[test]
    fn round_trip_gives_the_trits() {
        let x: Vec<f32> = (0..512)
            .map(|i| [0.9f32, -0.1, 0.0, -1.0, 0.7, 0.2][i * 7 % 6] * 1.5)
            .collect();
        for dtype in DType::TERNARY {
            let mut buf = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
            quantize_row(dtype, &x, &mut buf).unwrap();
            let mut back = vec![9f32; x.len()];
            dequantize_row(dtype, &buf, &mut back).unwrap();
            for (&b, &v) in back.iter().zip(&x) {
                assert_eq!(b, (v / 1.5).round() * 1.5, "{dtype}");
            }
        }
    }

    #[test]
    fn zero_blocks_encode_to_zero() {
        for dtype in DType::TERNARY {
            let mut buf = vec![0xffu8; dtype.block_bytes()];
            quantize_row(dtype, &[0.0; 256], &mut buf).unwrap();
            let mut back = vec![1f32; 256];
            dequantize_row(dtype, &buf, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0.0), "{dtype}");
        }
    }
}
