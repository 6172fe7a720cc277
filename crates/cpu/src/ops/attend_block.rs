//! Attention of a block of consecutive queries of one head (prompt prefill), as two small
//! matrix products instead of one dot per (query, position):
//!
//! 1. the head's keys over the block's positions are transposed once (position-major becomes
//!    dimension-major, zero-padded to whole 16-position vectors), so scores S = Q·Kᵀ·scale come
//!    out sixteen positions per vector with no horizontal sums, every key vector loaded once per
//!    four queries;
//! 2. each query's row of S is masked to its own positions (causal, and the sliding window
//!    where one is set), soft-capped where set, and turned into e^(s − max) with its sum;
//! 3. out = P·V / sum, four queries by 64 values in registers while the value rows stream by.
//!
//! [`attend_head`](super::attend::attend_head) per query does the same arithmetic one query at a
//! time: each query re-reads every key and value of the head, and each score pays a horizontal
//! sum. The block form is taken where [`block_attention_is_fast`] (the AVX-512 level); on the
//! other levels the portable kernels of this op exist for tests and for callers that want one
//! code path.

use crate::dispatch;
use crate::operands::attention::{HeadCache, ScoreBlock, ValueBlock};
use crate::simd::{self, Level};

/// Positions per score vector (the padding of the transposed keys and of every score row).
pub(crate) const LANES: usize = 16;

/// A block of `n_q` consecutive queries of one head: query `b` (its `hd` values at
/// `q[b · q_stride..]`) attends to positions `lo(b)..end0 + b` of `cache` (positions counted
/// from 0), where `lo(b) = end0 + b − window` for a sliding window and 0 otherwise.
#[derive(Clone, Copy, Debug)]
pub struct QueryBlock<'a> {
    pub q: &'a [f32],
    pub q_stride: usize,
    pub n_q: usize,
    pub hd: usize,
    pub cache: HeadCache<'a>,
    /// Exclusive end of query 0's positions (its own position + 1); >= 1.
    pub end0: usize,
    /// Sliding window: a query sees the positions at distance < `window` (None: all before).
    pub window: Option<usize>,
    pub scale: f32,
    /// Scores soft-capped to `c · tanh(s / c)` before the softmax.
    pub softcap: Option<f32>,
}

impl QueryBlock<'_> {
    /// First position query `b` sees.
    fn lo(&self, b: usize) -> usize {
        self.window.map_or(0, |w| (self.end0 + b).saturating_sub(w))
    }

    /// Panic unless the sizes fit: `n_q >= 1`, `end0 >= 1`, every query and every cached
    /// position in range, `window >= 1`.
    fn check(&self, out: &[f32], out_stride: usize) {
        let (n, hd) = (self.n_q, self.hd);
        assert!(
            n > 0 && hd > 0 && self.end0 > 0,
            "attend_block: empty block"
        );
        assert!(
            self.window != Some(0),
            "attend_block: a window of 0 positions"
        );
        assert!(
            self.q.len() >= (n - 1) * self.q_stride + hd && out.len() >= (n - 1) * out_stride + hd,
            "attend_block: queries or outputs shorter than the block"
        );
        let need = (self.end0 + n - 2) * self.cache.stride + hd;
        assert!(
            self.cache.keys.len() >= need && self.cache.values.len() >= need,
            "attend_block: the cache holds fewer than {} positions",
            self.end0 + n - 1
        );
    }
}

/// Queries per sub-block: the keys are transposed once per call, each sub-block's scores
/// cover only the positions its queries see (the causal triangle, cut in strips).
const SUB_BLOCK: usize = 32;

/// Scratch of [`attend_block`], reused across calls (grows to the largest block seen).
#[derive(Default)]
pub struct BlockScratch {
    /// Transposed keys: `hd` rows of `npad` positions.
    kt: Vec<f32>,
    /// Scores, then weights: one row per query of a sub-block.
    s: Vec<f32>,
    /// 1 / Σ weights per query of a sub-block.
    inv: Vec<f32>,
}

/// Whether this CPU takes the vectorised block kernels (else the per-query head kernel is
/// faster, and callers should keep to it).
pub fn block_attention_is_fast() -> bool {
    simd::level() == Level::Avx512
}

/// `out[b · out_stride..][..hd] = Σ_p softmax_p(capped (q_b·k_p)·scale) · v_p` over query b's
/// positions, for every query of the block.
///
/// # Panics
/// When the sizes do not fit (see [`QueryBlock`]).
pub fn attend_block(
    blk: &QueryBlock<'_>,
    scratch: &mut BlockScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    attend_block_at(simd::level(), blk, scratch, out, out_stride)
}

