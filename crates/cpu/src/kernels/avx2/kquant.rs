//! The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) under AVX2: each format only says how one
//! 256-weight super-block unpacks into sixteen vectors of i16 quants plus f32 factors
//! ([`KFormat::unpack`]); the kernels (int16-x dot, f32 dot, row accumulation, row decoding)
//! are written once over that.
//!
//! Unpacked, weight i of a super-block is `scale[i / 32]·q[i] − min[i / 16]`. The formats with
//! 16-weight sub-blocks (Q2_K, Q3_K, Q6_K) fold the sub-block's integer scale into q (|q·sc| <=
//! 32·128 = 4096 fits an i16, and a `pmaddwd` pair of it with the int16 x stays below 2^31),
//! so `scale` is the super-block's d; Q4_K and Q5_K keep q in 0..32 and put d·sc in `scale`.
//! In the int16 dot each 32-block's exact integer Σq·x is scaled once by scale·s_x, and the mins
//! enter as Σ min·Σx over the 16-weight halves (x's sums in f32).

use super::hsum;
use super::int16::XQuant;
use super::rows::{fetch_lines, RowGroup};
use powerinfer_core::dequantize::{k3_scale, k4_scale_min};
use std::arch::x86_64::*;

/// Weights per super-block.
const QK: usize = 256;

/// One super-block unpacked (see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Unpacked {
    /// Weights 16k..16k + 16 as i16, times the sub-block scale where it is an integer.
    q: [__m256i; 16],
    /// Per 32-weight block: the factor of q.
    scale: [f32; 8],
    /// Per 16-weight half-block: the value subtracted (dmin·min); zeros when `HAS_MIN` is false.
    min: [f32; 16],
}

impl Unpacked {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn new() -> Unpacked {
        Unpacked {
            q: [_mm256_setzero_si256(); 16],
            scale: [0.0; 8],
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
        let w = _mm256_mul_ps(q, _mm256_set1_ps(self.scale[k / 4]));
        _mm256_sub_ps(w, _mm256_set1_ps(self.min[k / 2]))
    }
}

/// A K-quant format: its block size and how a block unpacks.
pub(super) trait KFormat {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Whether the format subtracts per-sub-block mins.
    const HAS_MIN: bool;

    /// Unpack the super-block at `p` into `u`.
    ///
    /// # Safety
    /// `BYTES` bytes readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn unpack(p: *const u8, u: &mut Unpacked);
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

impl KFormat for Q2K {
    const BYTES: usize = 84;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: the block's 84 bytes are readable per the caller: 16 scale bytes, 64 quant
        // bytes from 16, d and dmin at 80 and 82.
        unsafe {
            let (d, dmin) = (half(p.add(80)), half(p.add(82)));
            let sc = (p as *const [u8; 16]).read_unaligned();
            u.scale = [d; 8];
            for n in 0..2 {
                for h in 0..2 {
                    let qs = bytes16(p.add(16 + 32 * n + 16 * h));
                    for j in 0..4 {
                        let s = 8 * n + 2 * j + h;
                        let k = _mm256_set1_epi16((sc[s] & 15) as i16);
                        u.q[s] = _mm256_mullo_epi16(crumb(qs, j), k);
                        u.min[s] = dmin * (sc[s] >> 4) as f32;
                    }
                }
            }
        }
    }
}

impl KFormat for Q3K {
    const BYTES: usize = 110;
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: the block's 110 bytes are readable per the caller: hmask, 64 quant bytes
        // from 32, 12 scale bytes from 96, d at 108.
        unsafe {
            let d = half(p.add(108));
            let sc = (p.add(96) as *const [u8; 12]).read_unaligned();
            u.scale = [d; 8];
            for n in 0..2 {
                for h in 0..2 {
                    let qs = bytes16(p.add(32 + 32 * n + 16 * h));
                    let hm = bytes16(p.add(16 * h));
                    for j in 0..4 {
                        let s = 8 * n + 2 * j + h;
                        // q = low − 4 where the high bit is clear: low + 4·high − 4.
                        let q = _mm256_add_epi16(crumb(qs, j), bit_to(hm, 4 * n + j, 4));
                        let q = _mm256_sub_epi16(q, _mm256_set1_epi16(4));
                        let k = _mm256_set1_epi16(k3_scale(s, &sc) as i16 - 32);
                        u.q[s] = _mm256_mullo_epi16(q, k);
                    }
                }
            }
        }
    }
}

