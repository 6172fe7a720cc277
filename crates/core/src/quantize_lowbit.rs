//! Encoding f32 rows into the low-bit formats (NVFP4, Q1_0, Q2_0; layouts in [`crate::dtype`])
//! with ggml's reference rounding (`quantize_row_nvfp4_ref`, `quantize_row_q1_0_ref`,
//! `quantize_row_q2_0_ref`).

use crate::dequantize::MXFP4_VALUES;
use crate::lowbit::ue4m3_half;
use half::f16;

/// Q1_0 (128 weights): d = Σ|x| / 128, each weight's sign bit (set for x >= 0).
pub(crate) fn q1_0_block(x: &[f32], out: &mut [u8]) {
    let d = x.iter().fold(0f32, |s, v| s + v.abs()) / 128.0;
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (k, o) in out[2..18].iter_mut().enumerate() {
        *o = (0..8).fold(0u8, |b, j| b | u8::from(x[8 * k + j] >= 0.0) << j);
    }
}

/// Q2_0 (64 weights): d = max|x|, each weight round(x / d) + 1 clamped to 0..=3 (halves away
/// from zero, as C's `roundf`).
pub(crate) fn q2_0_block(x: &[f32], out: &mut [u8]) {
    let d = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let code = |v: f32| ((v * id).round() as i32 + 1).clamp(0, 3) as u8;
    for (k, o) in out[2..18].iter_mut().enumerate() {
        *o = (0..4).fold(0u8, |b, j| b | code(x[4 * k + j]) << (2 * j));
    }
}

/// The UE4M3 byte of a positive scale (ggml's `ggml_fp32_to_ue4m3`): clamped to 448, the
/// mantissa rounded by its next bit (a carry bumps the exponent), subnormals below 2^−6 as
/// round(x·2^9) in 1..=7, exponents from 15 up saturating to 0x7E; 0 for x <= 0 or NaN.
pub(crate) fn ue4m3_of(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    let x = x.min(448.0);
    let bits = x.to_bits();
    let mut exp = ((bits >> 23) & 0xFF) as i32 - 127 + 7;
    if exp <= 0 {
        let man = ((x * 512.0 + 0.5) as i32).min(7);
        return if man < 1 { 0 } else { man as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = ((bits >> 20) & 7) as i32 + ((bits >> 19) & 1) as i32;
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    (exp << 3 | man) as u8
}

/// The index of MXFP4's value nearest `v / d` (the first of equals: ggml's `best_index_mxfp4`).
fn nearest(v: f32, d: f32) -> u8 {
    let mut best = (0u8, (MXFP4_VALUES[0] as f32 * d - v).abs());
    for (i, &k) in MXFP4_VALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - v).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

/// NVFP4 (64 weights): per 16, the UE4M3 scale of max|x| / 6, each weight the nearest value.
pub(crate) fn nvfp4_block(x: &[f32], out: &mut [u8]) {
    for s in 0..4 {
        let xb = &x[16 * s..16 * s + 16];
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let ue = ue4m3_of(amax / 6.0);
        out[s] = ue;
        let d = ue4m3_half(ue);
        for j in 0..8 {
            out[4 + 8 * s + j] = nearest(xb[j], d) | nearest(xb[j + 8], d) << 4;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dequantize_row, quantize_row, DType};

    #[test]
    fn ue4m3_rounds_to_the_nearest_scale() {
        // Every positive byte's own value (doubled back) encodes to itself below exponent 15;
        // ggml saturates exponent 15 to 0x7E (448).
        for x in 1..0x7Fu8 {
            let want = if x >= 0x78 { 0x7E } else { x };
            assert_eq!(ue4m3_of(2.0 * ue4m3_half(x)), want, "byte {x:#x}");
        }
        assert_eq!((ue4m3_of(0.0), ue4m3_of(-1.0), ue4m3_of(1e9)), (0, 0, 0x7E));
        // Halfway between 1 (0x38) and 1.125 (0x39) rounds up; just below, down.
        assert_eq!(ue4m3_of(1.0625), 0x39);
        assert_eq!(ue4m3_of(1.06), 0x38);
    }

    #[test]
    fn round_trips_are_close() {
        let x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.11)
            .collect();
        for dtype in DType::LOWBIT {
            let mut buf = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
            quantize_row(dtype, &x, &mut buf).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(dtype, &buf, &mut y).unwrap();
            let num: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            let den: f32 = x.iter().map(|a| a * a).sum();
            // Q1_0 keeps only signs (error about 0.5 on uniform weights), Q2_0 four levels,
            // NVFP4 E2M1 values per 16.
            let tol = match dtype {
                DType::NVFP4 => 0.15,
                DType::Q2_0 => 0.6,
                _ => 0.7,
            };
            assert!((num / den).sqrt() < tol, "{dtype}: {}", (num / den).sqrt());
            // Signs survive wherever a weight is not rounded to zero.
            for (a, b) in x.iter().zip(&y) {
                assert!(
                    *b == 0.0 || a.signum() == b.signum() || *a == 0.0,
                    "{dtype}"
                );
            }
        }
    }
}
