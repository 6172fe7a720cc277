//! Decoding the block formats to f32, straight from the layouts of [`crate::dtype`], in ggml's
//! order of float operations (a sub-block's `d·scale` first, then `·q − dmin·min`), so the
//! values equal ggml's (and gguf-py's) dequantization bit for bit. The plain-loop oracle the
//! kernels are tested against, and the decoder of the scalar kernels for the K-quants.

use half::bf16;

use crate::block_values::f16_at;
pub use crate::block_values::{SubScales, IQ4NL_VALUES, MXFP4_VALUES};
use crate::dtype::DType;
use crate::error::Result;

/// Decode `row` (exactly `dtype.row_bytes(out.len())` bytes) into `out`.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) -> Result<()> {
    dtype.check_row(out.len(), row.len())?;
    let (n, bytes) = (dtype.block_size(), dtype.block_bytes());
    for (o, b) in out.chunks_exact_mut(n).zip(row.chunks_exact(bytes)) {
        dequantize_block(dtype, b, o);
    }
    Ok(())
}

/// Decode one block (`dtype.block_bytes()` bytes) into its `dtype.block_size()` values.
pub fn dequantize_block(dtype: DType, b: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => out[0] = f16_at(b, 0),
        DType::BF16 => out[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        DType::Q8_0 => {
            let d = f16_at(b, 0);
            for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                *o = d * q as i8 as f32;
            }
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => legacy_block(dtype, b, out),
        DType::IQ4_NL
        | DType::IQ4_XS
        | DType::MXFP4
        | DType::TQ1_0
        | DType::TQ2_0
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S => {
            let mut d = [0f32; 8];
            let mut q = [0i8; 256];
            unpack_table(dtype, b, &mut d, &mut q);
            for (i, (o, &qi)) in out.iter_mut().zip(&q).enumerate() {
                *o = d[i / 32] * qi as f32;
            }
        }
        DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => crate::lowbit::dequantize_lowbit(dtype, b, out),
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => {
            crate::dequantize_iq2::dequantize_iq2_block(dtype, b, out)
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ1_M => {
            let mut sub = SubScales::default();
            let mut q = [0i8; 256];
            unpack_k(dtype, b, &mut sub, &mut q);
            let len = 256 / sub.n;
            for (i, (o, &qi)) in out.iter_mut().zip(&q).enumerate() {
                let s = i / len;
                *o = sub.d[s] * qi as f32 - sub.m[s];
            }
        }
    }
}

/// Q4_0, Q4_1, Q5_0, Q5_1: the nibbles (and Q5's fifth bits) of 32 weights.
fn legacy_block(dtype: DType, b: &[u8], out: &mut [f32]) {
    let (d, m, q) = legacy_affine(dtype, b);
    for (o, &q) in out.iter_mut().zip(&q) {
        *o = match m {
            Some(m) => d * q as f32 + m,
            None => d * q as f32,
        };
    }
}

/// A Q4_0, Q4_1, Q5_0 or Q5_1 block as `w = d·q (+ m)`: its scale, its min (the formats with
/// one) and its 32 signed integers (the symmetric formats' middle of range already
/// subtracted). The decoder above and the input-major copies share it.
pub fn legacy_affine(dtype: DType, b: &[u8]) -> (f32, Option<f32>, [i8; 32]) {
    let d = f16_at(b, 0);
    let (m, qh, qs) = match dtype {
        DType::Q4_0 => (None, None, &b[2..18]),
        DType::Q4_1 => (Some(f16_at(b, 2)), None, &b[4..20]),
        DType::Q5_0 => (None, Some(u32_at(b, 2)), &b[6..22]),
        _ => (Some(f16_at(b, 2)), Some(u32_at(b, 4)), &b[8..24]),
    };
    // The symmetric formats subtract the middle of their range.
    let bias = match (m, qh) {
        (Some(_), _) => 0,
        (None, None) => 8,
        (None, Some(_)) => 16,
    };
    let mut q = [0i8; 32];
    for (j, v) in q.iter_mut().enumerate() {
        let nib = if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 };
        let high = qh.map_or(0, |h| ((h >> j) & 1) << 4) as i32;
        *v = ((nib as i32 | high) - bias) as i8;
    }
    (d, m, q)
}

/// The little-endian u32 at byte `at`.
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The value table of a table format.
pub const fn table_values(dtype: DType) -> &'static [i8; 16] {
    match dtype {
        DType::MXFP4 => &MXFP4_VALUES,
        _ => &IQ4NL_VALUES,
    }
}

