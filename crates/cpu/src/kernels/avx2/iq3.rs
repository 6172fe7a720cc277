//! IQ3_XXS and IQ3_S (layouts in `powerinfer_core::dtype`) under AVX2: a 32-weight sub-block is
//! eight 4-weight codebook points, gathered from the grid by their indices in one
//! `vpgatherdd`, then signed by the sub-block's four sign bytes ([`apply_signs`]); the scales
//! are the core's (`powerinfer_core::dequantize_iq3`). The families' kernels come from
//! [`impl_lattice!`].

use super::lattice::{apply_signs, gather4, impl_lattice, per32};
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
    unsafe {
        let low = idx8(p.add(2 + 8 * s));
        let qh = _mm256_set1_epi32(*p.add(66 + s) as i32);
        let bit = _mm256_srlv_epi32(qh, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        let high = _mm256_slli_epi32::<8>(_mm256_and_si256(bit, _mm256_set1_epi32(1)));
        let v = gather4(&IQ3S_GRID, _mm256_or_si256(low, high));
        let signs = (p.add(74 + 4 * s) as *const u32).read_unaligned();
        apply_signs(v, u32::from_le(signs))
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

impl_lattice!(IQ3XXS, 98, per16 false, iq3xxs_factors, iq3xxs_sub);
impl_lattice!(IQ3S, 110, per16 false, iq3s_factors, iq3s_sub);
