//! The 512-bit form of the K-quants' int16-x dot ([`super::kquant::rows_i16`]), taken on the
//! AVX-512 level. A super-block's quants come out 32 at a time, one 32-weight block per vector
//! ([`WideK::chunk32`]); each block's exact integer Σq·x is one `vpdpwssd`-shaped product
//! against x's 32 i16, which also adds the format's constant bias (Q6_K's −32) from a start
//! value computed once per block for all rows; then one conversion and one FMA per block-row,
//! with d·sc·s_x broadcast (Q4_K, Q5_K) or, for the formats scaled per 16 weights, two scales
//! in the vector's two halves. Q4_K and Q5_K decode 64 weights from one 32-byte widening load,
//! Q5_K's fifth bits enter through mask registers, and Q6_K decodes 128 weights from three;
//! Q2_K and Q3_K pair the AVX2 decoder's 16-weight vectors.

use super::int16::XQuant;
use super::kquant::{half_factors, superblock_x, KFormat, Q2K, Q3K, Q4K, Q5K, Q6K, QK};
use std::arch::x86_64::*;

/// A K-quant's quants as 512-bit vectors.
pub(super) trait WideK: KFormat {
    /// Subtracted from every quant (Q6_K: 32), in the dot's integer start; 0 when
    /// [`WideK::chunk32`] applies the format's offset itself.
    const BIAS: i16;

    /// The quants of weights `CHUNK·c .. CHUNK·(c + 1)` as i16, 32 per vector in weight order
    /// (the first `CHUNK / 32` vectors), before `BIAS`. The default pairs the AVX2 decoder's
    /// vectors.
    ///
    /// # Safety
    /// `BYTES` readable at `p`, `c < 256 / CHUNK`; the CPU has the AVX-512 level.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn chunk32(p: *const u8, c: usize) -> [__m512i; 4] {
        // SAFETY: forwarded from the caller.
        let q = unsafe { Self::chunk(p, c) };
        let pair =
            |v: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q[2 * v]), q[2 * v + 1]);
        [pair(0), pair(1), pair(2), pair(3)]
    }

    /// For the formats scaled per 32 weights (not `PER16`): d·sc and dmin·m of the eight
    /// 32-blocks (the latter zero without mins). The default takes them from
    /// [`KFormat::factors`].
    ///
    /// # Safety
    /// As for [`WideK::chunk32`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn factors8(p: *const u8) -> (__m256, __m256) {
        // SAFETY: forwarded from the caller.
        let f = unsafe { Self::factors(p) };
        // The mins are per 16-weight half, each 32-block's twice: keep the even lanes.
        let even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        let lo = _mm256_permutevar8x32_ps(f.min[0], even);
        let hi = _mm256_permutevar8x32_ps(f.min[1], even);
        (f.scale[0], _mm256_blend_ps::<0xF0>(lo, hi))
    }
}

impl WideK for Q2K {
    const BIAS: i16 = 0;
}

impl WideK for Q3K {
    const BIAS: i16 = 0;
}

/// 32 bytes at `p` zero-extended to 32 i16 lanes.
///
/// # Safety
/// 32 bytes readable at `p`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn bytes32(p: *const u8) -> __m512i {
    // SAFETY: 32 readable bytes per the caller, unaligned.
    _mm512_cvtepu8_epi16(unsafe { _mm256_loadu_si256(p.cast()) })
}

/// Q4_K and Q5_K's nibbles of weights 64c .. 64c + 64 (`qs` at `p + QS`): the low nibbles of
/// the 32 bytes are the first 32-block, the high nibbles the second.
///
/// # Safety
/// The block's bytes are readable at `p`, `c < 4`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles64<const QS: usize>(p: *const u8, c: usize) -> [__m512i; 2] {
    // SAFETY: the 32 nibble bytes of chunk c lie at QS + 32c inside the block.
    let w = unsafe { bytes32(p.add(QS + 32 * c)) };
    [
        _mm512_and_si512(w, _mm512_set1_epi16(15)),
        _mm512_srli_epi16::<4>(w),
    ]
}