/// An E8M0 exponent byte as half its OCP scale: 2^(e − 128) (ggml's `GGML_E8M0_TO_FP32_HALF`:
/// e = 0 and 1 give the subnormals 2^−128 and 2^−127; every byte is finite).
#[inline]
pub const fn e8m0_half(e: u8) -> f32 {
    let bits = match e {
        0 | 1 => 0x0020_0000u32 << e,
        _ => (e as u32 - 1) << 23,
    };
    f32::from_bits(bits)
}

/// The 6-bit scale of IQ4_XS sub-block `s` (0..8, before the −32) from the block's u16
/// `scales_h` (bytes 2..4) and 4 bytes `scales_l` (bytes 4..8).
#[inline]
pub fn iq4xs_scale(b: &[u8], s: usize) -> u8 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + s / 2] >> (4 * (s % 2))) & 15;
    low | (((high >> (2 * s)) & 3) as u8) << 4
}

/// Split a decoded-format block ([`DType::is_decoded`]) into its per-32 scales `d` (one for
/// IQ4_NL and MXFP4; eight for IQ4_XS: d·(scale − 32) in f32, as ggml computes it; the block's
/// d eight times for the ternary formats; the lattice formats' sub-block scales, see
/// `crate::dequantize_iq3` and `crate::dequantize_iq1`) and its int8 values `q` (the first
/// `dtype.block_size()` of them: table values, the trits −1, 0, 1 (and TQ2_0's 2), or the
/// lattice formats' signed codebook values).
pub fn unpack_table(dtype: DType, b: &[u8], d: &mut [f32; 8], q: &mut [i8; 256]) {
    match dtype {
        DType::TQ1_0 | DType::TQ2_0 => return unpack_ternary(dtype, b, d, q),
        DType::IQ3_XXS => return crate::dequantize_iq3::unpack_iq3xxs(b, d, q),
        DType::IQ3_S => return crate::dequantize_iq3::unpack_iq3s(b, d, q),
        DType::IQ1_S => return crate::dequantize_iq1::unpack_iq1s(b, d, q),
        DType::IQ1_M => unreachable!("IQ1_M's scales are per 16 weights: unpack_k"),
        _ => {}
    }
    let values = table_values(dtype);
    let (sub, qs) = match dtype {
        DType::IQ4_NL => {
            d[0] = f16_at(b, 0);
            (1, &b[2..18])
        }
        DType::MXFP4 => {
            d[0] = e8m0_half(b[0]);
            (1, &b[1..17])
        }
        DType::IQ4_XS => {
            let dd = f16_at(b, 0);
            for (s, ds) in d.iter_mut().enumerate() {
                *ds = dd * (iq4xs_scale(b, s) as i32 - 32) as f32;
            }
            (8, &b[8..136])
        }
        _ => unreachable!("{dtype} is not a table format"),
    };
    for s in 0..sub {
        let idx = &qs[16 * s..16 * s + 16];
        for j in 0..16 {
            q[32 * s + j] = values[(idx[j] & 15) as usize];
            q[32 * s + j + 16] = values[(idx[j] >> 4) as usize];
        }
    }
}

/// [`unpack_table`] for the ternary formats (layouts in [`crate::dtype`]).
fn unpack_ternary(dtype: DType, b: &[u8], d: &mut [f32; 8], q: &mut [i8; 256]) {
    if dtype == DType::TQ2_0 {
        d.fill(f16_at(b, 64));
        for (i, qi) in q.iter_mut().enumerate() {
            let (j, l, m) = (i / 128, i / 32 % 4, i % 32);
            *qi = ((b[32 * j + m] >> (2 * l)) & 3) as i8 - 1;
        }
        return;
    }
    d.fill(f16_at(b, 52));
    for (i, qi) in q.iter_mut().enumerate() {
        let (byte, n) = match i {
            0..160 => (b[i % 32], i / 32),
            160..240 => (b[32 + (i - 160) % 16], (i - 160) / 16),
            _ => (b[48 + (i - 240) % 4], (i - 240) / 4),
        };
        *qi = tq1_trit(byte, n);
    }
}

/// Trit `n` (0..5) of a TQ1_0 byte, as −1, 0 or 1: the byte is a base-3 fraction of 256, and
/// multiplying by 3^n (mod 256) brings trit n to the top, where ·3 >> 8 reads it (ggml's way).
#[inline]
pub fn tq1_trit(byte: u8, n: usize) -> i8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let v = byte.wrapping_mul(POW3[n]);
    ((v as u16 * 3) >> 8) as i8 - 1
}

/// Scale and min of sub-block `s` of a Q4_K/Q5_K block's 12 packed bytes (6 bits each).
#[inline]
pub fn k4_scale_min(s: usize, sm: &[u8]) -> (u8, u8) {
    if s < 4 {
        (sm[s] & 63, sm[s + 4] & 63)
    } else {
        (
            (sm[s + 4] & 15) | ((sm[s - 4] >> 6) << 4),
            (sm[s + 4] >> 4) | ((sm[s] >> 6) << 4),
        )
    }
}

