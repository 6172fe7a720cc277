//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) under AVX2: each format only says how one
//! 256-weight super-block unpacks into sixteen vectors of i16 quants plus f32 factors
//! ([`KFormat::unpack`]); the kernels (int16-x dot, f32 dot, row accumulation, row decoding)
//! are written once over that.
//!
//! Unpacked, weight i of a super-block is `scale[i / 16]·q[i] − min[i / 16]` with q the
//! quants (Q3_K's −4 and Q6_K's −32 applied in integers). In the int16 dot
//! each 32-block's exact integer Σq·x is scaled once by d·sc·s_x (Q4_K, Q5_K: one scale per 32
//! weights), or each 16-weight half by its own (Q2_K, Q3_K, Q6_K: `PER16`); the mins enter as
//! Σ min·Σx over the 16-weight halves (x's sums in f32).

use super::int16::XQuant;
use super::reduce::hsum;
use super::row_group::{fetch_lines, RowGroup};
use powerinfer_core::dequantize::k3_scale;
use std::arch::x86_64::*;

/// Weights per super-block.
pub(super) const QK: usize = 256;

/// One super-block unpacked (see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Unpacked {
    /// Weights 16k..16k + 16 as i16.
    q: [__m256i; 16],
    /// Per 16-weight half-block: the factor of q.
    scale: [f32; 16],
    /// Per 16-weight half-block: the value subtracted (dmin·min); zeros when `HAS_MIN` is false.
    min: [f32; 16],
}

impl Unpacked {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new() -> Unpacked {
        Unpacked {
            q: [_mm256_setzero_si256(); 16],
            scale: [0.0; 16],
            min: [0.0; 16],
        }
    }

    /// Weights 8k..8k + 8 as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn weights8(&self, k: usize) -> __m256 {
        let v = self.q[k / 2];
        let half = match k % 2 {
            0 => _mm256_castsi256_si128(v),
            _ => _mm256_extracti128_si256::<1>(v),
        };
        let q = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(half));
        let w = _mm256_mul_ps(q, _mm256_set1_ps(self.scale[k / 2]));
        _mm256_sub_ps(w, _mm256_set1_ps(self.min[k / 2]))
    }
}

/// A super-block's f32 factors: `scale` per 16-weight half-block (two vectors of 8) for the
/// `PER16` formats, else per 32-weight block in `scale[0]`; `min` per 16-weight half-block
/// (zeros when the format has no mins).
#[derive(Clone, Copy)]
pub(super) struct Factors {
    pub(super) scale: [__m256; 2],
    pub(super) min: [__m256; 2],
}

/// Lanes 0..4 (`lo`) or 4..8 (`hi`) of `v`, each twice: per-32 values as per-16 ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn twice(v: __m256) -> [__m256; 2] {
    let lo = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    let hi = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    [
        _mm256_permutevar8x32_ps(v, lo),
        _mm256_permutevar8x32_ps(v, hi),
    ]
}

/// A K-quant format: its block size and how a block decodes, in chunks of weights that the
/// kernels consume straight from registers.
pub(super) trait KFormat {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Whether the format subtracts per-sub-block mins.
    const HAS_MIN: bool;
    /// Weights per [`KFormat::chunk`] (64 or 128: what one pass over the packed bytes yields).
    const CHUNK: usize;
    /// Whether the scales are per 16 weights (else per 32).
    const PER16: bool;

    /// The super-block's factors.
    ///
    /// # Safety
    /// `BYTES` bytes readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn factors(p: *const u8) -> Factors;

