//! The integer matvec path for quantized weights: x is quantized once per call to int16 with one
//! scale per 32-block (never to int8), and each block's Σq·x is computed exactly in i32 with
//! `pmaddwd`, then scaled by d·s_x in f32. The only approximation is x's int16 rounding
//! (|δx| ≤ max|x_block| / 65534), which keeps every dot within the crate's tolerance.
//!
//! Per block-row the loop does only the integer dot (one zero/sign-extending load, two
//! `pmaddwd`), one conversion and one FMA with a broadcast from the stack. What does not depend
//! on the quants is hoisted out per chunk of eight blocks: the f16 scales of eight blocks are
//! gathered with blends and converted at once, then multiplied by x's eight scales; Q4_1's mins
//! enter as one FMA of eight mins with eight per-block sums of x. Q4_0's −8 stays in the integer
//! dot (a per-block bias of x), so blocks of zero weights give exactly zero.

use super::quant::{Offset, QuantFormat};
use super::reduce::{hmax, hsum};
use std::arch::x86_64::*;

/// Largest int16 magnitude used for x: 127·256 + 127, so that x = 256·h + l splits into two
/// signed bytes (see [`super::split8`]).
const X_MAX: f32 = 32639.0;
/// Blocks whose scales are converted together (one f32 vector's worth).
pub(super) const CHUNK: usize = 8;

/// x quantized to int16, per 32-weight block. The per-block vectors are zero-padded to a
/// multiple of [`CHUNK`] blocks so a chunk's eight lanes can always be loaded.
pub(crate) struct XQuant {
    /// round(x / scale), 32 per block.
    pub(super) q: Vec<i16>,
    /// Per block: x ≈ scale · q.
    pub(super) scale: Vec<f32>,
    /// Per block: Σx (in f32, from the unquantized x), for the Q4_1 min term.
    pub(super) sum: Vec<f32>,
    /// Per 16-value half-block: Σx (in f32), for the K-quants' min terms.
    pub(super) sum16: Vec<f32>,
    /// Per block: 8·q summed in the lane pattern of the dot's two `pmaddwd` (eight i32 lanes),
    /// subtracted from Q4_0's integer dot so each lane of Σ(q − 8)·x stays exact.
    bias8: Vec<i32>,
    /// Per block: the 32 q split into bytes, q = 256·h + l (h in −127..=127, l in −128..=127):
    /// the 32 h, then the 32 l, in weight order ([`super::split8`]).
    pub(super) hl: Vec<i8>,
    /// Per block: −8·(q of weights 4j..4j + 4) in lane j, Q4_0's −8 in the lane pattern of
    /// `vpdpbusd` over bytes in weight order.
    pub(super) neg_bias8: Vec<i32>,
    /// Number of 32-blocks.
    blocks: usize,
}

impl XQuant {
    /// Quantize `x` (length a multiple of 32); `None` when x holds a NaN or infinity (the f32
    /// path then propagates it faithfully).
    pub(crate) fn new(x: &[f32]) -> Option<XQuant> {
        crate::simd::debug_check_level();
        let blocks = x.len() / 32;
        let padded = blocks.next_multiple_of(CHUNK);
        let mut xq = XQuant {
            q: vec![0; blocks * 32],
            scale: vec![0.0; padded],
            sum: vec![0.0; padded],
            sum16: vec![0.0; 2 * padded],
            bias8: vec![0; blocks * 8],
            hl: vec![0; blocks * 64],
            neg_bias8: vec![0; blocks * 8],
            blocks,
        };
        // SAFETY: only reached on the AVX2 path, after the features were detected.
        let finite = unsafe { quantize_blocks(x, &mut xq) };
        if finite {
            xq.split_bytes();
        }
        finite.then_some(xq)
    }

    /// Number of 32-blocks.
    pub(crate) fn blocks(&self) -> usize {
        self.blocks
    }

    /// Fill [`XQuant::hl`] and [`XQuant::neg_bias8`] from `q`.
    fn split_bytes(&mut self) {
        for ((q, hl), nb) in self
            .q
            .chunks_exact(32)
            .zip(self.hl.chunks_exact_mut(64))
            .zip(self.neg_bias8.chunks_exact_mut(8))
        {
            let (h, l) = hl.split_at_mut(32);
            for ((&v, h), l) in q.iter().zip(h.iter_mut()).zip(l.iter_mut()) {
                let hi = (v as i32 + 128) >> 8;
                *h = hi as i8;
                *l = (v as i32 - 256 * hi) as i8;
            }
            for (j, b) in nb.iter_mut().enumerate() {
                *b = -8 * q[4 * j..4 * j + 4].iter().map(|&v| v as i32).sum::<i32>();
            }
        }
    }
}

