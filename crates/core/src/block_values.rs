//! Leaf values and fields the block decoders share ([`crate::dequantize`] and the format
//! modules beside it: `dequantize_iq1`, `dequantize_iq3`, `lowbit`): an f16 field, the table
//! formats' values, a K-quant super-block's sub-block scales. Imports nothing of the crate's
//! decoders, so each of them may take these without a circle.

use half::f16;

/// The little-endian f16 at byte `at`, as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// IQ4_NL's (and IQ4_XS's) 16 non-linear values (ggml's `kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's 16 values: the e2m1 numbers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)
/// doubled to integers (ggml's `kvalues_mxfp4`); [`crate::dequantize::e8m0_half`] halves the scale to match.
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// A K-quant super-block's sub-blocks: `n` (16 or 8) of them, sub-block s standing for
/// w = d[s]·q − m[s] (d[s] = d·scale, m[s] = dmin·min, both computed in f32 as ggml does).
#[derive(Clone, Copy, Debug)]
pub struct SubScales {
    pub n: usize,
    pub d: [f32; 16],
    pub m: [f32; 16],
}

impl Default for SubScales {
    fn default() -> Self {
        SubScales {
            n: 16,
            d: [0.0; 16],
            m: [0.0; 16],
        }
    }
}
