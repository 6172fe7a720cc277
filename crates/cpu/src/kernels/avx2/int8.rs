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
//!
//! A format whose decoder gives a block's quants in another order than the weights' (an
//! [`XOrder`]: the low-bit formats' bit fields read by one shift and one mask) is dotted with x
//! in that order: each block's quants permuted alike, with its `dv` and `neg8` lanes for that
//! order, built once per x on the first product that asks ([`X8::view`]).

use super::reduce::hmax;
use crate::reference::x8::X8_MAX;
use std::arch::x86_64::*;
use std::sync::OnceLock;

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
    /// The quants and lanes in each reordering ([`XOrder::Nibbles`], [`XOrder::Crumbs`]),
    /// built on first use.
    ordered: [OnceLock<Ordered>; 2],
}

/// The order in which a format's decoder gives a 32-block's quants: position p of the byte
/// vector holds weight `perm()[p]` of the block. Each 4-byte lane of a dot stays within one
/// 16-weight half, so x's per-half scales still apply lane by lane ([`XOrder::lane_halves`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum XOrder {
    /// Weight order.
    Natural,
    /// NVFP4's nibbles: the 16 low nibbles of a sub-block's bytes (weights 0..8, 16..24), then
    /// their high nibbles (weights 8..16, 24..32).
    Nibbles,
    /// Q2_0's 2-bit fields: position 8i + b holds field i of byte b, weight 4b + i.
    Crumbs,
}

impl XOrder {
    /// Weight of the block at each position.
    pub(super) const fn perm(self) -> [usize; 32] {
        let mut t = [0usize; 32];
        let mut p = 0;
        while p < 32 {
            t[p] = match self {
                XOrder::Natural => p,
                XOrder::Nibbles => match p / 8 {
                    1 => p + 8,
                    2 => p - 8,
                    _ => p,
                },
                XOrder::Crumbs => 4 * (p % 8) + p / 8,
            };
            p += 1;
        }
        t
    }

    /// The half (0 or 1) of the weights in each i32 lane of a block's dot.
    pub(super) const fn lane_halves(self) -> [i32; 8] {
        let perm = self.perm();
        let mut h = [0i32; 8];
        let mut l = 0;
        while l < 8 {
            h[l] = (perm[4 * l] / 16) as i32;
            l += 1;
        }
        h
    }
}

/// An x's quants and per-lane vectors in one [`XOrder`].
struct Ordered {
    q: Vec<i8>,
    dv: Vec<f32>,
    neg8: Vec<i32>,
}

/// What the row kernels read of an x for a format: its quants, `dv` and `neg8` in the format's
/// [`XOrder`], and the order-free sums.
#[derive(Clone, Copy)]
pub(super) struct X8View<'a> {
    pub(super) q: &'a [i8],
    pub(super) dv: &'a [f32],
    pub(super) neg8: &'a [i32],
    pub(super) s: &'a [f32],
    pub(super) s16: &'a [f32],
    blocks: usize,
}

impl X8View<'_> {
    /// Number of 32-blocks.
    pub(super) fn blocks(&self) -> usize {
        self.blocks
    }
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
            ordered: [OnceLock::new(), OnceLock::new()],
        };
        // SAFETY: only reached on the x86 levels, after AVX2/FMA/F16C were detected.
        let finite = unsafe { quantize(x, &mut xq) };
        finite.then_some(xq)
    }

    /// Number of 32-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// This x as the kernels of a format with decoder order `order` read it (the reordered
    /// copy built on the first call for that order).
    pub(super) fn view(&self, order: XOrder) -> X8View<'_> {
        let (q, dv, neg8) = match order {
            XOrder::Natural => (&self.q[..], &self.dv[..], &self.neg8[..]),
            XOrder::Nibbles | XOrder::Crumbs => {
                let o = self.ordered[(order == XOrder::Crumbs) as usize]
                    .get_or_init(|| self.reordered(order));
                (&o.q[..], &o.dv[..], &o.neg8[..])
            }
        };
        X8View {
            q,
            dv,
            neg8,
            s: &self.s,
            s16: &self.s16,
            blocks: self.blocks,
        }
    }

    /// The quants, `dv` and `neg8` of this x in `order`.
    fn reordered(&self, order: XOrder) -> Ordered {
        let (perm, halves) = (order.perm(), order.lane_halves());
        let q: Vec<i8> = self
            .q
            .chunks_exact(32)
            .flat_map(|b| perm.map(|w| b[w]))
            .collect();
        let dv = self
            .dv
            .chunks_exact(8)
            .flat_map(|d| halves.map(|h| d[4 * h as usize]))
            .collect();
        let neg8 = q
            .chunks_exact(4)
            .map(|l| -8 * l.iter().map(|&v| i32::from(v)).sum::<i32>())
            .collect();
        Ordered { q, dv, neg8 }
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

    /// Each order is a permutation of the block whose dot lanes keep to one half, and an x's
    /// view in it holds its quants so permuted, each lane's half scale and its −8·Σq.
    #[test]
    fn reordered_views_are_the_quants_permuted() {
        let mut rng = Rng::new(82);
        let mut x = rng.vec(32 * 5);
        x[40] = -50.0;
        let xq = X8::new(&x).unwrap();
        for order in [XOrder::Natural, XOrder::Nibbles, XOrder::Crumbs] {
            let (perm, halves) = (order.perm(), order.lane_halves());
            let mut seen = perm;
            seen.sort_unstable();
            assert_eq!(seen, std::array::from_fn(|i| i), "{order:?}");
            for (p, &w) in perm.iter().enumerate() {
                assert_eq!(w / 16, halves[p / 4] as usize, "{order:?} position {p}");
            }
            let v = xq.view(order);
            assert_eq!(v.blocks(), 5);
            for b in 0..5 {
                for (p, &w) in perm.iter().enumerate() {
                    assert_eq!(v.q[32 * b + p], xq.q[32 * b + w]);
                }
                for (l, &h) in halves.iter().enumerate() {
                    let half = &xq.q[32 * b + 16 * h as usize..][..16];
                    assert_eq!(v.dv[8 * b + l], xq.dv[8 * b + 4 * h as usize]);
                    let lane: i32 = (0..4).map(|i| i32::from(v.q[32 * b + 4 * l + i])).sum();
                    assert_eq!(v.neg8[8 * b + l], -8 * lane);
                    assert!((0..4).all(|i| half.contains(&v.q[32 * b + 4 * l + i])));
                }
            }
        }
    }
}