/// The 6-bit scale s (0..16, before the −32) of a Q3_K block's 12 packed bytes.
#[inline]
pub fn k3_scale(s: usize, sc: &[u8]) -> u8 {
    let low = if s < 8 { sc[s] & 15 } else { sc[s - 8] >> 4 };
    let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    low | (high << 4)
}

/// Split a K-quant block into its sub-block scales and its 256 signed integer quants (Q3_K's
/// −4 and Q6_K's −32 already applied); IQ1_M's block (16 scales, no mins) likewise.
pub fn unpack_k(dtype: DType, b: &[u8], sub: &mut SubScales, q: &mut [i8; 256]) {
    match dtype {
        DType::IQ1_M => crate::dequantize_iq1::unpack_iq1m(b, sub, q),
        DType::Q2_K => {
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            sub.n = 16;
            for (s, &sc) in b[..16].iter().enumerate() {
                sub.d[s] = d * (sc & 15) as f32;
                sub.m[s] = dmin * (sc >> 4) as f32;
            }
            for (i, qi) in q.iter_mut().enumerate() {
                let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
                *qi = ((b[16 + 32 * n + l] >> (2 * j)) & 3) as i8;
            }
        }
        DType::Q3_K => {
            let d = f16_at(b, 108);
            sub.n = 16;
            for s in 0..16 {
                sub.d[s] = d * (k3_scale(s, &b[96..108]) as i32 - 32) as f32;
                sub.m[s] = 0.0;
            }
            for (i, qi) in q.iter_mut().enumerate() {
                let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
                let low = ((b[32 + 32 * n + l] >> (2 * j)) & 3) as i8;
                let high = (b[l] >> (4 * n + j)) & 1;
                *qi = if high == 0 { low - 4 } else { low };
            }
        }
        DType::Q4_K | DType::Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            sub.n = 8;
            for s in 0..8 {
                let (sc, m) = k4_scale_min(s, &b[4..16]);
                sub.d[s] = d * sc as f32;
                sub.m[s] = dmin * m as f32;
            }
            let five = dtype == DType::Q5_K;
            let qs = if five { &b[48..176] } else { &b[16..144] };
            for (i, qi) in q.iter_mut().enumerate() {
                let (c, h, l) = (i / 64, i % 64 / 32, i % 32);
                let byte = qs[32 * c + l];
                let nib = if h == 0 { byte & 15 } else { byte >> 4 };
                let high = if five {
                    ((b[16 + l] >> (i / 32)) & 1) << 4
                } else {
                    0
                };
                *qi = (nib | high) as i8;
            }
        }
        DType::Q6_K => {
            let d = f16_at(b, 208);
            sub.n = 16;
            for s in 0..16 {
                sub.d[s] = d * (b[192 + s] as i8) as f32;
                sub.m[s] = 0.0;
            }
            for (i, qi) in q.iter_mut().enumerate() {
                let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
                let byte = b[64 * n + 32 * (k % 2) + l];
                let low = if k < 2 { byte & 15 } else { byte >> 4 };
                let high = (b[128 + 32 * n + l] >> (2 * k)) & 3;
                *qi = (low | (high << 4)) as i8 - 32;
            }
        }
        _ => unreachable!("{dtype} is not a K-quant"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q5_0_fifth_bit_comes_from_qh() {
        let mut b = h(0.5).to_vec();
        // Bits 3 (weight 3) and 20 (weight 20) set.
        b.extend((1u32 << 3 | 1 << 20).to_le_bytes());
        b.extend([0x21u8; 16]); // low nibble 1, high nibble 2
        let mut out = [0f32; 32];
        dequantize_row(DType::Q5_0, &b, &mut out).unwrap();
        assert_eq!(out[0], 0.5 * (1.0 - 16.0));
        assert_eq!(out[3], 0.5 * (17.0 - 16.0));
        assert_eq!(out[16], 0.5 * (2.0 - 16.0));
        assert_eq!(out[20], 0.5 * (18.0 - 16.0));
    }

    #[test]
    fn q6_k_layout() {
        let mut b = vec![0u8; 210];
        b[5] = 0x9a; // ql: weight 5 low nibble 10 (k = 0), weight 69 high nibble 9 (k = 2)
        b[128 + 5] = 0b11_00_10_01; // qh: weight 5 high bits 1, weight 69 high bits 0
        b[192] = 3; // scale of weights 0..16
        b[192 + 4] = (-2i8) as u8; // scale of weights 64..80
        b[208..].copy_from_slice(&h(0.25));
        let mut out = [0f32; 256];
        dequantize_row(DType::Q6_K, &b, &mut out).unwrap();
        assert_eq!(out[5], 0.25 * 3.0 * ((10 + 16) as f32 - 32.0));
        assert_eq!(out[69], 0.25 * -2.0 * (9.0 - 32.0));
        // Weight 101 (k = 3) takes qh bits 6..8 = 3.
        assert_eq!(out[101], 0.0); // its scale (sub-block 6) is 0
    }

    #[test]
    fn k4_scales_unpack_both_halves() {
        let sm = [1, 2, 3, 0xc4, 5, 6, 7, 0x48, 0x9a, 0, 0, 0xf1];
        assert_eq!(k4_scale_min(3, &sm), (4, 8));
        // s = 7: scale = (sm[11] & 15) | (sm[3] >> 6) << 4 = 1 | 3 << 4; min = 15 | 1 << 4.
        assert_eq!(k4_scale_min(7, &sm), (49, 31));
        assert_eq!(k4_scale_min(4, &sm), (10, 9));
    }

    #[test]
    fn table_formats_layout() {
        // IQ4_NL: d = 0.5; weight 3 index 0 (−127), weight 19 index 15 (113).
        let mut b = h(0.5).to_vec();
        b.extend([0x88u8; 16]);
        b[2 + 3] = 0xf0;
        let mut out = [0f32; 32];
        dequantize_row(DType::IQ4_NL, &b, &mut out).unwrap();
        assert_eq!(
            (out[0], out[3], out[19]),
            (0.5 * 1.0, 0.5 * -127.0, 0.5 * 113.0)
        );
        // MXFP4: e = 129 gives 2^(129 − 128) = 2; index 7 is 12 (e2m1 6, doubled).
        let mut b = vec![129u8];
        b.extend([0x07u8; 16]);
        dequantize_row(DType::MXFP4, &b, &mut out).unwrap();
        assert_eq!((out[0], out[16]), (24.0, 0.0));
        assert_eq!(e8m0_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        // IQ4_XS: sub-block 5 scale = low nibble of scales_l[2] >> 4 | bits 10..12 of
        // scales_h << 4 = 3 | 2 << 4 = 35, i.e. 3 after the −32.
        let mut b = vec![0u8; 136];
        b[..2].copy_from_slice(&h(0.25));
        b[2..4].copy_from_slice(&(2u16 << 10).to_le_bytes());
        b[6] = 0x30;
        b[8 + 16 * 5] = 0x0f; // weight 160: index 15, weight 176: index 0
        let mut out = [0f32; 256];
        dequantize_row(DType::IQ4_XS, &b, &mut out).unwrap();
        assert_eq!(out[160], 0.25 * 3.0 * 113.0);
        assert_eq!(out[176], 0.25 * 3.0 * -127.0);
        assert_eq!(out[0], 0.25 * -32.0 * -127.0);
    }

    #[test]
    fn ternary_layout() {
        // TQ2_0: d = 0.5 at byte 64; weight 128 + 32·2 + 5 = 197 is bits 4..6 of qs[37].
        let mut b = vec![0x55u8; 66]; // every 2-bit field 1: weight 0
        b[64..].copy_from_slice(&h(0.5));
        b[37] = 0x55 & !0x30 | 0x30; // field 2 of byte 37 = 3: weight 2
        b[3] = 0x54; // field 0 of byte 3 = 0: weight −1
        let mut out = [0f32; 256];
        dequantize_row(DType::TQ2_0, &b, &mut out).unwrap();
        assert_eq!((out[197], out[3], out[35], out[0]), (1.0, -0.5, 0.0, 0.0));
        // TQ1_0: trit n of a byte is ((byte·3^n mod 256)·3) >> 8, then − 1: 0x80 reads 1 at
        // every n (all 0 after the − 1), 255 reads 2 first, 0 reads 0 everywhere.
        assert_eq!(
            (0..5).map(|n| tq1_trit(0x80, n)).collect::<Vec<_>>(),
            [0; 5]
        );
        assert_eq!(tq1_trit(255, 0), 1);
        assert_eq!(tq1_trit(0, 3), -1);
        let mut b = vec![0u8; 54];
        b[52..].copy_from_slice(&h(2.0));
        b[7] = 255; // weight 7 (trit 0 of qs[7]) = 1
        b[32 + 3] = 255; // weight 160 + 3 = 1
        b[48 + 1] = 255; // weight 241 = 1
        dequantize_row(DType::TQ1_0, &b, &mut out).unwrap();
        assert_eq!((out[7], out[163], out[241], out[0]), (2.0, 2.0, 2.0, -2.0));
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let mut out = [0f32; 256];
        assert!(dequantize_row(DType::Q4_K, &[0u8; 143], &mut out).is_err());
        assert!(dequantize_row(DType::Q6_K, &[0u8; 210], &mut out[..255]).is_err());
    }
}