/// [`attend_block`] on a given SIMD level.
pub(crate) fn attend_block_at(
    level: Level,
    blk: &QueryBlock<'_>,
    scratch: &mut BlockScratch,
    out: &mut [f32],
    out_stride: usize,
) {
    blk.check(out, out_stride);
    let (n, hd) = (blk.n_q, blk.hd);
    // On a vector boundary of absolute positions: a position's lane, and so every sum's order,
    // is the same whatever block its query comes in.
    let p0 = blk.lo(0) / LANES * LANES;
    let np = blk.end0 + n - 1 - p0;
    let npad = np.next_multiple_of(LANES);
    transpose_keys(blk, p0, np, npad, &mut scratch.kt);
    let stride = blk.cache.stride;
    for b0 in (0..n).step_by(SUB_BLOCK) {
        let b1 = (b0 + SUB_BLOCK).min(n);
        // Positions pa..pb (from p0) are the ones these queries see; pa on a vector boundary.
        let pa = (blk.lo(b0) - p0) / LANES * LANES;
        let pb = blk.end0 + b1 - 1 - p0;
        let width = (pb - pa).next_multiple_of(LANES);
        scratch.s.clear();
        scratch.s.resize((b1 - b0) * width, 0.0);
        let sb = ScoreBlock {
            kt: &scratch.kt[pa..],
            kt_stride: npad,
            width,
            hd,
            q: &blk.q[b0 * blk.q_stride..],
            q_stride: blk.q_stride,
            n_q: b1 - b0,
            scale: blk.scale,
        };
        dispatch::block_scores(level, &sb, &mut scratch.s);
        scratch.inv.clear();
        for (i, row) in scratch.s.chunks_exact_mut(width).enumerate() {
            let b = b0 + i;
            let (lo, hi) = (blk.lo(b) - p0 - pa, blk.end0 + b - p0 - pa);
            if let Some(cap) = blk.softcap {
                row[lo..hi]
                    .iter_mut()
                    .for_each(|v| *v = cap * (*v / cap).tanh());
            }
            let sum = dispatch::block_softmax_row(level, row, lo, hi);
            scratch.inv.push(1.0 / sum);
        }
        let vb = ValueBlock {
            s: &scratch.s,
            width,
            np: pb - pa,
            inv: &scratch.inv,
            values: &blk.cache.values[(p0 + pa) * stride..],
            stride,
            hd,
        };
        dispatch::block_values(level, &vb, &mut out[b0 * out_stride..], out_stride);
    }
}

