//! The 2-bit lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S; layouts in `powerinfer_core::dtype`)
//! under AVX2: a 32-weight sub-block is four codebook points, each an 8-byte grid entry
//! (`powerinfer_core::lattice_grids`, values 8, 25, 43) gathered as one u64, and each point's
//! sign byte looked up as a u64 of byte masks that negate its weights ((g ^ m) − m): 32 signed
//! bytes in weight order, exact. From there a block is what a K-quant super-block is to the
//! generic families: eight 32-weight sub-blocks of signed int8 values and a scale per 32
//! (IQ2_XXS) or per 16 weights (IQ2_XS, IQ2_S, `PER16`), no mins. So the K-quant kernels take
//! them as a [`KFormat`] (the int16-x dot, the f32 dot, row accumulation, row decoding) and the
//! int8-x kernels as an [`Int8Format`] (each half's exact integer dot scaled after).
//!
//! The scales are db = d·(0.5 + ls)·0.25 in the core decoder's order of f32 operations, so the
//! decoded rows equal `powerinfer_core::dequantize_iq2` bit for bit.

use super::int8_formats::{Decoded, Int8Format, Mins};
use super::kquant::{Factors, KFormat};
use powerinfer_core::lattice_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS};
use std::arch::x86_64::*;

/// IQ2_XXS: f16 d, per sub-block four 8-bit grid indices and a u32 of signs and scale.
pub(super) struct IQ2XXS;
/// IQ2_XS: f16 d, 32 u16 of 9-bit grid index and 7-bit sign index, 8 scale bytes.
pub(super) struct IQ2XS;
/// IQ2_S: f16 d, 32 index bytes, 32 sign bytes, 8 bytes of index high bits, 8 scale bytes.
pub(super) struct IQ2S;

/// Little-endian u32 at `p`.
///
/// # Safety
/// 4 bytes readable at `p`.
#[inline(always)]
pub(super) unsafe fn u32_at(p: *const u8) -> u32 {
    // SAFETY: per the caller, unaligned.
    u32::from_le_bytes(unsafe { (p as *const [u8; 4]).read_unaligned() })
}

/// Grid entry `i` of `grid` as a u64 (its 8 bytes, one load).
#[inline(always)]
pub(super) fn entry(grid: &[[i8; 8]], i: usize) -> i64 {
    // SAFETY: grid[i] is 8 readable bytes (bounds-checked); unaligned read.
    i64::from_le(unsafe { (grid[i].as_ptr() as *const i64).read_unaligned() })
}

/// Each sign byte's 8 bits as 8 bytes, 0xFF where set (bit j: byte j), as one u64.
static SIGN_MASKS: [i64; 256] = {
    let mut t = [0i64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if b >> j & 1 == 1 {
                t[b] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// The byte mask of the 8 signs `s` (a sign byte: bit j negates weight j).
#[inline(always)]
fn mask(s: u8) -> i64 {
    SIGN_MASKS[s as usize]
}

/// The four points' grid entries `g` negated where the byte masks `m` are set (0xFF), as
/// (g ^ m) − m: two's complement negation where m = −1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed(g: [i64; 4], m: [i64; 4]) -> __m256i {
    let v = _mm256_setr_epi64x(g[0], g[1], g[2], g[3]);
    let m = _mm256_setr_epi64x(m[0], m[1], m[2], m[3]);
    _mm256_sub_epi8(_mm256_xor_si256(v, m), m)
}

/// IQ2_XXS's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn xxs_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: the sub-block's 8 bytes at 2 + 8s lie in the 66-byte block (s < 8).
    let (idx, aux) = unsafe { (u32_at(p.add(2 + 8 * s)), u32_at(p.add(6 + 8 * s))) };
    let g = std::array::from_fn(|l| entry(&IQ2XXS_GRID, (idx >> (8 * l)) as usize & 255));
    let m = std::array::from_fn(|l| mask(KSIGNS[(aux >> (7 * l)) as usize & 127]));
    signed(g, m)
}

/// IQ2_XS's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn xs_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: the four u16 at 2 + 8s lie in the 74-byte block (s < 8).
    let v: [u16; 4] = unsafe { (p.add(2 + 8 * s) as *const [u16; 4]).read_unaligned() };
    let v = v.map(u16::from_le);
    let g = std::array::from_fn(|l| entry(&IQ2XS_GRID, (v[l] & 511) as usize));
    let m = std::array::from_fn(|l| mask(KSIGNS[(v[l] >> 9) as usize]));
    signed(g, m)
}

