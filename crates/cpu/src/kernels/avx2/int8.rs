//! x quantized once per vector to int8 in blocks of 32 with a scale per 16-value half ([`X8`]):
//! the activations of every quantized product on the x86 levels (see [`super::int8_rows`]). The
//! quantization is `crate::reference::x8` computed with AVX2, bit for bit.
//!
//! Besides the quants and a scale per block, an [`X8`] carries what the weight formats' offsets
//! need, computed once here instead of once per row:
//! - `neg8`: −8 times the sums of each 4 consecutive quants, in the lane order of a byte dot
//!   product over a block (lane j: quants 4j..4j + 4). A format whose quants are stored with a
//!   bias (Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32) starts its integer dot from it (shifted),
//!   so the bias is taken exactly, in integers.
//! - `dv`: each block's two scales in the lanes of its dot (lanes 0..4: the first half's).
//! - `s` and `s16`: Σ d·q per 32-block and per 16-value half, for the formats with stored mins
//!   (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): the min times the sum of the very x̂ the quants are dotted
//!   with.
//! - `dh`: each chunk's sixteen half scales in the lane order of a super-block's reduced dots
//!   ([`super::lattice_x8`]: a 256-weight super-block's eight block dots summed per half by
//!   `vphaddd`, so one conversion and one FMA take each half's integer sum).

use super::reduce::hmax;
use crate::reference::x8::X8_MAX;
use std::arch::x86_64::*;

/// Blocks per chunk: the per-block vectors are zero-padded to whole chunks, so eight lanes from
/// a chunk's start can always be loaded.
pub(super) const CHUNK: usize = 8;

/// x as int8 in blocks of 32 (see the module docs).
pub(crate) struct X8 {
    /// The quants, 32 per block.
    pub(super) q: Vec<i8>,
    /// Per block, eight lanes: the scale d of its first half (x̂ = d·q) in lanes 0..4, of its
    /// second half in lanes 4..8.
    pub(super) dv: Vec<f32>,
    /// Per block: Σ d·q (the halves' sums added); padded to whole chunks with zeros.
    pub(super) s: Vec<f32>,
    /// Per 16-value half-block: d·Σq over the half; padded to 16 per chunk.
    pub(super) s16: Vec<f32>,
    /// Per block, eight lanes: −8·(q[4j] + … + q[4j + 3]) in lane j.
    pub(super) neg8: Vec<i32>,
    /// Per chunk, sixteen lanes: block k's half h scale at lane 8·(k / 4) + 4·h + k % 4 (the
    /// order of [`super::lattice_x8`]'s reduced dots); padded to whole chunks with zeros.
    pub(super) dh: Vec<f32>,
    /// Number of 32-blocks.
    blocks: usize,
}

impl X8 {
    /// Quantize `x` (its length a multiple of 32); `None` when x holds a NaN or an infinity
    /// (the f32 path then carries it into the result faithfully).
    pub(crate) fn new(x: &[f32]) -> Option<X8> {
        crate::simd::debug_check_level();
        debug_assert!(x.len().is_multiple_of(32));
        let blocks = x.len() / 32;
        let padded = blocks.next_multiple_of(CHUNK);
        let mut xq = X8 {
            q: vec![0; blocks * 32],
            dv: vec![0.0; blocks * 8],
            s: vec![0.0; padded],
            s16: vec![0.0; 2 * padded],
            neg8: vec![0; blocks * 8],
            dh: vec![0.0; 2 * padded],
            blocks,
        };
        // SAFETY: only reached on the x86 levels, after AVX2/FMA/F16C were detected.
        let finite = unsafe { quantize(x, &mut xq) };
        finite.then_some(xq)
    }

    /// Number of 32-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }
}

