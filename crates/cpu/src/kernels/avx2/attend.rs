//! AVX2/FMA attention head (see `crate::ops::attend`): scores with two FMA accumulators and one
//! horizontal sum per position, the softmax on the shared exp, and the weighted value sum with
//! the output held in registers 32 values at a time while every position's value rows stream by.

use super::reduce::hsum;
use crate::kernels::{exp_nonpositive, sink_term, softmax_max};
use crate::operands::attention::Head;
use std::arch::x86_64::*;

/// Output values held in registers per pass over the positions.
const SPAN: usize = 32;

/// `out = Σ_p softmax_p((q·k_p)·scale) · v_p` over the head's positions (and its sink).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; the sizes pass [`Head::check`] (`out.len() == q.len() = hd`,
/// `n_pos >= 1`, and the cache holds `n_pos` positions of `hd` values).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_head(head: &Head<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (q, cache, n_pos, scale) = (head.q, head.cache, head.n_pos, head.scale);
    let hd = q.len();
    let full = hd / 8 * 8;
    let (qp, kp, vp) = (q.as_ptr(), cache.keys.as_ptr(), cache.values.as_ptr());
    scores.clear();
    scores.resize(n_pos, 0.0);
    // SAFETY: forwarded from the caller.
    unsafe {
        match hd {
            64 => scores_fixed::<8>(qp, kp, cache.stride, scale, scores),
            128 => scores_fixed::<16>(qp, kp, cache.stride, scale, scores),
            _ => scores_any(q, kp, cache.stride, scale, scores),
        }
    }
    let max = softmax_max(scores, head.sink);
    let mut sum = _mm256_setzero_ps();
    let mut tail = sink_term(head.sink, max);
    let mut chunks = scores.chunks_exact_mut(8);
    for c in &mut chunks {
        for s in c.iter_mut() {
            *s = exp_nonpositive(*s - max);
        }
        // SAFETY: c holds 8 values.
        sum = _mm256_add_ps(sum, unsafe { _mm256_loadu_ps(c.as_ptr()) });
    }
    for s in chunks.into_remainder() {
        *s = exp_nonpositive(*s - max);
        tail += *s;
    }
    let inv = 1.0 / (hsum(sum) + tail);
    let op = out.as_mut_ptr();
    let mut c = 0;
    while c < full {
        let lanes = ((full - c) / 8).min(SPAN / 8);
        let mut acc = [_mm256_setzero_ps(); SPAN / 8];
        for (p, &w) in scores.iter().enumerate() {
            let w = _mm256_set1_ps(w * inv);
            // SAFETY: values c..c + 8·lanes <= full of position p are inside values.
            let v = unsafe { vp.add(p * cache.stride + c) };
            for (j, a) in acc.iter_mut().enumerate().take(lanes) {
                *a = _mm256_fmadd_ps(w, unsafe { _mm256_loadu_ps(v.add(8 * j)) }, *a);
            }
        }
        for (j, a) in acc.iter().enumerate().take(lanes) {
            // SAFETY: c + 8·j + 8 <= full <= out.len().
            unsafe { _mm256_storeu_ps(op.add(c + 8 * j), *a) };
        }
        c += 8 * lanes;
    }
    for (j, o) in out.iter_mut().enumerate().take(hd).skip(full) {
        *o = 0.0;
        for (p, &w) in scores.iter().enumerate() {
            // SAFETY: value j < hd of position p is inside values.
            *o += w * inv * unsafe { *vp.add(p * cache.stride + j) };
        }
    }
}

/// Scores for a head size of 8·L (64, 128): q held in L registers, every key streamed once.
///
/// # Safety
/// As for [`attend_head`], with hd = 8·L and `scores.len()` = n_pos.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_fixed<const L: usize>(
    qp: *const f32,
    kp: *const f32,
    stride: usize,
    scale: f32,
    scores: &mut [f32],
) {
    // SAFETY: q holds 8·L values.
    let qv: [__m256; L] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(qp.add(8 * j)) });
    for (p, s) in scores.iter_mut().enumerate() {
        // SAFETY: position p's key is 8·L values at p·stride, inside keys.
        let k = unsafe { kp.add(p * stride) };
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in (0..L).step_by(2) {
            // SAFETY: as above, j + 1 < L.
            unsafe {
                a0 = _mm256_fmadd_ps(qv[j], _mm256_loadu_ps(k.add(8 * j)), a0);
                a1 = _mm256_fmadd_ps(qv[j + 1], _mm256_loadu_ps(k.add(8 * j + 8)), a1);
            }
        }
        *s = hsum(_mm256_add_ps(a0, a1)) * scale;
    }
}

/// Scores for any head size.
///
/// # Safety
/// As for [`attend_head`], with `scores.len()` = n_pos.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_any(q: &[f32], kp: *const f32, stride: usize, scale: f32, scores: &mut [f32]) {
    let hd = q.len();
    let full = hd / 8 * 8;
    let qp = q.as_ptr();
    for (p, s) in scores.iter_mut().enumerate() {
        // SAFETY: position p's key is hd values at p·stride, inside keys per the contract.
        let k = unsafe { kp.add(p * stride) };
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY: i + 16 <= full <= hd (and i + 8 below): in bounds of q and of the key.
        unsafe {
            while i + 16 <= full {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i)), a0);
                let (qi, ki) = (qp.add(i + 8), k.add(i + 8));
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qi), _mm256_loadu_ps(ki), a1);
                i += 16;
            }
            if i < full {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i)), a0);
            }
        }
        let mut d = hsum(_mm256_add_ps(a0, a1));
        for j in full..hd {
            // SAFETY: j < hd.
            d += unsafe { *qp.add(j) * *k.add(j) };
        }
        *s = d * scale;
    }
}