/// Fill `xq` from `x`; false when some block is not finite.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_blocks(x: &[f32], xq: &mut XQuant) -> bool {
    let sign = _mm256_set1_ps(-0.0);
    let mut q = std::mem::take(&mut xq.q);
    let blocks = x.chunks_exact(32).zip(q.chunks_exact_mut(32));
    for (b, (xb, qb)) in blocks.enumerate() {
        // SAFETY: xb has 32 values, loaded as four unaligned vectors.
        let v = unsafe { [0, 8, 16, 24].map(|k| _mm256_loadu_ps(xb.as_ptr().add(k))) };
        let abs = v.map(|vk| _mm256_andnot_ps(sign, vk));
        let amax = hmax(_mm256_max_ps(
            _mm256_max_ps(abs[0], abs[1]),
            _mm256_max_ps(abs[2], abs[3]),
        ));
        let s0 = hsum(_mm256_add_ps(v[0], v[1]));
        let s1 = hsum(_mm256_add_ps(v[2], v[3]));
        let s = s0 + s1;
        // NaN fails `is_finite` on the sum even where max_ps dropped it.
        if !amax.is_finite() || !s.is_finite() {
            return false;
        }
        // 0 for a block of zeros, and for one so small (max|x| below ~1e-34) that the factor
        // overflows: its values are 0 here.
        let inv = match X_MAX / amax {
            inv if amax > 0.0 && inv.is_finite() => inv,
            _ => 0.0,
        };
        let inv = _mm256_set1_ps(inv);
        // Round to nearest (the default MXCSR mode); |v·inv| <= 32767, so packs never clips.
        let i = v.map(|vk| _mm256_cvtps_epi32(_mm256_mul_ps(vk, inv)));
        // packs works per 128-bit lane: reorder the 64-bit quarters back into x order.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[0], i[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(i[2], i[3]));
        // 8·Σq in the lane pattern of the dot's two pmaddwd (|lane| <= 8·4·32767 < 2^31), so
        // that Q4_0's per-lane difference is exact.
        let eight = _mm256_set1_epi16(8);
        let bias = _mm256_add_epi32(_mm256_madd_epi16(eight, lo), _mm256_madd_epi16(eight, hi));
        // SAFETY: qb has 32 i16 = two 32-byte unaligned stores; bias8 has eight lanes per block.
        unsafe {
            _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, lo);
            _mm256_storeu_si256(qb.as_mut_ptr().add(16) as *mut __m256i, hi);
            _mm256_storeu_si256(xq.bias8.as_mut_ptr().add(8 * b) as *mut __m256i, bias);
        }
        xq.scale[b] = amax / X_MAX;
        xq.sum[b] = s;
        xq.sum16[2 * b] = s0;
        xq.sum16[2 * b + 1] = s1;
    }
    xq.q = q;
    true
}

/// out[i] = dot(row i, x) for the `R` quantized rows starting at `p[i]`, on the int16 x. With
/// `FETCH`, the rows starting at `next[i]` (read next by the caller) are fetched into the cache
/// chunk by chunk in step with these rows' reads, so scattered rows keep the memory busy.
///
/// # Safety
/// `xq.blocks()` blocks must be readable at each `p[i]`; `out.len() >= R`; the CPU must have
/// AVX2, FMA and F16C. `next` may hold any addresses (prefetches never fault).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_rows_i16<Q: QuantFormat, const R: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); R];
    each_chunk::<Q, R, FETCH>(next, xq.blocks, |b0, n| {
        // SAFETY: blocks b0..b0 + n exist, per the caller.
        unsafe { chunk_dot::<Q, R>(p, xq, b0, n, &mut acc) }
    });
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(*a);
    }
}

/// Walk `blocks` blocks a chunk at a time: `chunk(b0, n)` for blocks `b0..b0 + n`, the whole
/// chunks with the constant `n = CHUNK` (so an inlined chunk kernel takes them with no per-block
/// checks), then the partial last one; with `FETCH`, the same blocks of the rows at `next[i]`
/// are fetched before each chunk.
#[inline(always)]
pub(super) fn each_chunk<Q: QuantFormat, const R: usize, const FETCH: bool>(
    next: &[*const u8; R],
    blocks: usize,
    mut chunk: impl FnMut(usize, usize),
) {
    let full = blocks / CHUNK * CHUNK;
    for b0 in (0..full).step_by(CHUNK) {
        if FETCH {
            fetch_chunk::<Q, R>(next, b0, CHUNK);
        }
        chunk(b0, CHUNK);
    }
    if full < blocks {
        if FETCH {
            fetch_chunk::<Q, R>(next, full, blocks - full);
        }
        chunk(full, blocks - full);
    }
}