/// IQ2_S's sub-block `s` (0..8) of the block at `p`.
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn s_sub(p: *const u8, s: usize) -> __m256i {
    // SAFETY: index bytes 2 + 4s.., sign bytes 34 + 4s.. and qh[s] at 66 + s lie in the
    // 82-byte block (s < 8).
    let (idx, signs, qh) = unsafe {
        (
            u32_at(p.add(2 + 4 * s)),
            u32_at(p.add(34 + 4 * s)),
            *p.add(66 + s) as usize,
        )
    };
    let g = std::array::from_fn(|l| {
        let high = (qh << (8 - 2 * l)) & 0x300;
        entry(&IQ2S_GRID, (idx >> (8 * l)) as usize & 255 | high)
    });
    signed(g, std::array::from_fn(|l| mask((signs >> (8 * l)) as u8)))
}

/// d·(0.5 + ls)·0.25 for the eight `ls` values, d the block's f16 at `p`.
///
/// # Safety
/// Two bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn db8(p: *const u8, ls: [u8; 8]) -> __m256 {
    // SAFETY: per the caller.
    let bits = unsafe { (p as *const [u8; 2]).read_unaligned() };
    let d = _mm256_set1_ps(half::f16::from_le_bytes(bits).to_f32());
    let l = ls.map(|v| v as f32);
    // SAFETY: 8 f32 on the stack.
    let l = unsafe { _mm256_loadu_ps(l.as_ptr()) };
    let half = _mm256_add_ps(_mm256_set1_ps(0.5), l);
    _mm256_mul_ps(_mm256_mul_ps(d, half), _mm256_set1_ps(0.25))
}

/// IQ2_XXS's per-32 scales (lane s: sub-block s), in `scale[0]`.
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn xxs_scales(p: *const u8) -> [__m256; 2] {
    // SAFETY: sub-block s's u32 of signs and scale at 6 + 8s (s < 8).
    let ls = std::array::from_fn(|s| (unsafe { u32_at(p.add(6 + 8 * s)) } >> 28) as u8);
    // SAFETY: d at 0.
    [unsafe { db8(p, ls) }, _mm256_setzero_ps()]
}

/// IQ2_XS's and IQ2_S's per-16 scales from the 8 scale bytes at `p + AT` (half 2s: the low
/// nibble of byte s, half 2s + 1 the high one; lane j of `scale[h]`: half 8h + j).
///
/// # Safety
/// The block readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_scales<const AT: usize>(p: *const u8) -> [__m256; 2] {
    // SAFETY: the 8 scale bytes at AT lie in the block.
    let b: [u8; 8] = unsafe { (p.add(AT) as *const [u8; 8]).read_unaligned() };
    let half = |h: usize| std::array::from_fn(|j| (b[4 * h + j / 2] >> (4 * (j % 2))) & 15);
    // SAFETY: d at 0.
    unsafe { [db8(p, half(0)), db8(p, half(1))] }
}