/// Fill `xq` from `x`; false when a block is not finite.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; `x.len() == 32 * xq.blocks`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize(x: &[f32], xq: &mut X8) -> bool {
    let sign = _mm256_set1_ps(-0.0);
    let ones = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    // packs interleaves 128-bit lanes: this puts the 32 bytes back in x order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..xq.blocks {
        // SAFETY: block b's 32 values are in x (four unaligned loads); its 32 quants and eight
        // lanes are in q and neg8 (unaligned stores); d, s, s16 and dh hold block b (padded).
        unsafe {
            let xb = x.as_ptr().add(32 * b);
            let v = [0, 8, 16, 24].map(|k| _mm256_loadu_ps(xb.add(k)));
            let abs = v.map(|vk| _mm256_andnot_ps(sign, vk));
            let amax = [
                hmax(_mm256_max_ps(abs[0], abs[1])),
                hmax(_mm256_max_ps(abs[2], abs[3])),
            ];
            // max_ps drops a NaN in its second operand: test the values themselves.
            let bad = v.iter().fold(_mm256_setzero_ps(), |m, &vk| {
                _mm256_or_ps(m, _mm256_cmp_ps::<_CMP_UNORD_Q>(vk, vk))
            });
            if !amax.iter().all(|a| a.is_finite()) || _mm256_movemask_ps(bad) != 0 {
                return false;
            }
            let inv = amax.map(|a| match X8_MAX / a {
                inv if a > 0.0 && inv.is_finite() => _mm256_set1_ps(inv),
                _ => _mm256_setzero_ps(),
            });
            // Round to nearest even (the default MXCSR mode), as `round_ties_even`.
            let i: [__m256i; 4] =
                std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv[k / 2])));
            let w = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let q = _mm256_permutevar8x32_epi32(w, order);
            _mm256_storeu_si256(xq.q.as_mut_ptr().add(32 * b).cast(), q);
            // Sums of 4 quants per lane (exact: |sum| <= 508), then −8 times them.
            let sum4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, q), ones16);
            let neg8 = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<3>(sum4));
            _mm256_storeu_si256(xq.neg8.as_mut_ptr().add(8 * b).cast(), neg8);
            let mut l = [0i32; 8];
            _mm256_storeu_si256(l.as_mut_ptr().cast(), sum4);
            let (h0, h1) = (l[..4].iter().sum::<i32>(), l[4..].iter().sum::<i32>());
            let d = amax.map(|a| a / X8_MAX);
            let dv = _mm256_setr_ps(d[0], d[0], d[0], d[0], d[1], d[1], d[1], d[1]);
            _mm256_storeu_ps(xq.dv.as_mut_ptr().add(8 * b), dv);
            let (s0, s1) = (d[0] * h0 as f32, d[1] * h1 as f32);
            *xq.s.get_unchecked_mut(b) = s0 + s1;
            *xq.s16.get_unchecked_mut(2 * b) = s0;
            *xq.s16.get_unchecked_mut(2 * b + 1) = s1;
            let at = 16 * (b / CHUNK) + 8 * (b % CHUNK / 4) + b % 4;
            *xq.dh.get_unchecked_mut(at) = d[0];
            *xq.dh.get_unchecked_mut(at + 4) = d[1];
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::x8::quantize_x8;
    use crate::testutil::Rng;

    /// The SIMD quantizer is the reference's, bit for bit, with its sums: random blocks,
    /// outliers, zeros, tiny and huge values, exact ties.
    #[test]
    fn matches_the_reference_quantizer() {
        let mut rng = Rng::new(81);
        let mut cases: Vec<Vec<f32>> = (1..=11).map(|b| rng.vec(32 * b)).collect();
        let mut outliers = rng.vec(96);
        outliers[5] = 300.0;
        outliers[70] = -1e4;
        cases.push(outliers);
        cases.push(vec![0.0; 64]);
        cases.push(vec![1e-39; 32]);
        cases.push((0..32).map(|i| (i as f32 - 15.5) * 2e35).collect());
        // x·127/max|x| lands on k + 0.5 for these: ties go to even.
        cases.push(
            (0..32)
                .map(|i| if i == 0 { 127.0 } else { i as f32 + 0.5 })
                .collect(),
        );
        for x in cases {
            let xq = X8::new(&x).unwrap();
            let (q, d) = quantize_x8(&x).unwrap();
            assert_eq!(xq.q, q);
            for (b, qb) in q.chunks_exact(32).enumerate() {
                let dv = &xq.dv[8 * b..8 * b + 8];
                assert!(dv[..4].iter().all(|&v| v == d[2 * b]));
                assert!(dv[4..].iter().all(|&v| v == d[2 * b + 1]));
                let sum = |r: std::ops::Range<usize>| qb[r].iter().map(|&v| v as i32).sum::<i32>();
                let (s0, s1) = (
                    d[2 * b] * sum(0..16) as f32,
                    d[2 * b + 1] * sum(16..32) as f32,
                );
                assert_eq!(xq.s[b], s0 + s1);
                assert_eq!(xq.s16[2 * b], s0);
                assert_eq!(xq.s16[2 * b + 1], s1);
                for j in 0..8 {
                    assert_eq!(xq.neg8[8 * b + j], -8 * sum(4 * j..4 * j + 4));
                }
                let at = 16 * (b / 8) + 8 * (b % 8 / 4) + b % 4;
                assert_eq!([xq.dh[at], xq.dh[at + 4]], [d[2 * b], d[2 * b + 1]]);
            }
        }
        let mut bad = vec![1.0f32; 64];
        bad[33] = f32::NAN;
        assert!(X8::new(&bad).is_none());
        bad[33] = f32::NEG_INFINITY;
        assert!(X8::new(&bad).is_none());
    }
}