    /// The i16 quants of weights `CHUNK·c .. CHUNK·(c + 1)`, 16 per vector in weight order (the
    /// first `CHUNK / 16` vectors; the rest are zero).
    ///
    /// # Safety
    /// As for [`KFormat::factors`], with `c < 256 / CHUNK`.
    unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 8];

    /// Unpack the whole super-block at `p` into `u`.
    ///
    /// # Safety
    /// As for [`KFormat::factors`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: forwarded from the caller; c < 256 / CHUNK.
        unsafe {
            let f = Self::factors(p);
            let scale = if Self::PER16 {
                f.scale
            } else {
                twice(f.scale[0])
            };
            _mm256_storeu_ps(u.scale.as_mut_ptr(), scale[0]);
            _mm256_storeu_ps(u.scale.as_mut_ptr().add(8), scale[1]);
            _mm256_storeu_ps(u.min.as_mut_ptr(), f.min[0]);
            _mm256_storeu_ps(u.min.as_mut_ptr().add(8), f.min[1]);
            let n = Self::CHUNK / 16;
            for c in 0..QK / Self::CHUNK {
                let q = Self::chunk(p, c);
                u.q[n * c..n * (c + 1)].copy_from_slice(&q[..n]);
            }
        }
    }
}

/// Q2_K (see `powerinfer_core::dtype`).
pub(super) struct Q2K;
/// Q3_K.
pub(super) struct Q3K;
/// Q4_K.
pub(super) struct Q4K;
/// Q5_K.
pub(super) struct Q5K;
/// Q6_K.
pub(super) struct Q6K;

/// Sixteen bytes at `p` zero-extended to sixteen i16 lanes, by the load form of `vpmovzxbw`
/// (LLVM would otherwise split it into a load and the slow register form; see
/// `super::quant::QuantFormat::quants16`).
///
/// # Safety
/// 16 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes16(p: *const u8) -> __m256i {
    let words: __m256i;
    // SAFETY: 16 readable bytes per the caller; the asm only loads.
    unsafe {
        std::arch::asm!("vpmovzxbw {w}, xmmword ptr [{p}]", w = out(ymm_reg) words, p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags));
    }
    words
}

/// The little-endian f16 at `p` as f32.
///
/// # Safety
/// 2 bytes readable at `p`.
#[inline]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes per the caller.
    half::f16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
}

/// The 2-bit field at bit `2j` of each i16 lane of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn crumb(v: __m256i, j: usize) -> __m256i {
    let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi16(3))
}

/// `value` in the lanes of `v` that have bit `bit` set, zero elsewhere.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_to(v: __m256i, bit: usize, value: i16) -> __m256i {
    let m = _mm256_set1_epi16(1 << bit);
    let set = _mm256_cmpeq_epi16(_mm256_and_si256(v, m), m);
    _mm256_and_si256(set, _mm256_set1_epi16(value))
}

/// Eight u8 (the low 8 bytes of `v`) as f32 times `k`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bytes8_times(v: __m128i, k: f32) -> __m256 {
    _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_set1_ps(k),
    )
}

/// Sixteen i8 at `p` as two 8-lane f32 vectors.
///
/// # Safety
/// 16 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8x16_f32(p: *const u8) -> [__m256; 2] {
    // SAFETY: 16 readable bytes per the caller.
    let v = unsafe { _mm_loadu_si128(p as *const __m128i) };
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(v))),
    ]
}

