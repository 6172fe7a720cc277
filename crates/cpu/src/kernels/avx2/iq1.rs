//! IQ1_S and IQ1_M (layouts in `powerinfer_core::dtype`) under AVX2: a 32-weight sub-block is
//! four 8-weight codebook points of values −1, 0, 1, gathered from the grid in one
//! `vpgatherdq`, then made the int8 values 8g ± 1 (the ±1/8 shift times 8;
//! `powerinfer_core::dequantize_iq1`) by a sign multiply of 8 and an add; the scales (dl / 8,
//! per 32 weights for IQ1_S, per 16 for IQ1_M) are the core's. The families' kernels come from
//! [`impl_lattice!`]; the int8-x products take [`super::lattice_x8`], which reads a sub-block
//! as the magnitudes |8g ± 1| with the values themselves as the signs put on x ([`abs_signs`]:
//! no value is 0).

use super::lattice::{gather8, impl_lattice, per16, per32};
use super::lattice_x8::{per16_lanes, per32_lanes};
use powerinfer_core::dequantize_iq1::{iq1m_scales, iq1s_qh, iq1s_scales};
use powerinfer_core::lattice_grids::IQ1S_GRID;
use std::arch::x86_64::*;

/// IQ1_S: f16 d, 32 low index bytes, 8 u16 of high bits, scale and shift sign.
pub(super) struct IQ1S;
/// IQ1_M: 32 low index bytes, 16 of high bits and shift signs, 8 of scales and the spread d.
pub(super) struct IQ1M;

/// The 32 values 8g + delta of four grid points (indices `idx`), `delta` ±1.
///
/// # Safety
/// Every index below 2,048; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn points8(idx: [i32; 4], delta: [i8; 4]) -> __m256i {
    // SAFETY: per the caller.
    let g = unsafe { gather8(&IQ1S_GRID, _mm_loadu_si128(idx.as_ptr().cast())) };
    let d = _mm256_setr_epi64x(
        i64::from_le_bytes([delta[0] as u8; 8]),
        i64::from_le_bytes([delta[1] as u8; 8]),
        i64::from_le_bytes([delta[2] as u8; 8]),
        i64::from_le_bytes([delta[3] as u8; 8]),
    );
    // 8·g for g in {−1, 0, 1} is g's sign times 8.
    _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), d)
}

/// IQ1_S's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block (50 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1s_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: the block's 50 bytes are readable per the caller; an index is 11 bits.
    unsafe {
        let b = std::slice::from_raw_parts(p, 50);
        let qh = iq1s_qh(b, s) as i32;
        let idx = std::array::from_fn(|l| b[2 + 4 * s + l] as i32 | ((qh >> (3 * l)) & 7) << 8);
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        points8(idx, [delta; 4])
    }
}

/// IQ1_S's scales as the families' factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1s_factors(b: &[u8]) -> [__m256; 2] {
    per32(iq1s_scales(b))
}

/// IQ1_M's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block (56 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1m_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: the block's 56 bytes are readable per the caller; an index is 11 bits.
    unsafe {
        let b = std::slice::from_raw_parts(p, 56);
        let nib = |l: usize| (b[32 + 2 * s + l / 2] >> (4 * (l % 2))) & 15;
        let idx = std::array::from_fn(|l| b[4 * s + l] as i32 | ((nib(l) & 7) as i32) << 8);
        let delta = std::array::from_fn(|l| if nib(l) & 8 != 0 { -1 } else { 1 });
        points8(idx, delta)
    }
}

/// IQ1_M's sixteen scales as the families' factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq1m_factors(b: &[u8]) -> [__m256; 2] {
    per16(iq1m_scales(b))
}

/// A sub-block's values `v` (8g ± 1, never 0) as the fused kernel's magnitudes and signs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn abs_signs(v: __m256i) -> (__m256i, __m256i) {
    (_mm256_abs_epi8(v), v)
}

