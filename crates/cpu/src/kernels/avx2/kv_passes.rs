//! The quantized KV cache's two block loops ([`crate::kernels::kv_blocks::KvPasses`]) in AVX2
//! intrinsics, the same bits as the portable ones:
//!
//! - scores: each block's 32 integers against the query block's in byte-pair products
//!   (`maddubs` on |k| and q signed by k, or on the unsigned nibbles of q4_1 directly, then
//!   `madd` to eight i32 lanes: exact), one horizontal sum, then the
//!   format's f32 scaling ([`KvBlock::scale`]) added in block order;
//! - values: per 32-value column of the output, its four vectors held in registers while
//!   every position's block of that column streams by: the integers widened to f32, times
//!   c = w·d (plus m for the nibble formats), added in position order.

use std::arch::x86_64::*;

use crate::kernels::kv_blocks::{Ints, KvBlock, KvPasses, QK};
use crate::operands::attention::KvScratch;

/// The AVX2 level's loops.
pub(crate) struct Avx2;

impl KvPasses for Avx2 {
    #[inline(always)]
    fn scores<B: KvBlock>(
        k: &[u8],
        pos_bytes: usize,
        n_pos: usize,
        s: &KvScratch,
        out: &mut [f32],
    ) {
        // SAFETY: only reached from the AVX2 level's entry (features detected by the
        // dispatcher); every block is read through a bounds-checked slice.
        unsafe { scores::<B>(k, pos_bytes, n_pos, s, out) }
    }
    #[inline(always)]
    fn values<B: KvBlock>(v: &[u8], pos_bytes: usize, w: &[f32], out: &mut [f32]) {
        // SAFETY: as for `scores`.
        unsafe { values::<B>(v, pos_bytes, w, out) }
    }
}

/// Whether the block's integers are signed bytes (q8_0, q4_0 less 8) rather than unsigned
/// nibbles (q4_1).
const fn signed<B: KvBlock>() -> bool {
    !matches!(B::INTS, Ints::Nibbles { bias: 0, .. })
}

/// The 32 integers of block `b` as bytes, in value order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ints<B: KvBlock>(b: &[u8]) -> __m256i {
    let b = &b[..B::BYTES];
    match B::INTS {
        Ints::Bytes(at) => {
            let bytes: &[u8; QK] = b[at..at + QK].try_into().unwrap();
            // SAFETY: 32 readable bytes (the array reference).
            unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
        }
        Ints::Nibbles { at, bias } => {
            let bytes: &[u8; QK / 2] = b[at..at + QK / 2].try_into().unwrap();
            // SAFETY: 16 readable bytes (the array reference).
            let n = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
            let low = _mm_set1_epi8(15);
            let lo = _mm_and_si128(n, low);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(n), low);
            let v = _mm256_set_m128i(hi, lo);
            if bias == 0 {
                v
            } else {
                _mm256_sub_epi8(v, _mm256_set1_epi8(bias as i8))
            }
        }
    }
}

/// Σ k_i·q_i over 32 byte pairs, exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn int_dot<B: KvBlock>(k: __m256i, q: __m256i) -> i32 {
    // |k|·(q signed by k) = k·q, with |k| ≤ 128 (any byte) and |q| ≤ 127 (the query from
    // ggml's rounding): each pair sum is at most 2·128·127 < 2¹⁵, so none saturates.
    let pairs = if signed::<B>() {
        _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(q, k))
    } else {
        _mm256_maddubs_epi16(k, q)
    };
    let v = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// See [`KvPasses::scores`].
#[target_feature(enable = "avx2,fma,f16c")]
fn scores<B: KvBlock>(k: &[u8], pos_bytes: usize, n_pos: usize, s: &KvScratch, out: &mut [f32]) {
    let nb = s.qd.len();
    let query: Vec<__m256i> = s.qs[..nb * QK]
        .chunks_exact(QK)
        .map(|q| {
            let q: &[i8; QK] = q.try_into().unwrap();
            // SAFETY: 32 readable bytes (the array reference).
            unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
        })
        .collect();
    for (p, o) in out.iter_mut().enumerate().take(n_pos) {
        let row = &k[p * pos_bytes..p * pos_bytes + nb * B::BYTES];
        let mut acc = 0f32;
        for (i, b) in row.chunks_exact(B::BYTES).enumerate() {
            let isum = int_dot::<B>(ints::<B>(b), query[i]);
            acc += B::scale(b, s.qd[i], isum, s.qsum[i]);
        }
        *o = acc;
    }
}

/// Values `8k..8k + 8` of a block's integers as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen<B: KvBlock>(v: __m256i, k: usize) -> __m256 {
    let half = if k < 2 {
        _mm256_castsi256_si128(v)
    } else {
        _mm256_extracti128_si256::<1>(v)
    };
    let eight = if k.is_multiple_of(2) {
        half
    } else {
        _mm_srli_si128::<8>(half)
    };
    let ints = if signed::<B>() {
        _mm256_cvtepi8_epi32(eight)
    } else {
        _mm256_cvtepu8_epi32(eight)
    };
    _mm256_cvtepi32_ps(ints)
}

/// See [`KvPasses::values`].
#[target_feature(enable = "avx2,fma,f16c")]
fn values<B: KvBlock>(v: &[u8], pos_bytes: usize, w: &[f32], out: &mut [f32]) {
    let adds_min = matches!(B::INTS, Ints::Nibbles { .. });
    for (j, col) in out.chunks_exact_mut(QK).enumerate() {
        let col: &mut [f32; QK] = col.try_into().unwrap();
        // SAFETY: 32 readable f32 (the array reference).
        let mut acc: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(col.as_ptr().add(8 * k)) });
        for (p, &wp) in w.iter().enumerate() {
            let b = &v[p * pos_bytes + j * B::BYTES..][..B::BYTES];
            let (c, m) = B::coeffs(b, wp);
            let (c, m) = (_mm256_set1_ps(c), _mm256_set1_ps(m));
            let ints = ints::<B>(b);
            for (k, a) in acc.iter_mut().enumerate() {
                let t = _mm256_mul_ps(c, widen::<B>(ints, k));
                let t = if adds_min { _mm256_add_ps(t, m) } else { t };
                *a = _mm256_add_ps(*a, t);
            }
        }
        for (k, a) in acc.iter().enumerate() {
            // SAFETY: 32 writable f32 (the array reference).
            unsafe { _mm256_storeu_ps(col.as_mut_ptr().add(8 * k), *a) };
        }
    }
}