impl KFormat for Q2K {
    const BYTES: usize = 84;
    const HAS_MIN: bool = true;
    const CHUNK: usize = 128;
    const PER16: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(p: *const u8) -> Factors {
        // SAFETY: the 16 scale bytes lead the block, d and dmin sit at 80 and 82.
        unsafe {
            let raw = _mm_loadu_si128(p as *const __m128i);
            let low = _mm_set1_epi8(15);
            let (sc, m) = (
                _mm_and_si128(raw, low),
                _mm_and_si128(_mm_srli_epi16::<4>(raw), low),
            );
            let (d, dmin) = (half(p.add(80)), half(p.add(82)));
            let high = |v: __m128i| _mm_srli_si128::<8>(v);
            Factors {
                scale: [bytes8_times(sc, d), bytes8_times(high(sc), d)],
                min: [bytes8_times(m, dmin), bytes8_times(high(m), dmin)],
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(p: *const u8, n: usize) -> [__m256i; 8] {
        let mut out = [_mm256_setzero_si256(); 8];
        // SAFETY: quant bytes 16 + 32n.. of the readable block.
        unsafe {
            for h in 0..2 {
                let qs = bytes16(p.add(16 + 32 * n + 16 * h));
                for j in 0..4 {
                    out[2 * j + h] = crumb(qs, j);
                }
            }
        }
        out
    }
}

impl KFormat for Q3K {
    const BYTES: usize = 110;
    const HAS_MIN: bool = false;
    const CHUNK: usize = 128;
    const PER16: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(p: *const u8) -> Factors {
        // SAFETY: the 12 scale bytes sit at 96, d at 108 of the readable block.
        let (sc, d) = unsafe {
            (
                (p.add(96) as *const [u8; 12]).read_unaligned(),
                half(p.add(108)),
            )
        };
        let s: [i8; 16] = std::array::from_fn(|s| (k3_scale(s, &sc) as i32 - 32) as i8);
        // SAFETY: `s` is 16 readable bytes.
        signed_scales(unsafe { i8x16_f32(s.as_ptr() as *const u8) }, d)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(p: *const u8, n: usize) -> [__m256i; 8] {
        let mut out = [_mm256_setzero_si256(); 8];
        // SAFETY: hmask and the quant bytes from 32 are readable.
        unsafe {
            for h in 0..2 {
                let qs = bytes16(p.add(32 + 32 * n + 16 * h));
                let hm = bytes16(p.add(16 * h));
                for j in 0..4 {
                    // q = low − 4 where the high bit is clear: low + 4·high − 4.
                    let q = _mm256_add_epi16(crumb(qs, j), bit_to(hm, 4 * n + j, 4));
                    out[2 * j + h] = _mm256_sub_epi16(q, _mm256_set1_epi16(4));
                }
            }
        }
        out
    }
}

/// Q3_K and Q6_K's factors: their sixteen signed per-16 scales `sc` (as f32) times `d`, no mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn signed_scales([a, b]: [__m256; 2], d: f32) -> Factors {
    let d = _mm256_set1_ps(d);
    Factors {
        scale: [_mm256_mul_ps(a, d), _mm256_mul_ps(b, d)],
        min: [_mm256_setzero_ps(); 2],
    }
}

/// Q4_K and Q5_K's factors: the eight 6-bit scales and mins of the 12 bytes at `p + 4`, split
/// with whole-word masks (bytes 0..4 of the result: sub-blocks 0..4, from the low 6 bits of
/// sm[0..4] / sm[4..8]; bytes 4..8: sub-blocks 4..8, low 4 bits from sm[8..12], high 2 bits from
/// the top bits of sm[0..4] / sm[4..8]), times d and dmin.
///
/// # Safety
/// The block's first 16 bytes are readable at `p`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn factors_q45(p: *const u8) -> Factors {
    // SAFETY: d, dmin and the 12 scale bytes are the block's first 16 bytes.
    let (d, dmin, w) = unsafe {
        (
            half(p),
            half(p.add(2)),
            (p.add(4) as *const [u32; 3]).read_unaligned(),
        )
    };
    let (low6, low4, top2) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let scales = [w[0] & low6, (w[2] & low4) | (((w[0] >> 6) & top2) << 4)];
    let mins = [
        w[1] & low6,
        ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4),
    ];
    let as_bytes = |v: [u32; 2]| _mm_cvtsi64_si128(((v[1] as u64) << 32 | v[0] as u64) as i64);
    // Each 32-block's min serves both of its 16-weight halves.
    Factors {
        scale: [bytes8_times(as_bytes(scales), d), _mm256_setzero_ps()],
        min: twice(bytes8_times(as_bytes(mins), dmin)),
    }
}

/// Q4_K and Q5_K's low nibbles of weights 64c .. 64c + 64 (`qs` at `p + QS`).
///
/// # Safety
/// The block's bytes are readable at `p`, `c < 4`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_q45<const QS: usize>(p: *const u8, c: usize) -> [__m256i; 8] {
    // SAFETY: the 32 nibble bytes of chunk c lie at QS + 32c inside the block.
    let (w0, w1) = unsafe {
        (
            bytes16(p.add(QS + 32 * c)),
            bytes16(p.add(QS + 32 * c + 16)),
        )
    };
    let low = _mm256_set1_epi16(15);
    let z = _mm256_setzero_si256();
    [
        _mm256_and_si256(w0, low),
        _mm256_and_si256(w1, low),
        _mm256_srli_epi16::<4>(w0),
        _mm256_srli_epi16::<4>(w1),
        z,
        z,
        z,
        z,
    ]
}