/// Per row, d·s_x of blocks `b0..b0 + n` (`n <= CHUNK`) of the `R` rows at `p[i]` (lane k:
/// block b0 + k), eight blocks per conversion; for a format with mins (`Offset::Min`), their
/// Σ m_b·Σx_b over the chunk added to `offs[i]`, eight blocks per FMA.
///
/// # Safety
/// Blocks b0..b0 + n readable at each `p[i]`; `b0 + n <= xq.blocks()`; the CPU has AVX2, FMA
/// and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_factors<Q: QuantFormat, const R: usize>(
    p: &[*const u8; R],
    xq: &XQuant,
    (b0, n): (usize, usize),
    offs: &mut [__m256; R],
) -> [[f32; CHUNK]; R] {
    let mut ds = [[0f32; CHUNK]; R];
    // SAFETY: the per-block vectors are padded to whole chunks, so lanes b0..b0 + 8 exist; each
    // row's blocks b0..b0 + n are readable per the caller.
    unsafe {
        let sx = _mm256_loadu_ps(xq.scale.as_ptr().add(b0));
        for (i, (m, dsi)) in offs.iter_mut().zip(&mut ds).enumerate() {
            let row = p[i].add(b0 * Q::BLOCK_BYTES);
            _mm256_storeu_ps(dsi.as_mut_ptr(), _mm256_mul_ps(Q::scales8(row, n), sx));
            // Offsets are independent of the quants: Σ_b offset_b · Σx_b, eight at a time.
            if Q::OFFSET == Offset::Min {
                let s = _mm256_loadu_ps(xq.sum.as_ptr().add(b0));
                *m = _mm256_fmadd_ps(Q::mins8(row, n), s, *m);
            }
        }
    }
    ds
}

/// Hint the cache to fetch blocks `b0..b0 + n` of each row starting at `next[i]`.
#[inline(always)]
pub(super) fn fetch_chunk<Q: QuantFormat, const R: usize>(
    next: &[*const u8; R],
    b0: usize,
    n: usize,
) {
    let (start, end) = (b0 * Q::BLOCK_BYTES, (b0 + n) * Q::BLOCK_BYTES);
    for q in next {
        let mut off = start & !63;
        while off < end {
            // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is
            // baseline on x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(off) as *const i8) };
            off += 64;
        }
    }
}