/// [`KFormat`] and [`Int8Format`] for an IQ2 format: its block bytes, whether its scales are
/// per 16, its sub-block decoder and its scales.
macro_rules! impl_iq2 {
    ($t:ty, $bytes:expr, per16 $per16:expr, $sub:expr, $scales:expr) => {
        impl KFormat for $t {
            const BYTES: usize = $bytes;
            const HAS_MIN: bool = false;
            const CHUNK: usize = 128;
            const PER16: bool = $per16;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8) -> Factors {
                Factors {
                    // SAFETY: the block is readable per the caller.
                    scale: unsafe { $scales(p) },
                    min: [_mm256_setzero_ps(); 2],
                }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 8] {
                let mut out = [_mm256_setzero_si256(); 8];
                for k in 0..4 {
                    // SAFETY: the block is readable per the caller; sub-block 4c + k < 8.
                    let v = unsafe { $sub(p, 4 * c + k) };
                    out[2 * k] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
                    out[2 * k + 1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(v));
                }
                out
            }
        }

        impl Int8Format for $t {
            const CHUNK_BYTES: usize = $bytes;
            const BLOCK_BYTES: usize = 0;
            const SIGNED: bool = true;
            const BIAS: i32 = 0;
            const PER16: bool = $per16;
            const MINS: Mins = Mins::None;
            const BLOCKWISE: bool = false;

            unsafe fn block(_p: *const u8, _k: usize) -> __m256i {
                unreachable!("an IQ2 block decodes whole")
            }

            unsafe fn factors(_p: *const u8, _n: usize) -> (__m256, __m256) {
                unreachable!("an IQ2 block decodes whole")
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, _n: usize) -> Decoded {
                let mut v = [_mm256_setzero_si256(); 8];
                for (k, vk) in v.iter_mut().enumerate() {
                    // SAFETY: the block is readable per the caller; sub-block k < 8.
                    *vk = unsafe { $sub(p, k) };
                }
                Decoded {
                    q: v,
                    // SAFETY: the block is readable per the caller.
                    scale: unsafe { $scales(p) },
                    min: [_mm256_setzero_ps(); 2],
                }
            }
        }
    };
}

impl_iq2!(IQ2XXS, 66, per16 false, xxs_sub, xxs_scales);
impl_iq2!(IQ2XS, 74, per16 true, xs_sub, nibble_scales::<66>);
impl_iq2!(IQ2S, 82, per16 true, s_sub, nibble_scales::<74>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_row, Rng};
    use powerinfer_core::dequantize_iq2::unpack_iq2;
    use powerinfer_core::DType;

    /// Every sub-block's bytes and every scale equal the core's scalar unpacking, on random
    /// blocks of each format.
    #[test]
    fn sub_blocks_and_scales_equal_the_core() {
        if !crate::simd::detect().is_x86_simd() {
            return;
        }
        let mut rng = Rng::new(91);
        for dtype in DType::LATTICE_IQ2 {
            for _ in 0..40 {
                let b = random_row(&mut rng, dtype, 256);
                let (mut d, mut q) = ([0f32; 16], [0i8; 256]);
                unpack_iq2(dtype, &b, &mut d, &mut q);
                // SAFETY: AVX2 checked above; b is one whole block.
                let (subs, scales) = unsafe { decode_both(dtype, b.as_ptr()) };
                assert_eq!(subs, q, "{dtype} values");
                let want: Vec<u32> = d.iter().map(|v| v.to_bits()).collect();
                assert_eq!(scales.map(f32::to_bits).to_vec(), want, "{dtype} scales");
            }
        }
    }

    /// The 256 values and 16 per-half scales of the block at `p`, through the int8 decoder.
    ///
    /// # Safety
    /// One block of `dtype` readable at `p`; AVX2.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode_both(dtype: DType, p: *const u8) -> ([i8; 256], [f32; 16]) {
        // SAFETY: per the caller.
        let dec = unsafe {
            match dtype {
                DType::IQ2_XXS => <IQ2XXS as Int8Format>::decode(p, 8),
                DType::IQ2_XS => <IQ2XS as Int8Format>::decode(p, 8),
                _ => <IQ2S as Int8Format>::decode(p, 8),
            }
        };
        let mut q = [0i8; 256];
        for (k, v) in dec.q.iter().enumerate() {
            // SAFETY: 32 bytes of q at 32k, k < 8.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(32 * k).cast(), *v) };
        }
        let (mut s, mut lanes) = ([0f32; 16], [0f32; 16]);
        // SAFETY: 16 f32 on the stack.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), dec.scale[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), dec.scale[1]);
        }
        for (h, sh) in s.iter_mut().enumerate() {
            *sh = match dtype {
                DType::IQ2_XXS => lanes[h / 2],
                _ => lanes[h],
            };
        }
        (q, s)
    }
}