/// The fused kernel's magnitudes and signs of four grid points: low index bytes `qs` (one per
/// point), high bits `high` (bits 8..11 of each lane's index, garbage elsewhere) and the points'
/// shifts `delta` (±1 bytes).
///
/// # Safety
/// The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn x8_points(qs: u32, high: __m128i, delta: __m256i) -> (__m256i, __m256i) {
    let low = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(qs as i32));
    let idx = _mm_or_si128(low, _mm_and_si128(high, _mm_set1_epi32(0x700)));
    // SAFETY: every index is 11 bits, below the grid's 2,048 points.
    let g = unsafe { gather8(&IQ1S_GRID, idx) };
    abs_signs(_mm256_add_epi8(
        _mm256_sign_epi8(_mm256_set1_epi8(8), g),
        delta,
    ))
}

/// The four little-endian bytes at `p` as a u32.
///
/// # Safety
/// 4 bytes readable at `p`.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: per the caller, unaligned.
    u32::from_le(unsafe { (p as *const u32).read_unaligned() })
}

/// The two little-endian bytes at `p` as a u32.
///
/// # Safety
/// 2 bytes readable at `p`.
#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u32 {
    // SAFETY: per the caller, unaligned.
    u16::from_le(unsafe { (p as *const u16).read_unaligned() }) as u32
}

/// IQ1_S's sub-block `s` for the fused int8-x kernel (its indices and shift in vectors).
///
/// # Safety
/// As for [`iq1s_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1s_x8(p: *const u8, s: usize) -> (__m256i, __m256i) {
    // SAFETY: the low index bytes at 2 + 4s and qh at 34 + 2s lie in the readable block.
    unsafe {
        let qh = u16_at(p.add(34 + 2 * s));
        // Point l's high bits are bits 3l..3l + 3 of qh: at 8.. after qh << 8 >> 3l.
        let high = _mm_srlv_epi32(_mm_set1_epi32((qh << 8) as i32), _mm_setr_epi32(0, 3, 6, 9));
        let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
        x8_points(u32_at(p.add(2 + 4 * s)), high, _mm256_set1_epi8(delta))
    }
}

/// IQ1_S's scales in the fused kernel's lanes.
///
/// # Safety
/// The block (50 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1s_x8_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: the block's bytes are readable per the caller.
    let d = iq1s_scales(unsafe { std::slice::from_raw_parts(p, 50) });
    // SAFETY: eight f32 on the stack, unaligned.
    per32_lanes(unsafe { _mm256_loadu_ps(d.as_ptr()) })
}

/// IQ1_M's sub-block `s` for the fused int8-x kernel (its indices and shifts in vectors).
///
/// # Safety
/// As for [`iq1m_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1m_x8(p: *const u8, s: usize) -> (__m256i, __m256i) {
    // SAFETY: the low index bytes at 4s and the four nibbles at 32 + 2s lie in the block.
    unsafe {
        let nib = u16_at(p.add(32 + 2 * s));
        // Point l's nibble is bits 4l..4l + 4: its low three the index's bits 8..11, its top
        // one the shift's sign.
        let high = _mm_srlv_epi32(
            _mm_set1_epi32((nib << 8) as i32),
            _mm_setr_epi32(0, 4, 8, 12),
        );
        let top = _mm256_srlv_epi64(
            _mm256_set1_epi64x(nib as i64),
            _mm256_setr_epi64x(3, 7, 11, 15),
        );
        let one = _mm256_set1_epi64x(1);
        let neg = _mm256_cmpeq_epi64(_mm256_and_si256(top, one), one);
        x8_points(
            u32_at(p.add(4 * s)),
            high,
            _mm256_or_si256(neg, _mm256_set1_epi8(1)),
        )
    }
}

/// IQ1_M's sixteen scales in the fused kernel's lanes.
///
/// # Safety
/// The block (56 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1m_x8_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: the block's bytes are readable per the caller.
    per16_lanes(&iq1m_scales(unsafe { std::slice::from_raw_parts(p, 56) }))
}

impl_lattice!(IQ1S, 50, per16 false, iq1s_factors, iq1s_sub, x8 iq1s_x8, iq1s_x8_scales);
impl_lattice!(IQ1M, 56, per16 true, iq1m_factors, iq1m_sub, x8 iq1m_x8, iq1m_x8_scales);