/// Q4_K and Q5_K's d·sc and dmin·m per 32-block (see `super::kquant`'s `factors_q45`, whose
/// bit layout this follows): d and dmin converted together, the 6-bit fields split with
/// whole-word masks.
///
/// # Safety
/// The block's first 16 bytes are readable at `p`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn factors8_q45(p: *const u8) -> (__m256, __m256) {
    // SAFETY: d, dmin and the 12 scale bytes are the block's first 16 bytes.
    let (dm, w) = unsafe {
        (
            (p as *const i32).read_unaligned(),
            (p.add(4) as *const [u32; 3]).read_unaligned(),
        )
    };
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    let (d, dmin) = (
        _mm256_broadcastss_ps(dm),
        _mm256_broadcastss_ps(_mm_movehdup_ps(dm)),
    );
    let (low6, low4, top2) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let sc = [w[0] & low6, (w[2] & low4) | (((w[0] >> 6) & top2) << 4)];
    let mn = [
        w[1] & low6,
        ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4),
    ];
    let f = |v: [u32; 2]| {
        let bytes = _mm_cvtsi64_si128(((v[1] as u64) << 32 | v[0] as u64) as i64);
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
    };
    (_mm256_mul_ps(f(sc), d), _mm256_mul_ps(f(mn), dmin))
}

/// Q4_K and Q5_K's quants of weights 64c .. 64c + 64 as two 32-blocks (each twice, filling the
/// four vectors): the nibbles at `p + QS`, with `FIFTH` (Q5_K) each one's fifth bit from the 32
/// qh bytes at 16.
///
/// # Safety
/// The block's bytes are readable at `p`, `c < 4`; the CPU has the AVX-512 level.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn chunk32_q45<const QS: usize, const FIFTH: bool>(p: *const u8, c: usize) -> [__m512i; 4] {
    // SAFETY: the nibbles of chunk c, and Q5_K's qh bytes, lie inside the readable block.
    unsafe {
        let [mut a, mut b] = nibbles64::<QS>(p, c);
        if FIFTH {
            let qh = _mm256_loadu_si256(p.add(16).cast());
            // Weight i of 32-block j has its fifth bit at bit j of qh[i].
            let bit = |j: usize| _mm256_test_epi8_mask(qh, _mm256_set1_epi8(1 << j));
            let sixteen = _mm512_set1_epi16(16);
            a = _mm512_mask_add_epi16(a, bit(2 * c), a, sixteen);
            b = _mm512_mask_add_epi16(b, bit(2 * c + 1), b, sixteen);
        }
        [a, b, a, b]
    }
}

/// [`WideK`] for Q4_K (nibbles at 16) and Q5_K (nibbles at 48 after the qh bytes: `$fifth`).
macro_rules! impl_wide_q45 {
    ($t:ty, $qs:expr, $fifth:expr) => {
        impl WideK for $t {
            const BIAS: i16 = 0;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn factors8(p: *const u8) -> (__m256, __m256) {
                // SAFETY: forwarded.
                unsafe { factors8_q45(p) }
            }

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn chunk32(p: *const u8, c: usize) -> [__m512i; 4] {
                // SAFETY: forwarded.
                unsafe { chunk32_q45::<$qs, $fifth>(p, c) }
            }
        }
    };
}
impl_wide_q45!(Q4K, 16, false);
impl_wide_q45!(Q5K, 48, true);

impl WideK for Q6K {
    const BIAS: i16 = 32;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn chunk32(p: *const u8, n: usize) -> [__m512i; 4] {
        // SAFETY: ql (64n..64n + 64) and qh (128 + 32n..) lie inside the readable block.
        let (a, b, h) = unsafe {
            (
                bytes32(p.add(64 * n)),
                bytes32(p.add(64 * n + 32)),
                bytes32(p.add(128 + 32 * n)),
            )
        };
        let low = _mm512_set1_epi16(15);
        let two = _mm512_set1_epi16(0x30);
        // l | (t & 0x30): bits 2k..2k + 2 of qh moved to bits 4..6.
        let join = |l: __m512i, t: __m512i| _mm512_ternarylogic_epi32::<0xF8>(l, t, two);
        [
            join(_mm512_and_si512(a, low), _mm512_slli_epi16::<4>(h)),
            join(_mm512_and_si512(b, low), _mm512_slli_epi16::<2>(h)),
            join(_mm512_srli_epi16::<4>(a), h),
            join(_mm512_srli_epi16::<4>(b), _mm512_srli_epi16::<2>(h)),
        ]
    }
}

