//! Decoding the 2-bit lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S; layouts in [`crate::dtype`])
//! into int8 values and f32 scales: each point of 8 weights is a codebook entry of
//! [`crate::lattice_grids`] (values 8, 25, 43) with its signs applied, so a block is 256 signed
//! bytes (|q| ≤ 43) and a scale per 16 weights, db = d·(0.5 + ls)·0.25 in ggml's order of f32
//! operations. w = db·q is then ggml's (and gguf-py's) dequantized value bit for bit (ggml
//! computes db·grid·(±1), and the sign is exact).
//!
//! There is no encoder: [`crate::quantize::quantize_row`] refuses these formats (their
//! quantizers search the lattice under an importance matrix; files come from llama.cpp).

use crate::dtype::DType;
use crate::lattice_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS};

/// A sub-block's scale from its 4-bit `ls` and the block's `d`, as ggml computes it.
#[inline]
pub fn iq2_scale(d: f32, ls: u8) -> f32 {
    d * (0.5 + ls as f32) * 0.25
}

/// Point `p` (0..32: weights 8p..8p + 8) of an IQ2 block: its grid entry, its sign byte (bit j
/// set: weight j negated) and its 4-bit scale `ls`.
#[inline]
pub fn iq2_point(dtype: DType, b: &[u8], p: usize) -> (&'static [i8; 8], u8, u8) {
    let (s, l) = (p / 4, p % 4);
    match dtype {
        DType::IQ2_XXS => {
            let at = 2 + 8 * s;
            let aux = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
            let signs = KSIGNS[(aux >> (7 * l)) as usize & 127];
            (&IQ2XXS_GRID[b[at + l] as usize], signs, (aux >> 28) as u8)
        }
        DType::IQ2_XS => {
            let v = u16::from_le_bytes([b[2 + 2 * p], b[3 + 2 * p]]);
            let ls = (b[66 + s] >> (4 * (l / 2))) & 15;
            (
                &IQ2XS_GRID[(v & 511) as usize],
                KSIGNS[(v >> 9) as usize],
                ls,
            )
        }
        DType::IQ2_S => {
            let high = ((b[66 + s] as usize) << (8 - 2 * l)) & 0x300;
            let ls = (b[74 + s] >> (4 * (l / 2))) & 15;
            (&IQ2S_GRID[b[2 + p] as usize | high], b[34 + p], ls)
        }
        _ => unreachable!("{dtype} is not a 2-bit lattice format"),
    }
}

/// The 8 signed values of a grid entry under its sign byte.
#[inline]
pub fn signed_point(grid: &[i8; 8], signs: u8) -> [i8; 8] {
    std::array::from_fn(|j| match signs >> j & 1 {
        1 => -grid[j],
        _ => grid[j],
    })
}

/// Split an IQ2 block into its per-16 scales `d` (weights 16h..16h + 16 have d[h]; IQ2_XXS's
/// halves of a sub-block share one) and its 256 signed values `q`.
pub fn unpack_iq2(dtype: DType, b: &[u8], d: &mut [f32; 16], q: &mut [i8; 256]) {
    let dd = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    for p in 0..32 {
        let (grid, signs, ls) = iq2_point(dtype, b, p);
        q[8 * p..8 * p + 8].copy_from_slice(&signed_point(grid, signs));
        d[p / 2] = iq2_scale(dd, ls);
    }
}

/// Decode one IQ2 block into its 256 weights.
pub fn dequantize_iq2_block(dtype: DType, b: &[u8], out: &mut [f32]) {
    let (mut d, mut q) = ([0f32; 16], [0i8; 256]);
    unpack_iq2(dtype, b, &mut d, &mut q);
    for (i, (o, &qi)) in out.iter_mut().zip(&q).enumerate() {
        *o = d[i / 16] * qi as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequantize_row;
    use half::f16;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    /// Hand-built blocks: one point and one scale set, the rest of the block zero bytes.
    #[test]
    fn layouts() {
        let mut out = [0f32; 256];
        // IQ2_XXS sub-block 1: point 5 (= 4 + 1) takes grid 7, sign index 3 (KSIGNS[3] = 3:
        // weights 0 and 1 negated), ls = 2: db = 2·2.5·0.25 = 1.25.
        let mut b = vec![0u8; 66];
        b[..2].copy_from_slice(&h(2.0));
        b[2 + 8 + 1] = 7;
        let aux: u32 = (3 << 7) | (2 << 28);
        b[2 + 8 + 4..2 + 8 + 8].copy_from_slice(&aux.to_le_bytes());
        dequantize_row(DType::IQ2_XXS, &b, &mut out).unwrap();
        let g = IQ2XXS_GRID[7];
        assert_eq!(out[40], -1.25 * g[0] as f32);
        assert_eq!(out[41], -1.25 * g[1] as f32);
        assert_eq!(out[42], 1.25 * g[2] as f32);
        // IQ2_XS point 10 (sub-block 2, second half): index 300, sign index 1 (KSIGNS[1] =
        // 0x81), scale high nibble 3: db = 1·3.5·0.25.
        let mut b = vec![0u8; 74];
        b[..2].copy_from_slice(&h(1.0));
        b[2 + 20..2 + 22].copy_from_slice(&(300u16 | 1 << 9).to_le_bytes());
        b[66 + 2] = 0x30;
        dequantize_row(DType::IQ2_XS, &b, &mut out).unwrap();
        let g = IQ2XS_GRID[300];
        assert_eq!(
            (out[80], out[81]),
            (-0.875 * g[0] as f32, 0.875 * g[1] as f32)
        );
        assert_eq!(out[87], -0.875 * g[7] as f32);
        // IQ2_S point 6 (sub-block 1, l = 2): index 0x2_05 (qh[1] bits 4..6 = 2), sign byte
        // 0x04, scale high nibble 0: db = 0.125.
        let mut b = vec![0u8; 82];
        b[..2].copy_from_slice(&h(1.0));
        b[2 + 6] = 5;
        b[34 + 6] = 0x04;
        b[66 + 1] = 2 << 4;
        dequantize_row(DType::IQ2_S, &b, &mut out).unwrap();
        let g = IQ2S_GRID[0x205];
        assert_eq!(
            (out[48], out[50]),
            (0.125 * g[0] as f32, -0.125 * g[2] as f32)
        );
    }
}