/// Q4_K and Q5_K's quants of weights 64c .. 64c + 64: the nibbles at `p + QS`, with `FIFTH`
/// (Q5_K) each one's fifth bit from the 32 qh bytes at 16.
///
/// # Safety
/// The block's bytes are readable at `p`, `c < 4`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk_q45<const QS: usize, const FIFTH: bool>(p: *const u8, c: usize) -> [__m256i; 8] {
    // SAFETY: the nibbles of chunk c, and Q5_K's qh bytes, lie inside the readable block.
    unsafe {
        let mut q = nibbles_q45::<QS>(p, c);
        if FIFTH {
            let qh = [bytes16(p.add(16)), bytes16(p.add(32))];
            // Vector k holds 32-block 2c + k / 2, whose fifth bits are bit 2c + k / 2 of qh.
            for (k, v) in q.iter_mut().take(4).enumerate() {
                *v = _mm256_or_si256(*v, bit_to(qh[k % 2], 2 * c + k / 2, 16));
            }
        }
        q
    }
}

/// [`KFormat`] for Q4_K (`$bytes` 144, nibbles at 16) and Q5_K (176, nibbles at 48 after the
/// qh bytes: `$fifth`): one 6-bit scale and min per 32-block ([`factors_q45`]).
macro_rules! impl_q45 {
    ($t:ty, $bytes:expr, $qs:expr, $fifth:expr) => {
        impl KFormat for $t {
            const BYTES: usize = $bytes;
            const HAS_MIN: bool = true;
            const CHUNK: usize = 64;
            const PER16: bool = false;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn factors(p: *const u8) -> Factors {
                // SAFETY: forwarded.
                unsafe { factors_q45(p) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn chunk(p: *const u8, c: usize) -> [__m256i; 8] {
                // SAFETY: forwarded.
                unsafe { chunk_q45::<$qs, $fifth>(p, c) }
            }
        }
    };
}
impl_q45!(Q4K, 144, 16, false);
impl_q45!(Q5K, 176, 48, true);

impl KFormat for Q6K {
    const BYTES: usize = 210;
    const HAS_MIN: bool = false;
    const CHUNK: usize = 128;
    const PER16: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn factors(p: *const u8) -> Factors {
        // SAFETY: the 16 scales sit at 192, d at 208 of the readable block.
        let (sc, d) = unsafe { (i8x16_f32(p.add(192)), half(p.add(208))) };
        signed_scales(sc, d)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn chunk(p: *const u8, n: usize) -> [__m256i; 8] {
        let mut out = [_mm256_setzero_si256(); 8];
        // SAFETY: ql and qh (from 128) lie inside the readable block.
        unsafe {
            let (low, two) = (_mm256_set1_epi16(15), _mm256_set1_epi16(0x30));
            let bias = _mm256_set1_epi16(32);
            for h in 0..2 {
                let a = bytes16(p.add(64 * n + 16 * h));
                let b = bytes16(p.add(64 * n + 32 + 16 * h));
                let hi = bytes16(p.add(128 + 32 * n + 16 * h));
                let lows = [
                    _mm256_and_si256(a, low),
                    _mm256_and_si256(b, low),
                    _mm256_srli_epi16::<4>(a),
                    _mm256_srli_epi16::<4>(b),
                ];
                // Bits 2k..2k + 2 of qh, moved to bits 4..6 with immediate shifts.
                let highs = [
                    _mm256_slli_epi16::<4>(hi),
                    _mm256_slli_epi16::<2>(hi),
                    hi,
                    _mm256_srli_epi16::<2>(hi),
                ];
                for (k, (l, t)) in lows.into_iter().zip(highs).enumerate() {
                    // The −32 in integers: as a min of 32·d·sc against x's f32 sums it cancels
                    // two large terms (SmolLM2 Q4_K_M decode, worst position: 2.0e-3 relative
                    // logits error that way, 1.1e-3 this way).
                    let q = _mm256_or_si256(l, _mm256_and_si256(t, two));
                    out[2 * k + h] = _mm256_sub_epi16(q, bias);
                }
            }
        }
        out
    }
}

/// Hint the cache to fetch super-block `sb` of each row starting at `next[i]`.
#[inline(always)]
pub(super) fn fetch_superblock<K: KFormat, const R: usize>(next: &[*const u8; R], sb: usize) {
    let mut off = (sb * K::BYTES) & !63;
    while off < (sb + 1) * K::BYTES {
        for q in next {
            // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is
            // baseline on x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(off) as *const i8) };
        }
        off += 64;
    }
}

/// x's share of super-block `sb` in the int16 dots: its eight blocks' scales s_x and its
/// sixteen halves' sums Σx; with `FETCH`, super-block sb of each row at `next[i]` is fetched
/// first.
///
/// # Safety
/// Super-block sb of x exists (`8·sb < xq.blocks()`); the CPU has AVX2/FMA/F16C. `next` may
/// hold any addresses.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn superblock_x<K: KFormat, const R: usize, const FETCH: bool>(
    next: &[*const u8; R],
    xq: &XQuant,
    sb: usize,
) -> (__m256, [__m256; 2]) {
    if FETCH {
        fetch_superblock::<K, R>(next, sb);
    }
    let (sx, sum16) = (xq.scale.as_ptr(), xq.sum16.as_ptr());
    // SAFETY: xq holds 8 scales and 16 sums per super-block, sb's among them per the caller.
    unsafe {
        (
            _mm256_loadu_ps(sx.add(8 * sb)),
            [
                _mm256_loadu_ps(sum16.add(16 * sb)),
                _mm256_loadu_ps(sum16.add(16 * sb + 8)),
            ],
        )
    }
}

/// d·sc·s_x per 16-weight half of a super-block scaled per 16 (`PER16`): the halves' `scale`
/// times x's block scales `s`, each block's twice.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half_factors(scale: [__m256; 2], s: __m256) -> [f32; 16] {
    let mut ds = [0f32; 16];
    let s2 = twice(s);
    // SAFETY: sixteen floats in two stores.
    unsafe {
        _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(scale[0], s2[0]));
        _mm256_storeu_ps(ds.as_mut_ptr().add(8), _mm256_mul_ps(scale[1], s2[1]));
    }
    ds
}

