//! The 512-bit form of the matmul inner kernel ([`super::tile`]), taken on the AVX-512 level:
//! a tile of dequantised f32 weight rows times every token, blocked over columns so a stripe of
//! the tile stays in L1, with an `MR`×`NT` register block of 16-lane accumulators.
//!
//! With 32 vector registers, a block of all eight rows of a matmul tile by three tokens holds
//! 24 accumulators, three token vectors and a weight vector: 24 independent FMA chains per
//! 16-column step, for 11 loads. The eight sums of one token are reduced together by a
//! transposing tree (23 shuffles and adds for eight sums, against about eight per sum one by
//! one) and added to the output as one 8-lane vector. Column tails are masked loads.

use super::tile::{sweep, Block};
use std::arch::x86_64::*;

/// Weight rows per register block (the whole tile of `ops::matmul`).
const MR: usize = 8;
/// Tokens per register block.
const NT: usize = 3;
/// Columns per cache block: the tile's stripe, MR·KC·4 bytes = 32 KiB, stays in L1 (512 columns
/// measured 4% slower on the 2048×2048 matmul of 64 tokens, 2048 columns 30% slower).
const KC: usize = 1024;

/// out[t·r + i] = dot(w row i, x token t), `w` being r rows of `cols` and x tokens of `cols`.
///
/// # Safety
/// The CPU must have the AVX-512 level. (Slices are bounds-checked against `cols`.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn tile_dot(w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    let mr = |left: usize| match left {
        left if left >= MR => MR,
        left if left >= 4 => 4,
        _ => 1,
    };
    sweep::<KC, NT>((w, x), cols, out, mr, |blk, shape, r, sums| {
        // SAFETY: the block's rows and tokens exist and its outputs are in bounds (`sweep`);
        // the CPU has the AVX-512 level per the caller.
        unsafe {
            match shape {
                (MR, NT) => micro::<MR, NT>(blk, r, sums),
                (MR, _) => micro::<MR, 1>(blk, r, sums),
                (4, NT) => micro::<4, NT>(blk, r, sums),
                (4, _) => micro::<4, 1>(blk, r, sums),
                (_, NT) => micro::<1, NT>(blk, r, sums),
                _ => micro::<1, 1>(blk, r, sums),
            }
        }
    });
}

/// out[j·out_stride + ii] += dot(w row ii, x token j) over the block, for ii < M, j < T.
///
/// # Safety
/// M rows and T tokens of `len` values must be readable from the block's pointers; the out
/// indices above must be in bounds; the CPU must have the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn micro<const M: usize, const T: usize>(b: Block, out_stride: usize, out: &mut [f32]) {
    let mut acc = [[_mm512_setzero_ps(); T]; M];
    let mut xv = [_mm512_setzero_ps(); T];
    let mut c = 0;
    while c + 16 <= b.len {
        // SAFETY: c + 16 <= len, within every row and token per the caller.
        unsafe {
            for (j, v) in xv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(b.x.add(j * b.stride + c));
            }
            for (ii, a) in acc.iter_mut().enumerate() {
                let wv = _mm512_loadu_ps(b.w.add(ii * b.stride + c));
                for (aj, &xj) in a.iter_mut().zip(&xv) {
                    *aj = _mm512_fmadd_ps(wv, xj, *aj);
                }
            }
        }
        c += 16;
    }
    if c < b.len {
        let m = ((1u32 << (b.len - c)) - 1) as __mmask16;
        // SAFETY: only the len − c < 16 values from c, within every row and token per the
        // caller, are read (masked-off lanes are not accessed).
        unsafe {
            for (j, v) in xv.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_ps(m, b.x.add(j * b.stride + c));
            }
            for (ii, a) in acc.iter_mut().enumerate() {
                let wv = _mm512_maskz_loadu_ps(m, b.w.add(ii * b.stride + c));
                for (aj, &xj) in a.iter_mut().zip(&xv) {
                    *aj = _mm512_fmadd_ps(wv, xj, *aj);
                }
            }
        }
    }
    for j in 0..T {
        let o = &mut out[j * out_stride..j * out_stride + M];
        if M == 8 {
            let sums = reduce8(std::array::from_fn(|ii| acc[ii][j]));
            // SAFETY: `o` holds the eight outputs of token j.
            unsafe {
                let prev = _mm256_loadu_ps(o.as_ptr());
                _mm256_storeu_ps(o.as_mut_ptr(), _mm256_add_ps(prev, sums));
            }
        } else {
            for (oi, a) in o.iter_mut().zip(&acc) {
                *oi += _mm512_reduce_add_ps(a[j]);
            }
        }
    }
}

/// The sums of the 16 lanes of each of eight vectors, as lanes 0..8: halves of each pair
/// folded into one vector, then quarters, then the four lanes left of each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn reduce8(a: [__m512; 8]) -> __m256 {
    // 128-bit chunks 0, 1 hold the two partial halves of u, chunks 2, 3 those of v.
    let halves = |u: __m512, v: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(u, v),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(u, v),
        )
    };
    // Chunk k holds four partial sums of vector k of the four that `halves` folded into u, v.
    let quarters = |u: __m512, v: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(u, v),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(u, v),
        )
    };
    let lo = quarters(halves(a[0], a[1]), halves(a[2], a[3]));
    let hi = quarters(halves(a[4], a[5]), halves(a[6], a[7]));
    // Per chunk k: [lo0 + lo2, hi0 + hi2, lo1 + lo3, hi1 + hi3], then lane 0 = Σa[k] and
    // lane 1 = Σa[k + 4].
    let u = _mm512_add_ps(_mm512_unpacklo_ps(lo, hi), _mm512_unpackhi_ps(lo, hi));
    let v = _mm512_add_ps(u, _mm512_permute_ps::<0b01_00_11_10>(u));
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps256(_mm512_permutexvar_ps(order, v))
}

#[cfg(test)]
mod tests {
    //! The matmul tile, AVX2 and 512-bit forms, on row counts off the register block, token
    //! counts off its width and column counts off the vector and cache blocks, against f64.

    use super::super::{tile_dot, wide_choices};
    use crate::testutil::{Rng, DOT_ABS_TOL, DOT_REL_TOL};

    #[test]
    fn tile_dot_matches_f64_on_odd_shapes() {
        if !crate::simd::detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(64);
        for cols in [1, 5, 16, 17, 33, 100, 1024, 1029, 2100] {
            for r in [1, 3, 4, 5, 7, 8, 9, 13] {
                let w = rng.vec(r * cols);
                for n in [1, 2, 3, 4, 5, 7] {
                    let x = rng.vec(n * cols);
                    for wide in wide_choices() {
                        let mut out = vec![f32::NAN; r * n];
                        tile_dot(&w, cols, &x, &mut out, wide);
                        for t in 0..n {
                            for i in 0..r {
                                let wi = &w[i * cols..(i + 1) * cols];
                                let xt = &x[t * cols..(t + 1) * cols];
                                let terms = wi.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64);
                                let want: f64 = terms.clone().sum();
                                let scale: f64 = terms.map(f64::abs).sum();
                                let got = out[t * r + i];
                                let tol = DOT_REL_TOL * scale + DOT_ABS_TOL;
                                assert!(
                                    (got as f64 - want).abs() <= tol,
                                    "tile {r}x{cols} n{n} wide={wide} [{t}, {i}]: got {got}, want {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
