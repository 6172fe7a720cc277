//! Unpacking the 1-bit lattice i-quants (layouts in [`crate::dtype`]) into int8 values: IQ1_S
//! with a scale per 32 weights, as [`crate::dequantize::unpack_table`] hands them out; IQ1_M
//! with a scale per 16, as [`crate::dequantize::unpack_k`] hands out a K-quant's (no mins).
//!
//! ggml's weight is dl·(g + δ), g in {−1, 0, 1} from the codebook, δ = ±1/8 per 32 weights;
//! here it is (dl / 8)·(8g ± 1): dl / 8 is exact in f32 (a power-of-two division of an f16
//! times an odd integer, far from f32's subnormals) and both products are the same real
//! number rounded once, so `scale·value` equals ggml's weight bit for bit; the values lie in
//! −9..=9.

use crate::block_values::{f16_at, SubScales};
use crate::lattice_grids::IQ1S_GRID;

/// Eight int8 values 8g ± 1 of the codebook point `idx`, `delta` the ±1.
#[inline]
pub fn iq1_point(idx: usize, delta: i8, out: &mut [i8]) {
    for (o, &g) in out[..8].iter_mut().zip(&IQ1S_GRID[idx]) {
        *o = 8 * g + delta;
    }
}

/// IQ1_S sub-block `s`'s u16 `qh`.
#[inline]
pub fn iq1s_qh(b: &[u8], s: usize) -> u16 {
    u16::from_le_bytes([b[34 + 2 * s], b[35 + 2 * s]])
}

/// IQ1_S's eight sub-block scales dl / 8 = d·(2k + 1) / 8 (dl in f32 as ggml computes it; the
/// division exact).
pub fn iq1s_scales(b: &[u8]) -> [f32; 8] {
    let dd = f16_at(b, 0);
    std::array::from_fn(|s| dd * (2 * ((iq1s_qh(b, s) >> 12) & 7) + 1) as f32 * 0.125)
}

/// IQ1_S (50 bytes): f16 d, 32 low index bytes, then per sub-block s a u16 `qh`: bits 3l..3l+3
/// the high index bits of group l (8 weights), bits 12..15 the scale `k`, bit 15 δ's sign
/// (set: −1/8); dl = d·(2k + 1).
pub(crate) fn unpack_iq1s(b: &[u8], d: &mut [f32; 8], q: &mut [i8; 256]) {
    *d = iq1s_scales(b);
    for s in 0..8 {
        let qh = iq1s_qh(b, s) as usize;
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        for l in 0..4 {
            let idx = b[2 + 4 * s + l] as usize | ((qh >> (3 * l)) & 7) << 8;
            iq1_point(idx, delta, &mut q[32 * s + 8 * l..]);
        }
    }
}

/// IQ1_M's f16 d, spread over the top nibbles of its four u16 scale words (bytes 48..56):
/// word i's bits 12..16 are bits 4i..4i + 4 of d.
pub fn iq1m_d(b: &[u8]) -> f32 {
    let bits = (0..4).fold(0u16, |bits, i| {
        let w = u16::from_le_bytes([b[48 + 2 * i], b[49 + 2 * i]]);
        bits | (w >> 12) << (4 * i)
    });
    half::f16::from_bits(bits).to_f32()
}

/// IQ1_M's sixteen half-sub-block scales dl / 8: half h = 2s + j of sub-block s has
/// dl = d·(2k + 1), k = bits 6(s % 2) + 3j.. + 3 of scale word s / 2 (dl in f32 as ggml
/// computes it; the division exact).
pub fn iq1m_scales(b: &[u8]) -> [f32; 16] {
    let d = iq1m_d(b);
    std::array::from_fn(|h| {
        let (s, j) = (h / 2, h % 2);
        let w = u16::from_le_bytes([b[48 + s / 2 * 2], b[49 + s / 2 * 2]]);
        let k = (w >> (6 * (s % 2) + 3 * j)) & 7;
        d * (2 * k + 1) as f32 * 0.125
    })
}

/// IQ1_M (56 bytes): 32 bytes `qs` (low 8 bits of the indices, 8 weights each), 16 bytes `qh`
/// (group l of sub-block s: nibble l % 2 of qh[2s + l / 2], its bits 0..3 the index's high
/// bits, bit 3 the sign of δ: set −1/8), 8 bytes of scales (see [`iq1m_scales`], [`iq1m_d`]).
pub(crate) fn unpack_iq1m(b: &[u8], sub: &mut SubScales, q: &mut [i8; 256]) {
    sub.n = 16;
    sub.d = iq1m_scales(b);
    sub.m = [0.0; 16];
    for s in 0..8 {
        for l in 0..4 {
            let nib = (b[32 + 2 * s + l / 2] >> (4 * (l % 2))) as usize & 15;
            let idx = b[4 * s + l] as usize | (nib & 7) << 8;
            let delta = if nib & 8 != 0 { -1 } else { 1 };
            iq1_point(idx, delta, &mut q[32 * s + 8 * l..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn iq1_s_layout() {
        let mut b = vec![0u8; 50];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[2 + 4 * 2 + 3] = 0x07; // sub-block 2, group 3: low byte 7
        let qh: u16 = 0x8000 | 5 << 12 | 2 << 9; // δ = −1/8, k = 5, group 3's high bits 2
        b[34 + 4..36 + 4].copy_from_slice(&qh.to_le_bytes());
        let (mut d, mut q) = ([0f32; 8], [0i8; 256]);
        unpack_iq1s(&b, &mut d, &mut q);
        assert_eq!(d[2], 0.5 * 11.0 / 8.0);
        assert_eq!(d[0], 0.5 / 8.0);
        let want: Vec<i8> = IQ1S_GRID[0x207].iter().map(|&g| 8 * g - 1).collect();
        assert_eq!(&q[64 + 24..64 + 32], &want[..]);
        assert_eq!(q[0], 8 * IQ1S_GRID[0][0] + 1);
    }

    #[test]
    fn iq1_m_layout() {
        let mut b = vec![0u8; 56];
        // d = 0.5 (f16 0x3800) spread: nibbles 0, 0, 8, 3 on top of words 0..4.
        for (i, nib) in [0u16, 0, 8, 3].into_iter().enumerate() {
            let w: u16 = nib << 12 | if i == 1 { 5 << 6 } else { 0 };
            b[48 + 2 * i..50 + 2 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[4 * 3 + 1] = 0x05; // sub-block 3, group 1: low byte 5
        b[32 + 6] = 0xb0; // its nibble: high bits 3, δ = −1/8
        let mut sub = SubScales::default();
        let mut q = [0i8; 256];
        unpack_iq1m(&b, &mut sub, &mut q);
        assert_eq!(iq1m_d(&b), 0.5);
        // Word 1 holds sub-blocks 2, 3: bits 6..9 are sub-block 3's first half (k = 5).
        assert_eq!(sub.d[6], 0.5 * 11.0 / 8.0);
        assert_eq!(sub.d[7], 0.5 / 8.0);
        let want: Vec<i8> = IQ1S_GRID[0x305].iter().map(|&g| 8 * g - 1).collect();
        assert_eq!(&q[96 + 8..96 + 16], &want[..]);
        assert_eq!((sub.n, sub.m[3]), (16, 0.0));
    }
}
