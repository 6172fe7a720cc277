//! IQ3_XXS and IQ3_S (layouts in `powerinfer_core::dtype`) under AVX2: a 32-weight sub-block is
//! eight 4-weight codebook points, gathered from the grid by their indices in one
//! `vpgatherdd`, then signed by the sub-block's four sign bytes ([`apply_signs`]); the scales
//! are the core's (`powerinfer_core::dequantize_iq3`). The families' kernels come from
//! [`impl_lattice!`]; the int8-x products take [`super::lattice_x8`], which reads a sub-block
//! as its gathered grid bytes (all positive) and ±1 sign bytes put on x ([`iq3xxs_x8`],
//! [`iq3s_x8`]), the scales computed in vectors.

use super::lattice::{apply_signs, gather4, impl_lattice, per32, sign_bytes};
use super::lattice_x8::{f16_at, per32_lanes};
use powerinfer_core::dequantize_iq3::{iq3s_scales, iq3xxs_aux, iq3xxs_scales};
use powerinfer_core::lattice_grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use std::arch::x86_64::*;

/// IQ3_XXS: f16 d, 64 index bytes, 32 bytes of signs and scales.
pub(super) struct IQ3XXS;
/// IQ3_S: f16 d, 64 low index bytes, 8 of high bits, 32 of signs, 4 of scales.
pub(super) struct IQ3S;

/// Eight index bytes at `p` as eight i32 lanes.
///
/// # Safety
/// 8 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn idx8(p: *const u8) -> __m256i {
    // SAFETY: per the caller.
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())) }
}

/// Each of the 128 sign indices of IQ3_XXS (`KSIGNS`: seven bits and their parity as the
/// eighth) as 8 sign bytes in a u64: 0xFF (−1) where the bit is set, else 1.
static SIGN_BYTES: [i64; 128] = {
    let mut t = [0i64; 128];
    let mut i = 0;
    while i < 128 {
        let bits = i as u64 | ((i as u32).count_ones() as u64 & 1) << 7;
        let mut j = 0;
        while j < 8 {
            t[i] |= (if bits >> j & 1 == 1 { 0xFF } else { 1 }) << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// The 4-byte little-endian word at `p`.
///
/// # Safety
/// 4 bytes readable at `p`.
#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: per the caller, unaligned.
    u32::from_le(unsafe { (p as *const u32).read_unaligned() })
}

/// IQ3_XXS's sub-block `s` for the fused int8-x kernel: its eight grid points (positive bytes)
/// and the sign bytes of its four 7-bit sign indices.
///
/// # Safety
/// As for [`iq3xxs_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3xxs_x8(p: *const u8, s: usize) -> (__m256i, __m256i) {
    // SAFETY: as in `iq3xxs_sub`; a sign index is 7 bits, inside the table.
    unsafe {
        let aux = u32_at(p.add(66 + 4 * s)) as usize;
        let sign = |l: usize| *SIGN_BYTES.get_unchecked((aux >> (7 * l)) & 127);
        let g = _mm256_setr_epi64x(sign(0), sign(1), sign(2), sign(3));
        (gather4(&IQ3XXS_GRID, idx8(p.add(2 + 8 * s))), g)
    }
}

/// IQ3_XXS's scales d·(0.5 + ls)·0.5 (the core's bits: the same operations in f32) in the fused
/// kernel's lanes, from the eight sign-and-scale words at once.
///
/// # Safety
/// The block (98 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3xxs_x8_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: d at 0, the eight words at 66..98.
    let (d, aux) = unsafe { (f16_at(p), _mm256_loadu_si256(p.add(66).cast())) };
    let ls = _mm256_cvtepi32_ps(_mm256_srli_epi32::<28>(aux));
    let half = _mm256_set1_ps(0.5);
    let v = _mm256_mul_ps(
        _mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(half, ls)),
        half,
    );
    per32_lanes(v)
}