/// Q4_K and Q5_K's scales, mins and low nibbles (`qs` at `p + QS`).
///
/// # Safety
/// The block's bytes are readable at `p`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q45<const QS: usize>(p: *const u8, u: &mut Unpacked) {
    // SAFETY: d, dmin and the 12 scale bytes lead the block, the 128 nibble bytes sit at QS.
    unsafe {
        let (d, dmin) = (half(p), half(p.add(2)));
        let sm = (p.add(4) as *const [u8; 12]).read_unaligned();
        for s in 0..8 {
            let (sc, m) = k4_scale_min(s, &sm);
            u.scale[s] = d * sc as f32;
            u.min[2 * s] = dmin * m as f32;
            u.min[2 * s + 1] = u.min[2 * s];
        }
        let low = _mm256_set1_epi16(15);
        for c in 0..4 {
            let w0 = bytes16(p.add(QS + 32 * c));
            let w1 = bytes16(p.add(QS + 32 * c + 16));
            u.q[4 * c] = _mm256_and_si256(w0, low);
            u.q[4 * c + 1] = _mm256_and_si256(w1, low);
            u.q[4 * c + 2] = _mm256_srli_epi16::<4>(w0);
            u.q[4 * c + 3] = _mm256_srli_epi16::<4>(w1);
        }
    }
}

impl KFormat for Q4K {
    const BYTES: usize = 144;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: forwarded; Q4_K's nibbles start at byte 16.
        unsafe { unpack_q45::<16>(p, u) }
    }
}

impl KFormat for Q5K {
    const BYTES: usize = 176;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: forwarded; Q5_K's nibbles start at byte 48 after the 32 qh bytes at 16.
        unsafe {
            unpack_q45::<48>(p, u);
            let qh = [bytes16(p.add(16)), bytes16(p.add(32))];
            for (k, q) in u.q.iter_mut().enumerate() {
                *q = _mm256_or_si256(*q, bit_to(qh[k % 2], k / 2, 16));
            }
        }
    }
}

impl KFormat for Q6K {
    const BYTES: usize = 210;
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8, u: &mut Unpacked) {
        // SAFETY: the block's 210 bytes are readable per the caller: ql, qh from 128, the 16
        // scales from 192, d at 208.
        unsafe {
            let d = half(p.add(208));
            let sc = (p.add(192) as *const [i8; 16]).read_unaligned();
            u.scale = [d; 8];
            let low = _mm256_set1_epi16(15);
            for n in 0..2 {
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
                    for (k, l) in lows.into_iter().enumerate() {
                        let s = 8 * n + 2 * k + h;
                        let q = _mm256_or_si256(l, _mm256_slli_epi16::<4>(crumb(hi, k)));
                        let q = _mm256_sub_epi16(q, _mm256_set1_epi16(32));
                        u.q[s] = _mm256_mullo_epi16(q, _mm256_set1_epi16(sc[s] as i16));
                    }
                }
            }
        }
    }
}

/// out[i] = dot(row i, x) for the `R` K-quant rows starting at `p[i]`, on the int16 x; with
/// `FETCH`, the rows at `next[i]` are fetched into the cache block by block alongside.
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
    let mut acc = [_mm256_setzero_ps(); R];
    let mut u = [Unpacked::new(); R];
    let (xp, sx, sum16) = (xq.q.as_ptr(), xq.scale.as_ptr(), xq.sum16.as_ptr());
    for sb in 0..xq.blocks() / 8 {
        if FETCH {
            let mut off = (sb * K::BYTES) & !63;
            while off < (sb + 1) * K::BYTES {
                for q in next {
                    // A hint: never faults, whatever the address.
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(off) as *const i8);
                }
                off += 64;
            }
        }
        // SAFETY: super-block sb of each row is readable per the caller; xq holds 256 values,
        // 8 scales and 16 sums per super-block.
        unsafe {
            let mut ds = [[0f32; 8]; R];
            let s = _mm256_loadu_ps(sx.add(8 * sb));
            for i in 0..R {
                K::unpack(p[i].add(sb * K::BYTES), &mut u[i]);
                let d = _mm256_loadu_ps(u[i].scale.as_ptr());
                _mm256_storeu_ps(ds[i].as_mut_ptr(), _mm256_mul_ps(d, s));
                if K::HAS_MIN {
                    let m = u[i].min.as_ptr();
                    let x16 = sum16.add(16 * sb);
                    let a = _mm256_fnmadd_ps(_mm256_loadu_ps(m), _mm256_loadu_ps(x16), acc[i]);
                    acc[i] =
                        _mm256_fnmadd_ps(_mm256_loadu_ps(m.add(8)), _mm256_loadu_ps(x16.add(8)), a);
                }
            }
            for b in 0..8 {
                let x0 = xp.add(QK * sb + 32 * b);
                let xa = _mm256_loadu_si256(x0 as *const __m256i);
                let xb = _mm256_loadu_si256(x0.add(16) as *const __m256i);
                for ((a, ui), di) in acc.iter_mut().zip(&u).zip(&ds) {
                    let t = _mm256_add_epi32(
                        _mm256_madd_epi16(ui.q[2 * b], xa),
                        _mm256_madd_epi16(ui.q[2 * b + 1], xb),
                    );
                    let d = _mm256_broadcast_ss(&di[b]);
                    *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(t), *a);
                }
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        *o = hsum(*a);
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
