//! Unpacking the 3-bit lattice i-quants IQ3_XXS and IQ3_S (layouts in [`crate::dtype`]) into
//! int8 values with a scale per 32 weights, as [`crate::dequantize::unpack_table`] hands them
//! out: each weight is a codebook value (IQ3_XXS 4..62, IQ3_S odd 1..15) with its sign, and
//! each 32-weight sub-block's scale is computed in f32 in ggml's order of operations, so
//! `scale·value` is ggml's dequantized weight bit for bit (one rounding either way: ggml's
//! `db·grid·(±1)` negates an already rounded product).

use crate::block_values::f16_at;
use crate::lattice_grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS};

/// Eight weights from two 4-weight codebook points, weight j negated where bit j of `signs`
/// is set.
#[inline]
fn signed8(a: &[i8; 4], b: &[i8; 4], signs: u8, out: &mut [i8]) {
    for (j, o) in out[..8].iter_mut().enumerate() {
        let v = if j < 4 { a[j] } else { b[j - 4] };
        *o = if (signs >> j) & 1 == 1 { -v } else { v };
    }
}

/// IQ3_XXS sub-block `s`'s u32 of sign indices and scale.
#[inline]
pub fn iq3xxs_aux(b: &[u8], s: usize) -> u32 {
    let at = 66 + 4 * s;
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ3_XXS's eight sub-block scales d·(0.5 + ls)·0.5, in f32 as ggml computes them.
pub fn iq3xxs_scales(b: &[u8]) -> [f32; 8] {
    let dd = f16_at(b, 0);
    std::array::from_fn(|s| dd * (0.5 + (iq3xxs_aux(b, s) >> 28) as f32) * 0.5)
}

/// IQ3_S's eight sub-block scales d·(1 + 2·sc), in f32 as ggml computes them.
pub fn iq3s_scales(b: &[u8]) -> [f32; 8] {
    let dd = f16_at(b, 0);
    std::array::from_fn(|s| dd * (1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 15) as i32) as f32)
}

/// IQ3_XXS (98 bytes): f16 d, 64 grid indices, then per sub-block a u32 of four 7-bit sign
/// indices (into [`KSIGNS`]) and a 4-bit scale `ls` on top; scale d·(0.5 + ls)·0.5.
pub(crate) fn unpack_iq3xxs(b: &[u8], d: &mut [f32; 8], q: &mut [i8; 256]) {
    *d = iq3xxs_scales(b);
    for s in 0..8 {
        let aux = iq3xxs_aux(b, s);
        for l in 0..4 {
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            let idx = &b[2 + 8 * s + 2 * l..];
            let (g0, g1) = (&IQ3XXS_GRID[idx[0] as usize], &IQ3XXS_GRID[idx[1] as usize]);
            signed8(g0, g1, signs, &mut q[32 * s + 8 * l..]);
        }
    }
}

/// The IQ3_S grid index `k` (0..8) of sub-block `s`: qs[8s + k] and bit k of qh[s] as bit 8.
#[inline]
pub fn iq3s_index(b: &[u8], s: usize, k: usize) -> usize {
    b[2 + 8 * s + k] as usize | (((b[66 + s] >> k) & 1) as usize) << 8
}

/// IQ3_S (110 bytes): f16 d, 64 low index bytes, 8 bytes of ninth index bits, 32 sign bytes
/// (one per 8 weights, bit j weight j), 4 bytes of 4-bit scales `sc` (sub-block s: nibble s % 2
/// of byte s / 2); scale d·(1 + 2·sc).
pub(crate) fn unpack_iq3s(b: &[u8], d: &mut [f32; 8], q: &mut [i8; 256]) {
    *d = iq3s_scales(b);
    for s in 0..8 {
        for l in 0..4 {
            let g0 = &IQ3S_GRID[iq3s_index(b, s, 2 * l)];
            let g1 = &IQ3S_GRID[iq3s_index(b, s, 2 * l + 1)];
            signed8(g0, g1, b[74 + 4 * s + l], &mut q[32 * s + 8 * l..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn iq3_xxs_layout() {
        let mut b = vec![0u8; 98];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // Sub-block 1: scale 3, group 2's sign index 1 (KSIGNS[1] = 0x81: weights 0 and 7).
        let aux: u32 = 3 << 28 | 1 << 14;
        b[70..74].copy_from_slice(&aux.to_le_bytes());
        b[2 + 8 + 4] = 1; // sub-block 1, point 4 (weights 48..52): IQ3XXS_GRID[1]
        let (mut d, mut q) = ([0f32; 8], [0i8; 256]);
        unpack_iq3xxs(&b, &mut d, &mut q);
        assert_eq!(d[1], 0.5 * 3.5 * 0.5);
        assert_eq!(d[0], 0.5 * 0.5 * 0.5);
        assert_eq!(&q[48..52], &[-IQ3XXS_GRID[1][0], IQ3XXS_GRID[1][1], 4, 4]);
        assert_eq!(q[55], -4);
        assert_eq!(q[0], 4);
    }

    #[test]
    fn iq3_s_layout() {
        let mut b = vec![0u8; 110];
        b[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[2 + 8 * 3 + 5] = 9; // sub-block 3, point 5 (weights 116..120)
        b[66 + 3] = 1 << 5; // its ninth bit: index 265
        b[74 + 4 * 3 + 2] = 1 << 1; // weight 96 + 16 + 1 negated
        b[106 + 1] = 0x70; // sub-block 3's scale 7
        let (mut d, mut q) = ([0f32; 8], [0i8; 256]);
        unpack_iq3s(&b, &mut d, &mut q);
        assert_eq!(iq3s_index(&b, 3, 5), 265);
        assert_eq!(d[3], 0.25 * 15.0);
        assert_eq!(d[2], 0.25);
        assert_eq!(&q[116..120], &IQ3S_GRID[265]);
        assert_eq!(q[113], -IQ3S_GRID[0][1]);
    }
}