/// Add blocks `b0..b0 + n` (`n <= CHUNK`) of `R` rows to the rows' accumulators: the chunk's
/// scales (and Q4_1's mins) first, eight blocks at a time, then one integer dot, conversion and
/// FMA per block-row. Called with the constant `n = CHUNK` for whole chunks, so those take the
/// blend gathers with no per-block checks.
///
/// # Safety
/// As for [`quant_rows_i16`], with `b0 + n <= xq.blocks()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_dot<Q: QuantFormat, const R: usize>(
    p: &[*const u8; R],
    xq: &XQuant,
    b0: usize,
    n: usize,
    acc_out: &mut [__m256; R],
) {
    // A local copy: through the reference, LLVM stored every accumulator after each FMA.
    let mut acc = *acc_out;
    // Per row, d·s_x of the chunk's blocks, read back one broadcast per block; the mins go
    // straight into the accumulators.
    // SAFETY: per the caller.
    let ds = unsafe { chunk_factors::<Q, R>(p, xq, (b0, n), &mut acc) };
    let xp = xq.q.as_ptr();
    for k in 0..n {
        let b = b0 + k;
        // SAFETY: b < blocks, so xq.q[32b..32b+32] and every row's block b are in bounds per
        // the caller.
        unsafe {
            let xa = _mm256_loadu_si256(xp.add(32 * b) as *const __m256i);
            let xb = _mm256_loadu_si256(xp.add(32 * b + 16) as *const __m256i);
            let bias = match Q::OFFSET {
                Offset::MinusEight => _mm256_loadu_si256(xq.bias8.as_ptr().add(8 * b).cast()),
                Offset::None | Offset::Min => _mm256_setzero_si256(),
            };
            for (i, (a, dsi)) in acc.iter_mut().zip(&ds).enumerate() {
                let [qa, qb] = Q::quants16(p[i].add(b * Q::BLOCK_BYTES));
                let mut s = _mm256_add_epi32(_mm256_madd_epi16(qa, xa), _mm256_madd_epi16(qb, xb));
                if Q::OFFSET == Offset::MinusEight {
                    s = _mm256_sub_epi32(s, bias);
                }
                let d = _mm256_broadcast_ss(dsi.get_unchecked(k));
                *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), *a);
            }
        }
    }
    *acc_out = acc;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_x_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.37)
            .collect();
        let xq = XQuant::new(&x).unwrap();
        for (b, xb) in x.chunks_exact(32).enumerate() {
            let mut qsum = 0.0;
            for (k, &v) in xb.iter().enumerate() {
                let back = xq.q[32 * b + k] as f32 * xq.scale[b];
                assert!((back - v).abs() <= 0.5 * xq.scale[b] * 1.001 + 1e-12);
                qsum += back;
            }
            assert!((xq.sum[b] - xb.iter().sum::<f32>()).abs() < 1e-5);
            assert!((xq.sum16[2 * b + 1] - xb[16..].iter().sum::<f32>()).abs() < 1e-5);
            let bias: i32 = xq.bias8[8 * b..8 * b + 8].iter().sum();
            assert!((bias as f32 * xq.scale[b] - 8.0 * qsum).abs() < 1e-4);
        }
        // Padding lanes up to the chunk are zero.
        assert_eq!(xq.scale.len(), CHUNK);
        assert!(xq.scale[3..].iter().all(|&s| s == 0.0));
        assert!(XQuant::new(&[0.0; 32]).unwrap().q.iter().all(|&q| q == 0));
        // A block so small that X_MAX / max|x| overflows is zeros (not −32768s).
        assert!(XQuant::new(&[1e-36; 32]).unwrap().q.iter().all(|&q| q == 0));
        let mut bad = vec![1.0f32; 64];
        bad[40] = f32::NAN;
        assert!(XQuant::new(&bad).is_none());
    }

    /// Every chunk length (whole chunks and tails of 1..7 blocks), every quantized format, row
    /// groups and single rows: the int16 path meets the dot bound.
    #[test]
    fn every_chunk_length_meets_the_bound() {
        use crate::testutil::{assert_dot_close, random_weight, Rng};
        use powerinfer_core::DType;
        let mut rng = Rng::new(21);
        for blocks in 1..=2 * CHUNK + 1 {
            let cols = 32 * blocks;
            for dtype in [
                DType::Q8_0,
                DType::Q4_0,
                DType::Q4_1,
                DType::Q5_0,
                DType::Q5_1,
            ] {
                let w = random_weight(&mut rng, dtype, 6, cols);
                let x = rng.vec(cols);
                let xq = XQuant::new(&x).unwrap();
                let mut y = vec![f32::NAN; 6];
                let row_bytes = dtype.row_bytes(cols).unwrap();
                for wide in super::super::wide_choices() {
                    super::super::rows_dot_i16(dtype, w.bytes(), row_bytes, &xq, &mut y, wide);
                    for (r, &got) in y.iter().enumerate() {
                        assert_dot_close(got, dtype, w.row(r), &x, "int16 chunks");
                    }
                }
            }
        }
    }

    /// Q4_0 blocks whose quants are all 8 are zero weights: the dot is exactly zero, whatever
    /// d and x (the −8 is subtracted in integers, not in f32).
    #[test]
    fn q4_0_zero_weights_give_exactly_zero() {
        use crate::testutil::Rng;
        use half::f16;
        use powerinfer_core::DType;
        let mut rng = Rng::new(22);
        let (rows, blocks) = (5, 13);
        let mut bytes = Vec::new();
        for _ in 0..rows * blocks {
            bytes.extend(f16::from_f32(rng.uniform(0.5, 3.0)).to_le_bytes());
            bytes.extend([0x88u8; 16]);
        }
        let x: Vec<f32> = rng.vec(32 * blocks).iter().map(|v| v * 1e3).collect();
        let xq = XQuant::new(&x).unwrap();
        let mut y = vec![f32::NAN; rows];
        let row_bytes = DType::Q4_0.row_bytes(32 * blocks).unwrap();
        for wide in super::super::wide_choices() {
            super::super::rows_dot_i16(DType::Q4_0, &bytes, row_bytes, &xq, &mut y, wide);
            assert_eq!(y, vec![0.0; rows]);
        }
    }
}