/// out[i] = dot(row i, x) for the `R` K-quant rows starting at `p[i]`, on the int16 x; with
/// `FETCH`, the rows at `next[i]` are fetched into the cache block by block alongside. Row by
/// row within a super-block, each chunk of quants going from the decoder straight into the
/// integer dots; two accumulators per row.
///
/// # Safety
/// `xq.blocks() / 8` super-blocks readable at each `p[i]` (`xq.blocks()` a multiple of 8);
/// `out.len() >= R`; the CPU has AVX2/FMA/F16C. `next` may hold any addresses.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_i16<K: KFormat, const R: usize, const FETCH: bool>(
    p: &[*const u8; R],
    next: &[*const u8; R],
    xq: &XQuant,
    out: &mut [f32],
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let xp = xq.q.as_ptr();
    for sb in 0..xq.blocks() / 8 {
        // SAFETY: super-block sb of each row is readable per the caller; xq holds 256 values,
        // 8 scales and 16 sums per super-block.
        unsafe {
            let (s, x16) = superblock_x::<K, R, FETCH>(next, xq, sb);
            let xs = xp.add(QK * sb);
            for (&row, a) in p.iter().zip(acc.iter_mut()) {
                let blk = row.add(sb * K::BYTES);
                let f = K::factors(blk);
                // d·sc·s_x per 32-block (lanes 0..8) or per 16-weight half (0..16).
                let mut ds = [0f32; 16];
                if K::PER16 {
                    ds = half_factors(f.scale, s);
                } else {
                    _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(f.scale[0], s));
                }
                if K::HAS_MIN {
                    a[0] = _mm256_fnmadd_ps(f.min[0], x16[0], a[0]);
                    a[1] = _mm256_fnmadd_ps(f.min[1], x16[1], a[1]);
                }
                let per = K::CHUNK / 32;
                for c in 0..QK / K::CHUNK {
                    let q = K::chunk(blk, c);
                    for v in 0..per {
                        let b = per * c + v;
                        let xa = _mm256_loadu_si256(xs.add(32 * b) as *const __m256i);
                        let xb = _mm256_loadu_si256(xs.add(32 * b + 16) as *const __m256i);
                        let ta = _mm256_madd_epi16(q[2 * v], xa);
                        let tb = _mm256_madd_epi16(q[2 * v + 1], xb);
                        if K::PER16 {
                            let (da, db) = (&ds[2 * b], &ds[2 * b + 1]);
                            let fa = _mm256_cvtepi32_ps(ta);
                            a[0] = _mm256_fmadd_ps(_mm256_broadcast_ss(da), fa, a[0]);
                            let fb = _mm256_cvtepi32_ps(tb);
                            a[1] = _mm256_fmadd_ps(_mm256_broadcast_ss(db), fb, a[1]);
                        } else {
                            let t = _mm256_add_epi32(ta, tb);
                            let d = _mm256_broadcast_ss(&ds[b]);
                            a[v % 2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(t), a[v % 2]);
                        }
                    }
                }
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(_mm256_add_ps(a[0], a[1]));
    }
}