/// kt[c · npad + p] = key of position p0 + p, value c, for p < np; zero for np <= p < npad.
fn transpose_keys(blk: &QueryBlock<'_>, p0: usize, np: usize, npad: usize, kt: &mut Vec<f32>) {
    let (hd, stride) = (blk.hd, blk.cache.stride);
    kt.clear();
    kt.resize(hd * npad, 0.0);
    for p in 0..np {
        let key = &blk.cache.keys[(p0 + p) * stride..(p0 + p) * stride + hd];
        for (c, &k) in key.iter().enumerate() {
            kt[c * npad + p] = k;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// Straight f64 loops over the definition, one query at a time: per query and value, the
    /// output and its error allowance, 1e-5·(1 + |out|) plus what an f32 score error of
    /// hd·ε·Σ_c|q_c·k_c|·scale (ε = 2⁻²³) moves the output by: that error times Σ_p w_p·|v_p|.
    fn reference(blk: &QueryBlock<'_>) -> Vec<Vec<(f64, f64)>> {
        let (hd, st) = (blk.hd, blk.cache.stride);
        (0..blk.n_q)
            .map(|b| {
                let q = &blk.q[b * blk.q_stride..b * blk.q_stride + hd];
                let pos = blk.lo(b)..blk.end0 + b;
                let mut smax = 0f64;
                let s: Vec<f64> = pos
                    .clone()
                    .map(|p| {
                        let k = &blk.cache.keys[p * st..p * st + hd];
                        let d: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                        let abs: f64 = q
                            .iter()
                            .zip(k)
                            .map(|(&a, &b)| (a as f64 * b as f64).abs())
                            .sum();
                        smax = smax.max(abs * blk.scale as f64);
                        let s = d * blk.scale as f64;
                        blk.softcap.map_or(s, |c| c as f64 * (s / c as f64).tanh())
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                let score_err = hd as f64 * f32::EPSILON as f64 * smax;
                (0..hd)
                    .map(|c| {
                        let terms = pos
                            .clone()
                            .zip(&e)
                            .map(|(p, w)| (w / z, blk.cache.values[p * st + c] as f64));
                        let out: f64 = terms.clone().map(|(w, v)| w * v).sum();
                        let mag: f64 = terms.map(|(w, v)| w * v.abs()).sum();
                        (out, 1e-5 * (1.0 + out.abs()) + score_err * mag)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn every_level_matches_the_f64_reference_on_odd_blocks() {
        let mut rng = Rng::new(77);
        // (hd, n_q, end0, extra stride, window, softcap)
        type Case = (usize, usize, usize, usize, Option<usize>, Option<f32>);
        let cases: &[Case] = &[
            (1, 1, 1, 0, None, None),
            (7, 3, 1, 5, None, None),
            (64, 17, 40, 64, None, None),
            (128, 33, 1, 0, None, None),
            (128, 5, 100, 128, Some(37), None),
            (80, 9, 3, 16, Some(4), Some(5.0)),
            (96, 4, 20, 0, None, Some(50.0)),
            (37, 21, 250, 3, None, None),
            (256, 6, 7, 0, Some(1), None),
            (64, 70, 5, 0, Some(40), None),
            (128, 65, 3, 0, None, None),
        ];
        for &(hd, n_q, end0, extra, window, softcap) in cases {
            let stride = hd + extra;
            let positions = end0 + n_q - 1;
            let keys: Vec<f32> = rng
                .vec(positions * stride)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let values = rng.vec(positions * stride);
            let q_stride = hd + 3;
            let q = rng.vec(n_q * q_stride);
            let blk = QueryBlock {
                q: &q,
                q_stride,
                n_q,
                hd,
                cache: HeadCache {
                    keys: &keys,
                    values: &values,
                    stride,
                },
                end0,
                window,
                scale: 0.3,
                softcap,
            };
            let want = reference(&blk);
            for level in simd::available() {
                let out_stride = hd + 2;
                let mut out = vec![f32::NAN; n_q * out_stride];
                let mut scratch = BlockScratch::default();
                attend_block_at(level, &blk, &mut scratch, &mut out, out_stride);
                for (b, row) in want.iter().enumerate() {
                    for (c, &(w, tol)) in row.iter().enumerate() {
                        let g = out[b * out_stride + c];
                        assert!(
                            (g as f64 - w).abs() <= tol,
                            "{level:?} hd {hd} n_q {n_q} end0 {end0} window {window:?} \
                             [{b}][{c}]: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_query_gets_the_same_bits_whatever_block_it_is_in() {
        let mut rng = Rng::new(78);
        for (hd, window) in [(64, None), (128, Some(23)), (80, Some(3))] {
            let (n, end0) = (45, 30);
            let keys = rng.vec((end0 + n) * hd);
            let values = rng.vec((end0 + n) * hd);
            let q = rng.vec(n * hd);
            let block = |first: usize, count: usize| QueryBlock {
                q: &q[first * hd..],
                q_stride: hd,
                n_q: count,
                hd,
                cache: HeadCache {
                    keys: &keys,
                    values: &values,
                    stride: hd,
                },
                end0: end0 + first,
                window,
                scale: 0.2,
                softcap: None,
            };
            for level in simd::available() {
                let mut whole = vec![0.0f32; n * hd];
                let mut scratch = BlockScratch::default();
                attend_block_at(level, &block(0, n), &mut scratch, &mut whole, hd);
                for parts in [[1, 2, 42], [7, 33, 5], [16, 16, 13]] {
                    let mut split = vec![0.0f32; n * hd];
                    let mut first = 0;
                    for count in parts {
                        let o = &mut split[first * hd..];
                        attend_block_at(level, &block(first, count), &mut scratch, o, hd);
                        first += count;
                    }
                    assert_eq!(
                        whole, split,
                        "{level:?} hd {hd} window {window:?} {parts:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_nan_query_gives_nan_outputs_for_that_query_only() {
        let (hd, n_q, end0) = (16, 3, 4);
        let keys = vec![0.5f32; (end0 + n_q) * hd];
        let mut q = vec![0.1f32; n_q * hd];
        q[hd + 3] = f32::NAN;
        let blk = QueryBlock {
            q: &q,
            q_stride: hd,
            n_q,
            hd,
            cache: HeadCache {
                keys: &keys,
                values: &keys,
                stride: hd,
            },
            end0,
            window: None,
            scale: 1.0,
            softcap: None,
        };
        for level in simd::available() {
            let mut out = vec![0.0f32; n_q * hd];
            attend_block_at(level, &blk, &mut BlockScratch::default(), &mut out, hd);
            assert!(
                out[hd..2 * hd].iter().all(|v| v.is_nan()),
                "{level:?} {out:?}"
            );
            assert!(
                out[..hd].iter().chain(&out[2 * hd..]).all(|v| *v == 0.5),
                "{level:?}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "fewer than")]
    fn a_short_cache_is_refused() {
        let k = vec![0.0f32; 10];
        let blk = QueryBlock {
            q: &[0.0; 8],
            q_stride: 4,
            n_q: 2,
            hd: 4,
            cache: HeadCache {
                keys: &k,
                values: &k,
                stride: 4,
            },
            end0: 3,
            window: None,
            scale: 1.0,
            softcap: None,
        };
        attend_block(&blk, &mut BlockScratch::default(), &mut [0.0; 8], 4);
    }
}