/// The f32 at `p` in all sixteen lanes, by a broadcasting load: the scales are stored once per
/// super-block and read back one load per block-row (LLVM otherwise forwards the stored vector
/// and broadcasts each lane with two shuffles, which cost vector issue slots the load does not).
///
/// # Safety
/// Four bytes readable at `p`, 4-aligned; the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn broadcast(p: *const f32) -> __m512 {
    let v: __m512;
    // SAFETY: four readable bytes per the caller; the asm only loads.
    unsafe {
        std::arch::asm!("vbroadcastss {v}, dword ptr [{p}]", v = out(zmm_reg) v, p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags));
    }
    v
}

/// out[i] = dot(row i, x) for the `R` K-quant rows starting at `p[i]`, on the int16 x; with
/// `FETCH`, the rows at `next[i]` are fetched into the cache block by block alongside.
///
/// # Safety
/// `xq.blocks() / 8` super-blocks readable at each `p[i]` (`xq.blocks()` a multiple of 8);
/// `out.len() >= R`; the CPU has the AVX-512 level. `next` may hold any addresses.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_i16<K: WideK, const R: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [_mm512_setzero_ps(); R];
    // Σ min·Σx over the 16-weight halves, two 8-lane vectors per row.
    let mut mins = [[_mm256_setzero_ps(); 2]; R];
    let (xp, sum32) = (xq.q.as_ptr(), xq.sum.as_ptr());
    for sb in 0..xq.blocks() / 8 {
        // SAFETY: super-block sb of each row is readable per the caller; xq holds 256 values,
        // 8 scales and 16 sums per super-block.
        unsafe {
            let (s, x16) = superblock_x::<K, R, FETCH>(next, xq, sb);
            let x32 = _mm256_loadu_ps(sum32.add(8 * sb));
            let xs = xp.add(QK * sb);
            let xv: [__m512i; 8] =
                std::array::from_fn(|b| _mm512_loadu_si512(xs.add(32 * b).cast()));
            let start: [__m512i; 8] = std::array::from_fn(|b| match K::BIAS {
                0 => _mm512_setzero_si512(),
                bias => _mm512_madd_epi16(xv[b], _mm512_set1_epi16(-bias)),
            });
            for (i, (a, m)) in acc.iter_mut().zip(mins.iter_mut()).enumerate() {
                let blk = p[i].add(sb * K::BYTES);
                // d·sc·s_x per 32-block (lanes 0..8) or per 16-weight half (0..16).
                let mut ds = [0f32; 16];
                if K::PER16 {
                    let f = K::factors(blk);
                    ds = half_factors(f.scale, s);
                    if K::HAS_MIN {
                        m[0] = _mm256_fnmadd_ps(f.min[0], x16[0], m[0]);
                        m[1] = _mm256_fnmadd_ps(f.min[1], x16[1], m[1]);
                    }
                } else {
                    let (scale, min) = K::factors8(blk);
                    _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(scale, s));
                    if K::HAS_MIN {
                        m[0] = _mm256_fnmadd_ps(min, x32, m[0]);
                    }
                }
                let per = K::CHUNK / 32;
                for c in 0..QK / K::CHUNK {
                    let q = K::chunk32(blk, c);
                    for (v, &qv) in q.iter().enumerate().take(per) {
                        let b = per * c + v;
                        let dot = match K::BIAS {
                            0 => _mm512_madd_epi16(qv, xv[b]),
                            _ => _mm512_dpwssd_epi32(start[b], qv, xv[b]),
                        };
                        let t = _mm512_cvtepi32_ps(dot);
                        // Lanes 0..8 hold weights 0..16 of the block, lanes 8..16 weights 16..32.
                        let d = match K::PER16 {
                            true => _mm512_mask_broadcastss_ps(
                                broadcast(ds.as_ptr().add(2 * b)),
                                0xFF00,
                                _mm_set_ss(ds[2 * b + 1]),
                            ),
                            false => broadcast(ds.as_ptr().add(b)),
                        };
                        *a = _mm512_fmadd_ps(d, t, *a);
                    }
                }
            }
        }
    }
    for ((a, m), o) in acc.iter().zip(&mins).zip(out.iter_mut()) {
        *o = _mm512_reduce_add_ps(*a) + super::reduce::hsum(_mm256_add_ps(m[0], m[1]));
    }
}