/// out[i] = dot(row i, x) for the group's first `R` rows, on the f32 x.
///
/// # Safety
/// `x.len() / 256` super-blocks readable at each row, `x.len() % 256 == 0`, `out.len() >= R`;
/// the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<K: KFormat, const R: usize>(g: &RowGroup, x: &[f32], out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut u = Unpacked::new();
    for sb in 0..x.len() / QK {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: super-block sb of row i and x[256sb..256sb + 256] are in bounds.
            unsafe {
                K::unpack(g.p[i].add(sb * K::BYTES), &mut u);
                let xs = x.as_ptr().add(QK * sb);
                for k in 0..32 {
                    *a = _mm256_fmadd_ps(u.weights8(k), _mm256_loadu_ps(xs.add(8 * k)), *a);
                }
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(*a);
    }
}

/// y += Σ a[i]·row i for the group's first `R` rows.
///
/// # Safety
/// `y.len() / 256` super-blocks readable at each row, `y.len() % 256 == 0`, `a.len() >= R`;
/// the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn axpy<K: KFormat, const R: usize>(g: &RowGroup, a: &[f32], y: &mut [f32]) {
    let mut u = Unpacked::new();
    for sb in 0..y.len() / QK {
        for line in 0..K::BYTES.div_ceil(64) {
            fetch_lines::<R>(&g.q, sb * K::BYTES + 64 * line);
        }
        let ys = y[QK * sb..].as_mut_ptr();
        for (&row, &ai) in g.p.iter().zip(a).take(R) {
            let ai = _mm256_set1_ps(ai);
            // SAFETY: super-block sb of the row and y[256sb..256sb + 256] are in bounds.
            unsafe {
                K::unpack(row.add(sb * K::BYTES), &mut u);
                for k in 0..32 {
                    let yk = ys.add(8 * k);
                    _mm256_storeu_ps(yk, _mm256_fmadd_ps(ai, u.weights8(k), _mm256_loadu_ps(yk)));
                }
            }
        }
    }
}

/// Decode the row of `out.len()` weights (a multiple of 256) at `row`.
///
/// # Safety
/// `out.len() / 256` super-blocks readable at `row`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dequant<K: KFormat>(row: *const u8, out: &mut [f32]) {
    let mut u = Unpacked::new();
    for (sb, o) in out.chunks_exact_mut(QK).enumerate() {
        // SAFETY: super-block sb is readable and `o` holds its 256 weights.
        unsafe {
            K::unpack(row.add(sb * K::BYTES), &mut u);
            for k in 0..32 {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), u.weights8(k));
            }
        }
    }
}