/// IQ3_S's sub-block `s` for the fused int8-x kernel: its eight grid points (positive bytes) and
/// its four sign bytes spread.
///
/// # Safety
/// As for [`iq3s_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3s_x8(p: *const u8, s: usize) -> (__m256i, __m256i) {
    // SAFETY: as in `iq3s_sub`.
    unsafe { (iq3s_points(p, s), sign_bytes(u32_at(p.add(74 + 4 * s)))) }
}

/// IQ3_S's scales d·(1 + 2·sc) (the core's bits) in the fused kernel's lanes, the eight 4-bit
/// sc from one word.
///
/// # Safety
/// The block (110 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3s_x8_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: d at 0, the scale nibbles at 106..110.
    let (d, word) = unsafe { (f16_at(p), u32_at(p.add(106))) };
    let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let sc = _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts);
    let sc = _mm256_and_si256(sc, _mm256_set1_epi32(15));
    let odd = _mm256_add_epi32(_mm256_slli_epi32::<1>(sc), _mm256_set1_epi32(1));
    per32_lanes(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd)))
}

/// IQ3_XXS's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block (98 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3xxs_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: the sub-block's index bytes lie at 2 + 8s .. + 8 of the readable block, its
    // sign word at 66 + 4s .. + 4; every index byte is below the grid's 256 points.
    unsafe {
        let b = std::slice::from_raw_parts(p, 98);
        let aux = iq3xxs_aux(b, s);
        let sign = |l: u32| (KSIGNS[((aux >> (7 * l)) & 127) as usize] as u32) << (8 * l);
        let v = gather4(&IQ3XXS_GRID, idx8(p.add(2 + 8 * s)));
        apply_signs(v, sign(0) | sign(1) | sign(2) | sign(3))
    }
}

/// IQ3_S's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block (110 bytes) readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3s_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: index bytes at 2 + 8s, the high bits at 66 + s, the signs at 74 + 4s, all inside
    // the readable block; an index is at most 511, inside the 512 points.
    unsafe { apply_signs(iq3s_points(p, s), u32_at(p.add(74 + 4 * s))) }
}

/// IQ3_S's sub-block `s`'s eight grid points, unsigned (9-bit indices: the low byte and a bit
/// of the sub-block's high byte).
///
/// # Safety
/// As for [`iq3s_sub`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3s_points(p: *const u8, s: usize) -> __m256i {
    // SAFETY: index bytes at 2 + 8s, the high bits at 66 + s, inside the readable block; an
    // index is at most 511, inside the 512 points.
    unsafe {
        let low = idx8(p.add(2 + 8 * s));
        let qh = _mm256_set1_epi32(*p.add(66 + s) as i32);
        let bit = _mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        let high = _mm256_slli_epi32::<8>(_mm256_and_si256(bit, _mm256_set1_epi32(1)));
        gather4(&IQ3S_GRID, _mm256_or_si256(low, high))
    }
}

/// IQ3_XXS's scales as the families' factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3xxs_factors(b: &[u8]) -> [__m256; 2] {
    per32(iq3xxs_scales(b))
}

/// IQ3_S's scales as the families' factors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq3s_factors(b: &[u8]) -> [__m256; 2] {
    per32(iq3s_scales(b))
}

impl_lattice!(IQ3XXS, 98, per16 false, iq3xxs_factors, iq3xxs_sub,
    x8 iq3xxs_x8, iq3xxs_x8_scales);
impl_lattice!(IQ3S, 110, per16 false, iq3s_factors, iq3s_sub, x8 iq3s_x8, iq3s_x8_scales);

#[cfg(test)]
mod tests {
    use super::*;

    /// The sign bytes are `KSIGNS`' bits: −1 where set, 1 elsewhere.
    #[test]
    fn sign_bytes_are_the_ksigns_bits() {
        for (i, &t) in SIGN_BYTES.iter().enumerate() {
            let want: [i8; 8] = std::array::from_fn(|j| 1 - 2 * ((KSIGNS[i] >> j) & 1) as i8);
            assert_eq!(t.to_le_bytes().map(|b| b as i8), want, "index {i}");
        }
    }
}
