//! The matmul inner kernel: a tile of dequantised f32 weight rows times every token, blocked
//! over columns so a stripe of the tile and of the tokens stays in L1, with an `MR`×`NT`
//! register block of accumulators (MR rows × NT tokens) per column sweep.

use super::reduce::hsum;
use std::arch::x86_64::*;

/// Weight rows per register block.
const MR: usize = 4;
/// Tokens per register block.
const NT: usize = 3;
/// Columns per cache block.
const KC: usize = 512;

/// out[t·r + i] = dot(w row i, x token t), `w` being r rows of `cols` and x tokens of `cols`.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. (Slices are bounds-checked against `cols`.)
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile_dot(w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    let mr = |left: usize| if left >= MR { MR } else { 1 };
    sweep::<KC, NT>((w, x), cols, out, mr, |blk, shape, r, sums| {
        // SAFETY: the block's rows and tokens exist and its outputs are in bounds (`sweep`).
        unsafe {
            match shape {
                (MR, NT) => micro::<MR, NT>(blk, r, sums),
                (MR, _) => micro::<MR, 1>(blk, r, sums),
                (_, NT) => micro::<1, NT>(blk, r, sums),
                _ => micro::<1, 1>(blk, r, sums),
            }
        }
    });
}

/// The sweep of a tile kernel over `w` (r rows of `cols`) and `x` (tokens of `cols`): `out`
/// zeroed, then per cache block of `KC` columns, per run of `NT` tokens (1 for the last few) and
/// per run of `mr(rows left)` rows, `micro(block, (rows, tokens), r, sums)` with the block's
/// `Block` and `sums` the outputs from its first (token, row): rows i..i + rows and tokens
/// t..t + tokens exist, each with the block's len values from its pointers, and
/// sums[j·r + ii] is in bounds for j < tokens, ii < rows.
#[inline(always)]
pub(super) fn sweep<const KC: usize, const NT: usize>(
    (w, x): (&[f32], &[f32]),
    cols: usize,
    out: &mut [f32],
    mr: impl Fn(usize) -> usize,
    mut micro: impl FnMut(Block, (usize, usize), usize, &mut [f32]),
) {
    let r = w.len() / cols;
    let n = x.len() / cols;
    assert!(out.len() == r * n && w.len() == r * cols && x.len() == n * cols);
    out.fill(0.0);
    for k0 in (0..cols).step_by(KC) {
        let kl = KC.min(cols - k0);
        let mut t = 0;
        while t < n {
            let nt = if n - t >= NT { NT } else { 1 };
            let mut i = 0;
            while i < r {
                let mr = mr(r - i);
                let blk = Block {
                    w: w[i * cols + k0..].as_ptr(),
                    x: x[t * cols + k0..].as_ptr(),
                    stride: cols,
                    len: kl,
                };
                micro(blk, (mr, nt), r, &mut out[t * r + i..]);
                i += mr;
            }
            t += nt;
        }
    }
}

/// A register block's inputs: `len` values of consecutive rows (`stride` apart) of w and x.
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub(super) w: *const f32,
    pub(super) x: *const f32,
    pub(super) stride: usize,
    pub(super) len: usize,
}

/// out[j·out_stride + ii] += dot(w row ii, x token j) over the block, for ii < M, j < T.
///
/// # Safety
/// M rows and T tokens of `len` values must be readable from the block's pointers; the out
/// indices above must be in bounds; the CPU must have AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro<const M: usize, const T: usize>(b: Block, out_stride: usize, out: &mut [f32]) {
    let mut acc = [[_mm256_setzero_ps(); T]; M];
    let mut c = 0;
    while c + 8 <= b.len {
        // SAFETY: c + 8 <= len, within every row and token per the caller.
        unsafe {
            let mut xv = [_mm256_setzero_ps(); T];
            for (j, v) in xv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(b.x.add(j * b.stride + c));
            }
            for (ii, a) in acc.iter_mut().enumerate() {
                let wv = _mm256_loadu_ps(b.w.add(ii * b.stride + c));
                for (aj, &xj) in a.iter_mut().zip(&xv) {
                    *aj = _mm256_fmadd_ps(wv, xj, *aj);
                }
            }
        }
        c += 8;
    }
    for (ii, a) in acc.iter().enumerate() {
        for (j, &aj) in a.iter().enumerate() {
            let mut s = hsum(aj);
            for k in c..b.len {
                // SAFETY: k < len, within row ii and token j per the caller.
                s += unsafe { *b.w.add(ii * b.stride + k) * *b.x.add(j * b.stride + k) };
            }
            out[j * out_stride + ii] += s;
        }
    }
}
