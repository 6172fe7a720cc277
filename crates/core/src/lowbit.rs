//! The low-bit formats NVFP4, Q1_0 and Q2_0 ([`DType::LOWBIT`]; layouts in [`crate::dtype`]):
//! their decoding into int8 values with a scale per 16 weights ([`unpack_lowbit`]), which every
//! kernel family and the GPU upload build on, and their f32 decoder in ggml's order of float
//! operations (one product d·value per weight, so the values equal ggml's bit for bit).

use crate::block_values::{f16_at, MXFP4_VALUES};
use crate::dtype::DType;

/// A UE4M3 scale byte as half its value (ggml's `ggml_ue4m3_to_fp32`, which halves it to undo
/// the doubled E2M1 values): 4 exponent bits (bias 7) at bits 3..7, 3 mantissa bits; exponent 0
/// is subnormal (man·2^−9), bytes 0 and 0x7F are 0, and bit 7 is not read. Every value is exact
/// in f32 and finite (at most 240, byte 0xFF).
#[inline]
pub const fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = ((x >> 3) & 15, (x & 7) as u32);
    // man·2^−10 for exponent 0, else (8 + man)·2^(exp − 11): a small integer times a power of
    // two (2^(e) as f32 bits: (e + 127) << 23).
    let (int, e) = match exp {
        0 => (man, -10i32),
        _ => (8 + man, exp as i32 - 11),
    };
    int as f32 * f32::from_bits(((e + 127) as u32) << 23)
}

/// [`ue4m3_half`] of every byte, for the kernels' table lookups.
pub static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue4m3_half(i as u8);
        i += 1;
    }
    t
};

/// Split a low-bit block ([`DType::is_lowbit`]) into its per-16 scales `d` (the first
/// `dtype.block_size() / 16`: NVFP4's four UE4M3 scales as [`ue4m3_half`], Q1_0's and Q2_0's
/// f16 d repeated) and its int8 values `q` (the first `dtype.block_size()`: MXFP4's doubled
/// E2M1 values, ±1, or q − 1 in −1..=2).
pub fn unpack_lowbit(dtype: DType, b: &[u8], d: &mut [f32; 8], q: &mut [i8; 128]) {
    match dtype {
        DType::NVFP4 => {
            for s in 0..4 {
                d[s] = ue4m3_half(b[s]);
                for j in 0..8 {
                    let byte = b[4 + 8 * s + j];
                    q[16 * s + j] = MXFP4_VALUES[(byte & 15) as usize];
                    q[16 * s + j + 8] = MXFP4_VALUES[(byte >> 4) as usize];
                }
            }
        }
        DType::Q1_0 => {
            d.fill(f16_at(b, 0));
            for (j, qj) in q.iter_mut().enumerate() {
                *qj = if (b[2 + j / 8] >> (j % 8)) & 1 == 1 {
                    1
                } else {
                    -1
                };
            }
        }
        DType::Q2_0 => {
            d.fill(f16_at(b, 0));
            for (j, qj) in q.iter_mut().enumerate().take(64) {
                *qj = ((b[2 + j / 4] >> (2 * (j % 4))) & 3) as i8 - 1;
            }
        }
        _ => unreachable!("{dtype} is not a low-bit format"),
    }
}

/// Decode one low-bit block into its `dtype.block_size()` values of `out`: w = d·q.
pub fn dequantize_lowbit(dtype: DType, b: &[u8], out: &mut [f32]) {
    let (mut d, mut q) = ([0f32; 8], [0i8; 128]);
    unpack_lowbit(dtype, b, &mut d, &mut q);
    for (i, o) in out.iter_mut().enumerate().take(dtype.block_size()) {
        *o = d[i / 16] * q[i] as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequantize_row;
    use half::f16;

    /// ggml's definition, written as its C states it (ldexp of the mantissa), for comparison.
    fn ue4m3_ggml(x: u8) -> f32 {
        if x == 0 || x == 0x7F {
            return 0.0;
        }
        let (exp, man) = (((x >> 3) & 15) as i32, (x & 7) as f32);
        let raw = match exp {
            0 => man * 2f32.powi(-9),
            _ => (1.0 + man / 8.0) * 2f32.powi(exp - 7),
        };
        raw * 0.5
    }

    #[test]
    fn ue4m3_matches_ggml_on_every_byte() {
        for x in 0..=255u8 {
            assert_eq!(
                ue4m3_half(x).to_bits(),
                ue4m3_ggml(x).to_bits(),
                "byte {x:#x}"
            );
        }
        assert_eq!((ue4m3_half(0x7E), ue4m3_half(0xFF)), (224.0, 240.0));
        assert_eq!(ue4m3_half(1), 2f32.powi(-10));
        assert!((0..=255u8).all(|x| UE4M3_HALF[x as usize] == ue4m3_half(x)));
    }

    #[test]
    fn lowbit_layouts() {
        let h = |v: f32| f16::from_f32(v).to_le_bytes();
        // NVFP4: scale byte 0x38 (exp 7, man 0: 1, halved 0.5) for sub-block 1; weight 16 + 3 is
        // the low nibble of qs[8 + 3], weight 16 + 11 its high nibble.
        let mut b = vec![0u8; 36];
        b[1] = 0x38;
        b[4 + 8 + 3] = 0x7F; // low nibble 15 (−12), high nibble 7 (12)
        let mut out = [0f32; 64];
        dequantize_row(DType::NVFP4, &b, &mut out).unwrap();
        assert_eq!((out[19], out[27], out[3]), (-6.0, 6.0, 0.0));
        // Q1_0: d = 0.5; bit 3 of qs[2] is weight 19.
        let mut b = h(0.5).to_vec();
        b.extend([0u8; 16]);
        b[2 + 2] = 1 << 3;
        let mut out = [0f32; 128];
        dequantize_row(DType::Q1_0, &b, &mut out).unwrap();
        assert_eq!((out[19], out[18], out[127]), (0.5, -0.5, -0.5));
        // Q2_0: d = 2; weight 13 is bits 2..4 of qs[3].
        let mut b = h(2.0).to_vec();
        b.extend([0x55u8; 16]); // every code 1: weight 0
        b[2 + 3] = 0x55 & !0x0C | 0x0C; // code 3: 2·d
        b[2] = 0x54; // weight 0 code 0: −d
        let mut out = [0f32; 64];
        dequantize_row(DType::Q2_0, &b, &mut out).unwrap();
        assert_eq!((out[13], out[0], out[1]), (4.0, -2.0, 0.0));
    }
}
