//! Dot products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows interleaved by eight
//! (`crate::operands::interleaved`) with quantized x: the eight rows of a group sit in the eight
//! i32 lanes of every integer dot, each against one broadcast word of x, so a block costs a
//! handful of dots, one scale conversion and one or two FMAs for eight rows, and no horizontal
//! sum. For either numerics: the int16 x (its high and low bytes dotted apart, `256·Σh + Σl`,
//! exact) or the int8 x (a scale per 16 values: each half's dot apart).
//!
//! How each format meets the byte dot (unsigned weight bytes times signed x bytes):
//! - Q4_0: the nibbles q are unsigned; its −8 is the dots' integer start value (−8·Σx).
//! - Q4_1: the nibbles likewise; its mins one FMA per block against x's block sums (of x itself
//!   for the int16 x, as the row kernels take them; of x̂ for the int8 x).
//! - Q5_0, Q5_1: as Q4_0 and Q4_1 with each nibble's fifth bit (a shift and a mask of the
//!   layout's transposed chunk) as its bit 4; Q5_0's −16 is twice Q4_0's start.
//! - Q8_0: the signed quants w are read as w + 128 (one xor), and −128·Σx is the start value,
//!   so Σ(w + 128)·x − 128·Σx = Σw·x exactly. That needs a dot that does not saturate at
//!   255·127 per pair: `vpdpbusd` (VNNI). AVX2's `pmaddubsw` saturates there, so its Q8_0
//!   kernels ([`avx2::q8_group_i16`], [`avx2::q8_group_i8`]) widen the quants to int16 and take
//!   `pmaddwd` on the int16 x itself (or the int8 x widened), four rows per vector.
//! - Q4_K: the nibbles likewise, each 32-weight sub-block's integer dot apart (x's blocks of 32
//!   are its sub-blocks), scaled by d·sc; the eight rows' 6-bit scales and mins are unpacked
//!   once per super-block for all tokens, the mins (dmin·m) against x's block sums.
//! - Q5_K: as Q4_K, each quant's fifth bit from bit s (its sub-block) of a `qh` byte, which the
//!   file's layout already keeps where one shift and one mask take it.
//! - Q6_K: its six-bit quants as unsigned bytes (0..64), reassembled at load so that three of
//!   four blocks take one mask each and the fourth three shifts, its −32 as the start value
//!   (four times Q4_0's), each 16-weight sub-block's dot apart, scaled by d·sc (its int8 scales
//!   sign-extended once per super-block).
//!
//! The kernels are written once over the instruction set's byte dot and the format, as
//! `super::int8_rows`, and reached through one table per numerics ([`kernel_i16`],
//! [`kernel_i8`]) that picks the (format, level) kernel.

use super::int16::XQuant;
use super::int8::X8;
use super::int8_rows::{dot_avx2, dot_vnni};
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// The interleaved formats, as the kernels' const parameter.
pub(crate) mod fmt {
    /// Q4_0.
    pub(crate) const Q4_0: u8 = 0;
    /// Q4_1.
    pub(crate) const Q4_1: u8 = 1;
    /// Q8_0.
    pub(crate) const Q8_0: u8 = 2;
    /// Q5_0.
    pub(crate) const Q5_0: u8 = 3;
    /// Q5_1.
    pub(crate) const Q5_1: u8 = 4;
    /// Q4_K.
    pub(crate) const Q4_K: u8 = 5;
    /// Q5_K.
    pub(crate) const Q5_K: u8 = 6;
}

/// A group kernel for `T` tokens of the x `X`: the eight rows of a group dotted with each
/// token's x over the blocks `blocks.0..blocks.1` (its second argument; its first: where the
/// group's block `blocks.0` starts, the next blocks following it), added to each token's
/// accumulators (its last; [`finish`] gives the rows' values once every block is in). A row's
/// float steps do not depend on how its blocks are split between calls.
pub(crate) type GroupKernel<X, const T: usize> =
    unsafe fn(*const u8, (usize, usize), [&X; T], [&Starts; T], &mut [Acc; T]);

/// A token's accumulators of a group's eight rows: two alternating sums and the sum of the
/// mins subtracted at the end (Q4_K's; Q4_1 adds its mins into the second sum).
pub(crate) type Acc = [__m256; 3];

/// The eight rows' values of a token's accumulators: their two sums less the mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn finish(a: &Acc) -> [f32; 8] {
    let mut out = [0f32; 8];
    let v = _mm256_sub_ps(_mm256_add_ps(a[0], a[1]), a[2]);
    // SAFETY: eight floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

/// The (format, level) table of one numerics' group kernels: `$blocks` names the 32-block
/// formats' kernel (`group_i16` or `group_i8`), `$q8` AVX2's own Q8_0 one, `$k4` and `$k6` the
/// K-quants'.
macro_rules! kernel_table {
    ($dtype:expr, $wide:expr, $blocks:ident, $q8:ident, $k4:ident, $k6:ident) => {{
        use fmt::*;
        Some(match ($dtype, $wide) {
            (DType::Q4_0, true) => vnni::$blocks::<Q4_0, T>,
            (DType::Q4_1, true) => vnni::$blocks::<Q4_1, T>,
            (DType::Q5_0, true) => vnni::$blocks::<Q5_0, T>,
            (DType::Q5_1, true) => vnni::$blocks::<Q5_1, T>,
            (DType::Q8_0, true) => vnni::$blocks::<Q8_0, T>,
            (DType::Q4_0, false) => avx2::$blocks::<Q4_0, T>,
            (DType::Q4_1, false) => avx2::$blocks::<Q4_1, T>,
            (DType::Q5_0, false) => avx2::$blocks::<Q5_0, T>,
            (DType::Q5_1, false) => avx2::$blocks::<Q5_1, T>,
            (DType::Q8_0, false) => avx2::$q8::<T>,
            (DType::Q4_K, true) => vnni::$k4::<Q4_K, T>,
            (DType::Q5_K, true) => vnni::$k4::<Q5_K, T>,
            (DType::Q4_K, false) => avx2::$k4::<Q4_K, T>,
            (DType::Q5_K, false) => avx2::$k4::<Q5_K, T>,
            (DType::Q6_K, true) => vnni::$k6::<T>,
            (DType::Q6_K, false) => avx2::$k6::<T>,
            _ => return None,
        })
    }};
}

/// The int16-x group kernel of `dtype` on the level (`wide`: AVX-512 VNNI, else AVX2); `None`
/// for a format without an interleaved layout.
pub(crate) fn kernel_i16<const T: usize>(
    dtype: DType,
    wide: bool,
) -> Option<GroupKernel<XQuant, T>> {
    kernel_table!(
        dtype,
        wide,
        group_i16,
        q8_group_i16,
        k4_group_i16,
        k6_group_i16
    )
}

/// The int8-x group kernel of `dtype` on the level, as [`kernel_i16`].
pub(crate) fn kernel_i8<const T: usize>(dtype: DType, wide: bool) -> Option<GroupKernel<X8, T>> {
    kernel_table!(dtype, wide, group_i8, q8_group_i8, k4_group_i8, k6_group_i8)
}

/// Per-block integer start values an x brings to the interleaved dots: −8·Σq (Q4_0's bias; a
/// format's start is a multiple of it, [`start_mul`]) over each 16-value half of the block.
pub(crate) struct Starts(Vec<[i32; 2]>);

impl Starts {
    /// For the int16 x.
    pub(crate) fn of_int16(xq: &XQuant) -> Starts {
        Starts::of_lanes(&xq.neg_bias8)
    }

    /// For the int8 x.
    pub(crate) fn of_int8(x: &X8) -> Starts {
        Starts::of_lanes(&x.neg8)
    }

    /// From an x's −8·Σq per 4 values, eight lanes per block: each half's four summed.
    fn of_lanes(neg8: &[i32]) -> Starts {
        Starts(
            neg8.chunks_exact(8)
                .map(|l| [l[..4].iter().sum(), l[4..].iter().sum()])
                .collect(),
        )
    }
}

/// A group block's bytes and where its quants start: Q4_1 and Q5_1 carry eight mins after the
/// eight scales, Q5_0 and Q5_1 a chunk of fifth bits before the quants; Q8_0 has 32 quant bytes
/// per row.
#[inline(always)]
const fn layout<const F: u8>() -> (usize, usize) {
    match F {
        fmt::Q4_1 => (8 * 20, 32),
        fmt::Q8_0 => (8 * 34, 16),
        fmt::Q5_0 => (8 * 22, 48),
        fmt::Q5_1 => (8 * 24, 64),
        _ => (8 * 18, 16),
    }
}

/// The multiple of [`Starts`] (−8·Σq) a format's dots start from: Q4_0's −8 once, Q5_0's −16
/// twice, Q8_0's −128 sixteen times, none for Q4_1 and Q5_1 (their mins go in floats).
#[inline(always)]
const fn start_mul<const F: u8>() -> i32 {
    match F {
        fmt::Q4_0 => 1,
        fmt::Q5_0 => 2,
        fmt::Q8_0 => 16,
        _ => 0,
    }
}

/// Bytes of a Q4_K or Q5_K group super-block (eight rows' 144 or 176).
#[inline(always)]
const fn k_group_block<const F: u8>() -> usize {
    match F {
        fmt::Q5_K => 8 * 176,
        _ => 8 * 144,
    }
}
/// Bytes of a Q6_K group super-block (eight rows' 210).
const K6_GROUP_BLOCK: usize = 8 * 210;

/// The word of four x bytes at `p` (any alignment), broadcast.
///
/// # Safety
/// Four bytes readable at `p`; AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn word(p: *const i8) -> __m256i {
    // SAFETY: per the caller.
    _mm256_set1_epi32(unsafe { (p as *const i32).read_unaligned() })
}

/// The group kernels for one instruction set (`$dot` its byte dot; `$wide_u8`: whether it takes
/// unsigned bytes up to 255 without saturating, as Q8_0 needs), for `T` tokens at once: each
/// block's quants are unpacked once, then every token's dots and FMAs follow in the order one
/// token alone takes (`T` = 1), so a token's results are the same bits in any company.
macro_rules! interleaved_kernels {
    ($feat:literal, $dot:ident, $wide_u8:expr) => {
        /// The eight rows of the group at `g` (`nb` blocks, format `F`) dotted with each of `T`
        /// int16 x.
        ///
        /// # Safety
        /// `nb` group blocks readable at `g`; every `xs[t]` and `st[t]` of `nb` blocks; the CPU
        /// has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn group_i16<const F: u8, const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&XQuant; T],
            st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            const { assert!(F != fmt::Q8_0 || $wide_u8) };
            let min = F == fmt::Q4_1 || F == fmt::Q5_1;
            for b in blocks.0..blocks.1 {
                // SAFETY: block b of the group, and of every x, are readable per the caller.
                unsafe {
                    let (dw, mins, lo, hi) = group_block::<F>(g, b - blocks.0);
                    for ((xq, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                        let (h, l) = (xq.hl.as_ptr().add(64 * b), xq.hl.as_ptr().add(64 * b + 32));
                        let mut sh = _mm256_setzero_si256();
                        let [na, nb_] = *st.0.get_unchecked(b);
                        let start = start_mul::<F>() * (na + nb_);
                        let mut sl = _mm256_set1_epi32(start);
                        if min {
                            let s = _mm256_set1_ps(*xq.sum.get_unchecked(b));
                            a[1] = _mm256_fmadd_ps(mins, s, a[1]);
                        }
                        for j in 0..4 {
                            sh = $dot(sh, lo[j], word(h.add(4 * j)));
                            sl = $dot(sl, lo[j], word(l.add(4 * j)));
                            sh = $dot(sh, hi[j], word(h.add(16 + 4 * j)));
                            sl = $dot(sl, hi[j], word(l.add(16 + 4 * j)));
                        }
                        let s = _mm256_add_epi32(_mm256_slli_epi32::<8>(sh), sl);
                        let d = _mm256_mul_ps(dw, _mm256_set1_ps(*xq.scale.get_unchecked(b)));
                        a[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a[b % 2]);
                    }
                }
            }
        }

        /// The eight rows of the group at `g` (`nb` blocks, format `F`) dotted with each of `T`
        /// int8 x.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn group_i8<const F: u8, const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&X8; T],
            st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            const { assert!(F != fmt::Q8_0 || $wide_u8) };
            let min = F == fmt::Q4_1 || F == fmt::Q5_1;
            for b in blocks.0..blocks.1 {
                // SAFETY: block b of the group, and of every x, are readable per the caller.
                unsafe {
                    let (dw, mins, lo, hi) = group_block::<F>(g, b - blocks.0);
                    for ((x, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                        let q = x.q.as_ptr().add(32 * b);
                        let [na, nb_] = *st.0.get_unchecked(b);
                        let k = start_mul::<F>();
                        let mut sa = _mm256_set1_epi32(k * na);
                        let mut sb = _mm256_set1_epi32(k * nb_);
                        if min {
                            let s = _mm256_set1_ps(*x.s.get_unchecked(b));
                            a[1] = _mm256_fmadd_ps(mins, s, a[1]);
                        }
                        for j in 0..4 {
                            sa = $dot(sa, lo[j], word(q.add(4 * j)));
                            sb = $dot(sb, hi[j], word(q.add(16 + 4 * j)));
                        }
                        let (da, db) = (*x.dv.get_unchecked(8 * b), *x.dv.get_unchecked(8 * b + 4));
                        let fa = _mm256_mul_ps(dw, _mm256_set1_ps(da));
                        let fb = _mm256_mul_ps(dw, _mm256_set1_ps(db));
                        a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), fa, a[0]);
                        a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), fb, a[1]);
                    }
                }
            }
        }

        /// The eight rows of the Q4_K group at `g` (`nb` super-blocks) dotted with each of `T`
        /// int16 x: each 32-weight sub-block's exact integer dot scaled by d·sc·s_x, the mins
        /// as dmin·m times x's own sums (as the row kernels take them), subtracted at the end.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn k4_group_i16<const F: u8, const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&XQuant; T],
            _st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            for sb in blocks.0..blocks.1 {
                // SAFETY: super-block sb of the group, and of every x, are readable per the
                // caller.
                unsafe {
                    let p = g.add((sb - blocks.0) * k_group_block::<F>());
                    let (fs, fm) = k4_factors(p);
                    for k in 0..4 {
                        let q = k4_quants::<F>(p, k);
                        for (xq, a) in xs.iter().zip(acc.iter_mut()) {
                            for (h, q) in q.iter().enumerate() {
                                let (s, b) = (2 * k + h, 8 * sb + 2 * k + h);
                                let (xh, xl) =
                                    (xq.hl.as_ptr().add(64 * b), xq.hl.as_ptr().add(64 * b + 32));
                                let (mut sh, mut sl) =
                                    (_mm256_setzero_si256(), _mm256_setzero_si256());
                                for (j, &qj) in q.iter().enumerate() {
                                    sh = $dot(sh, qj, word(xh.add(4 * j)));
                                    sl = $dot(sl, qj, word(xl.add(4 * j)));
                                }
                                let si = _mm256_add_epi32(_mm256_slli_epi32::<8>(sh), sl);
                                let d = _mm256_mul_ps(
                                    fs[s],
                                    _mm256_set1_ps(*xq.scale.get_unchecked(b)),
                                );
                                a[s % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), d, a[s % 2]);
                                a[2] = _mm256_fmadd_ps(
                                    fm[s],
                                    _mm256_set1_ps(*xq.sum.get_unchecked(b)),
                                    a[2],
                                );
                            }
                        }
                    }
                }
            }
        }

        /// The eight rows of the Q4_K group at `g` (`nb` super-blocks) dotted with each of `T`
        /// int8 x: each 16-weight half's integer dot scaled by d·sc·d_x, the mins as dmin·m
        /// times the sums of x̂.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn k4_group_i8<const F: u8, const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&X8; T],
            _st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            for sb in blocks.0..blocks.1 {
                // SAFETY: super-block sb of the group, and of every x, are readable per the
                // caller.
                unsafe {
                    let p = g.add((sb - blocks.0) * k_group_block::<F>());
                    let (fs, fm) = k4_factors(p);
                    for k in 0..4 {
                        let q = k4_quants::<F>(p, k);
                        for (x, a) in xs.iter().zip(acc.iter_mut()) {
                            for (h, q) in q.iter().enumerate() {
                                let (s, b) = (2 * k + h, 8 * sb + 2 * k + h);
                                let xq = x.q.as_ptr().add(32 * b);
                                let (mut sa, mut sb_) =
                                    (_mm256_setzero_si256(), _mm256_setzero_si256());
                                for j in 0..4 {
                                    sa = $dot(sa, q[j], word(xq.add(4 * j)));
                                    sb_ = $dot(sb_, q[4 + j], word(xq.add(16 + 4 * j)));
                                }
                                let (da, db) =
                                    (*x.dv.get_unchecked(8 * b), *x.dv.get_unchecked(8 * b + 4));
                                let fa = _mm256_mul_ps(fs[s], _mm256_set1_ps(da));
                                let fb = _mm256_mul_ps(fs[s], _mm256_set1_ps(db));
                                a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), fa, a[0]);
                                a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb_), fb, a[1]);
                                a[2] = _mm256_fmadd_ps(
                                    fm[s],
                                    _mm256_set1_ps(*x.s.get_unchecked(b)),
                                    a[2],
                                );
                            }
                        }
                    }
                }
            }
        }

        /// The eight rows of the Q6_K group at `g` (`nb` super-blocks) dotted with each of `T`
        /// int16 x: each 16-weight sub-block's exact integer dot (its −32 as the start value)
        /// scaled by d·sc·s_x.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn k6_group_i16<const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&XQuant; T],
            st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            for sb in blocks.0..blocks.1 {
                // SAFETY: super-block sb of the group, and of every x, are readable per the
                // caller.
                unsafe {
                    let p = g.add((sb - blocks.0) * K6_GROUP_BLOCK);
                    let mut half = [[_mm256_setzero_si256(); 8]; 4];
                    let f = k6_factors(p);
                    for m in 0..8 {
                        if m % 4 == 0 {
                            half = k6_quants(p, m / 4);
                        }
                        let q = &half[m % 4];
                        let b = 8 * sb + m;
                        for ((xq, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                            let (xh, xl) =
                                (xq.hl.as_ptr().add(64 * b), xq.hl.as_ptr().add(64 * b + 32));
                            let [na, nb_] = *st.0.get_unchecked(b);
                            let sx = _mm256_set1_ps(*xq.scale.get_unchecked(b));
                            let (mut ha, mut la) =
                                (_mm256_setzero_si256(), _mm256_set1_epi32(4 * na));
                            let (mut hb, mut lb) =
                                (_mm256_setzero_si256(), _mm256_set1_epi32(4 * nb_));
                            for j in 0..4 {
                                ha = $dot(ha, q[j], word(xh.add(4 * j)));
                                la = $dot(la, q[j], word(xl.add(4 * j)));
                                hb = $dot(hb, q[4 + j], word(xh.add(16 + 4 * j)));
                                lb = $dot(lb, q[4 + j], word(xl.add(16 + 4 * j)));
                            }
                            let sa = _mm256_add_epi32(_mm256_slli_epi32::<8>(ha), la);
                            let sb_ = _mm256_add_epi32(_mm256_slli_epi32::<8>(hb), lb);
                            let da = _mm256_mul_ps(f[2 * m], sx);
                            let db = _mm256_mul_ps(f[2 * m + 1], sx);
                            a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), da, a[0]);
                            a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb_), db, a[1]);
                        }
                    }
                }
            }
        }

        /// The eight rows of the Q6_K group at `g` (`nb` super-blocks) dotted with each of `T`
        /// int8 x: each 16-weight sub-block's integer dot (its −32 as the start value) scaled
        /// by d·sc·d_x.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn k6_group_i8<const T: usize>(
            g: *const u8,
            blocks: (usize, usize),
            xs: [&X8; T],
            st: [&Starts; T],
            acc: &mut [Acc; T],
        ) {
            for sb in blocks.0..blocks.1 {
                // SAFETY: super-block sb of the group, and of every x, are readable per the
                // caller.
                unsafe {
                    let p = g.add((sb - blocks.0) * K6_GROUP_BLOCK);
                    let mut half = [[_mm256_setzero_si256(); 8]; 4];
                    let f = k6_factors(p);
                    for m in 0..8 {
                        if m % 4 == 0 {
                            half = k6_quants(p, m / 4);
                        }
                        let q = &half[m % 4];
                        let b = 8 * sb + m;
                        for ((x, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                            let xq = x.q.as_ptr().add(32 * b);
                            let starts = *st.0.get_unchecked(b);
                            for (h, start) in starts.into_iter().enumerate() {
                                let mut s = _mm256_set1_epi32(4 * start);
                                for j in 4 * h..4 * h + 4 {
                                    s = $dot(s, q[j], word(xq.add(4 * j)));
                                }
                                let dx = _mm256_set1_ps(*x.dv.get_unchecked(8 * b + 4 * h));
                                let d = _mm256_mul_ps(f[2 * m + h], dx);
                                a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a[h]);
                            }
                        }
                    }
                }
            }
        }

        /// A Q6_K group super-block's sixteen sub-blocks' factors d·sc for its eight rows (the
        /// int8 scales from the four chunks of scale bytes, lane r: row r's scales 4c..4c + 4).
        ///
        /// # Safety
        /// The group super-block readable at `p`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k6_factors(p: *const u8) -> [__m256; 16] {
            // SAFETY: d and the scale chunks (chunks 48..52) are in the group super-block.
            let (d, w) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                    [0, 1, 2, 3].map(|c| _mm256_loadu_si256(p.add(16 + 32 * (48 + c)).cast())),
                )
            };
            let mut f = [_mm256_setzero_ps(); 16];
            for (k, fk) in f.iter_mut().enumerate() {
                // Byte k % 4 of the lane to the top, then back with its sign.
                let up = _mm256_sll_epi32(w[k / 4], _mm_cvtsi32_si128(24 - 8 * (k % 4) as i32));
                let sc = _mm256_srai_epi32::<24>(up);
                *fk = _mm256_mul_ps(_mm256_cvtepi32_ps(sc), d);
            }
            f
        }

        /// A Q6_K group super-block's quants (0..64, the −32 not applied) of its half n: of its
        /// blocks 4n + k, eight chunks each (chunk j: each row's weights 4j..4j + 4 of the
        /// block), from the layout's three chunks per j (`crate::operands::interleaved`): blocks
        /// 4n..4n + 3 in their low six bits, block 4n + 3 two bits in the top of each.
        ///
        /// # Safety
        /// The group super-block readable at `p`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k6_quants(p: *const u8, n: usize) -> [[__m256i; 8]; 4] {
            let low6 = _mm256_set1_epi8(0x3F);
            let top = [0x30, 0x0C, 0x03].map(|t| _mm256_set1_epi8(t));
            let mut q = [[_mm256_setzero_si256(); 8]; 4];
            for j in 0..8 {
                // SAFETY: chunks 3(8n + j)..3(8n + j) + 3 of the quants, per the caller.
                let v = [0, 1, 2].map(|s| unsafe {
                    _mm256_loadu_si256(p.add(16 + 32 * (3 * (8 * n + j) + s)).cast())
                });
                for s in 0..3 {
                    q[s][j] = _mm256_and_si256(v[s], low6);
                }
                let t0 = _mm256_and_si256(_mm256_srli_epi16::<2>(v[0]), top[0]);
                let t1 = _mm256_and_si256(_mm256_srli_epi16::<4>(v[1]), top[1]);
                let t2 = _mm256_and_si256(_mm256_srli_epi16::<6>(v[2]), top[2]);
                q[3][j] = _mm256_or_si256(_mm256_or_si256(t0, t1), t2);
            }
            q
        }

        /// A Q4_K group super-block's eight sub-blocks' factors for its eight rows: d·sc and
        /// dmin·m, the 6-bit scales and mins unpacked from the three chunks of scale bytes
        /// (lane r: row r's bytes 4c..4c + 4), as `factors_q45` of the row kernels.
        ///
        /// # Safety
        /// The group super-block's first 128 bytes readable at `p`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k4_factors(p: *const u8) -> ([__m256; 8], [__m256; 8]) {
            // SAFETY: the f16 fields and scale chunks are the first 128 bytes.
            let (d, dmin, w) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
                    [0, 1, 2].map(|c| _mm256_loadu_si256(p.add(32 + 32 * c).cast())),
                )
            };
            let (m6, m4, m2) = (
                _mm256_set1_epi32(63),
                _mm256_set1_epi32(15),
                _mm256_set1_epi32(3),
            );
            let srl = |v: __m256i, n: i32| _mm256_srl_epi32(v, _mm_cvtsi32_si128(n));
            let (mut sc, mut mn) = ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
            for j in 0..4 {
                let s = 8 * j as i32;
                sc[j] = _mm256_and_si256(srl(w[0], s), m6);
                mn[j] = _mm256_and_si256(srl(w[1], s), m6);
                let top = |v| _mm256_slli_epi32::<4>(_mm256_and_si256(srl(v, s + 6), m2));
                sc[4 + j] = _mm256_or_si256(_mm256_and_si256(srl(w[2], s), m4), top(w[0]));
                mn[4 + j] = _mm256_or_si256(_mm256_and_si256(srl(w[2], s + 4), m4), top(w[1]));
            }
            (
                sc.map(|v| _mm256_mul_ps(_mm256_cvtepi32_ps(v), d)),
                mn.map(|v| _mm256_mul_ps(_mm256_cvtepi32_ps(v), dmin)),
            )
        }

        /// A Q4_K or Q5_K (`F`) group super-block's quants of weights 64k..64k + 64: its
        /// sub-block 2k (the low nibbles) and 2k + 1 (the high ones), eight chunks each (chunk
        /// j: each row's weights 4j..4j + 4 of the sub-block); Q5_K's with their fifth bits
        /// from its `qh` chunks.
        ///
        /// # Safety
        /// The group super-block readable at `p`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn k4_quants<const F: u8>(p: *const u8, k: usize) -> [[__m256i; 8]; 2] {
            let (m, t) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
            let qs = if F == fmt::Q5_K { 128 + 256 } else { 128 };
            let down = _mm_cvtsi32_si128(2 * k as i32);
            let mut q = [[_mm256_setzero_si256(); 8]; 2];
            for j in 0..8 {
                // SAFETY: chunk 8k + j of the quants, per the caller.
                let v = unsafe { _mm256_loadu_si256(p.add(qs + 32 * (8 * k + j)).cast()) };
                q[0][j] = _mm256_and_si256(v, m);
                q[1][j] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                if F == fmt::Q5_K {
                    // Bits 2k and 2k + 1 of qh chunk j's bytes: sub-blocks 2k and 2k + 1's
                    // fifth bits, brought down to bits 0 and 1 (the 16-bit shift carries no
                    // bit there from the other byte), then to bit 4.
                    // SAFETY: qh chunk j, per the caller.
                    let h = unsafe { _mm256_loadu_si256(p.add(128 + 32 * j).cast()) };
                    let h = _mm256_srl_epi16(h, down);
                    q[0][j] =
                        _mm256_or_si256(q[0][j], _mm256_and_si256(_mm256_slli_epi16::<4>(h), t));
                    q[1][j] =
                        _mm256_or_si256(q[1][j], _mm256_and_si256(_mm256_slli_epi16::<3>(h), t));
                }
            }
            q
        }

        /// Group block `b` at `g` (format `F`): its eight rows' scales, their mins (Q4_1,
        /// Q5_1; else zeros), and its quants as four 32-byte chunks of weights 0..16 (`lo`) and
        /// of weights 16..32 (`hi`), chunk j holding each row's weights 4j..4j + 4 (of its
        /// half) as unsigned bytes: the nibbles (with their fifth bits for Q5_0 and Q5_1), or
        /// Q8_0's quants + 128.
        ///
        /// # Safety
        /// Block b of the group readable at `g`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn group_block<const F: u8>(
            g: *const u8,
            b: usize,
        ) -> (__m256, __m256, [__m256i; 4], [__m256i; 4]) {
            let (gbb, qo) = layout::<F>();
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            // SAFETY: the block's scales, mins and quant chunks are readable per the caller.
            unsafe {
                let p = g.add(b * gbb);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
                let mins = match F {
                    fmt::Q4_1 | fmt::Q5_1 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
                    _ => _mm256_setzero_ps(),
                };
                if F == fmt::Q8_0 {
                    let flip = _mm256_set1_epi8(-128);
                    for j in 0..4 {
                        let (a, b) = (p.add(qo + 32 * j), p.add(qo + 128 + 32 * j));
                        lo[j] = _mm256_xor_si256(_mm256_loadu_si256(a.cast()), flip);
                        hi[j] = _mm256_xor_si256(_mm256_loadu_si256(b.cast()), flip);
                    }
                } else {
                    let m = _mm256_set1_epi8(0x0F);
                    for j in 0..4 {
                        let v = _mm256_loadu_si256(p.add(qo + 32 * j).cast());
                        lo[j] = _mm256_and_si256(v, m);
                        hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                    }
                    if F == fmt::Q5_0 || F == fmt::Q5_1 {
                        // Chunk c's fifth bits are bit c of each byte (the layout's
                        // transposition): moved to bit 4 within each byte of the 16-bit lanes.
                        let (qh, t) = (
                            _mm256_loadu_si256(p.add(qo - 32).cast()),
                            _mm256_set1_epi8(0x10),
                        );
                        let at = |c: i32| {
                            let v = match c {
                                0..4 => _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - c)),
                                _ => _mm256_srl_epi16(qh, _mm_cvtsi32_si128(c - 4)),
                            };
                            _mm256_and_si256(v, t)
                        };
                        for j in 0..4 {
                            lo[j] = _mm256_or_si256(lo[j], at(j as i32));
                            hi[j] = _mm256_or_si256(hi[j], at(4 + j as i32));
                        }
                    }
                }
                (dw, mins, lo, hi)
            }
        }
    };
}

/// The AVX2 forms (Q8_0's own below: `pmaddubsw` saturates on its unsigned bytes).
pub(crate) mod avx2 {
    use super::*;
    interleaved_kernels!("avx2,fma,f16c", dot_avx2, false);

    /// Group block `b` of a Q8_0 group at `g`: its eight scales, and its eight quant chunks
    /// widened to int16, rows 0..4 then rows 4..8 of each (lane pair 2r, 2r + 1 of a `pmaddwd`
    /// holding row r's four weights of the chunk).
    ///
    /// # Safety
    /// Block b of the group readable at `g`; AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_block(g: *const u8, b: usize) -> (__m256, [[__m256i; 2]; 8]) {
        let (gbb, qo) = layout::<{ fmt::Q8_0 }>();
        let mut w = [[_mm256_setzero_si256(); 2]; 8];
        // SAFETY: the block's scales and quant chunks are readable per the caller.
        unsafe {
            let p = g.add(b * gbb);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
            for (j, wj) in w.iter_mut().enumerate() {
                let c = p.add(qo + 32 * j);
                wj[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128(c.cast()));
                wj[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128(c.add(16).cast()));
            }
            (dw, w)
        }
    }

    /// The eight rows' exact dot of one run of chunks with x's four int16 values per chunk
    /// (`x4(j)`), in row order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_dot(w: &[[__m256i; 2]], x4: impl Fn(usize) -> __m256i) -> __m256i {
        let (mut s03, mut s47) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for (j, wj) in w.iter().enumerate() {
            let xv = x4(j);
            s03 = _mm256_add_epi32(s03, _mm256_madd_epi16(wj[0], xv));
            s47 = _mm256_add_epi32(s47, _mm256_madd_epi16(wj[1], xv));
        }
        // hadd gives rows 0 1 4 5 | 2 3 6 7.
        let order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(s03, s47), order)
    }

    /// The eight rows of the Q8_0 group at `g` (`nb` blocks) dotted with each of `T` int16 x,
    /// the float steps those of `group_i16`.
    ///
    /// # Safety
    /// As for `group_i16`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q8_group_i16<const T: usize>(
        g: *const u8,
        blocks: (usize, usize),
        xs: [&XQuant; T],
        _st: [&Starts; T],
        acc: &mut [Acc; T],
    ) {
        for b in blocks.0..blocks.1 {
            // SAFETY: block b of the group, and of every x, are readable per the caller.
            unsafe {
                let (dw, w) = q8_block(g, b - blocks.0);
                for (xq, a) in xs.iter().zip(acc.iter_mut()) {
                    let q = xq.q.as_ptr().add(32 * b);
                    let s = q8_dot(&w, |j| {
                        _mm256_set1_epi64x((q.add(4 * j) as *const i64).read_unaligned())
                    });
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*xq.scale.get_unchecked(b)));
                    a[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, a[b % 2]);
                }
            }
        }
    }

    /// The eight rows of the Q8_0 group at `g` (`nb` blocks) dotted with each of `T` int8 x
    /// (widened to int16), the float steps those of `group_i8`.
    ///
    /// # Safety
    /// As for `group_i16`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q8_group_i8<const T: usize>(
        g: *const u8,
        blocks: (usize, usize),
        xs: [&X8; T],
        _st: [&Starts; T],
        acc: &mut [Acc; T],
    ) {
        for b in blocks.0..blocks.1 {
            // SAFETY: block b of the group, and of every x, are readable per the caller.
            unsafe {
                let (dw, w) = q8_block(g, b - blocks.0);
                for (x, a) in xs.iter().zip(acc.iter_mut()) {
                    let q = x.q.as_ptr().add(32 * b);
                    let x4 = |j: usize| {
                        let v = _mm_cvtsi32_si128((q.add(4 * j) as *const i32).read_unaligned());
                        _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(v))
                    };
                    let sa = q8_dot(&w[..4], x4);
                    let sb = q8_dot(&w[4..], |j| x4(4 + j));
                    let (da, db) = (*x.dv.get_unchecked(8 * b), *x.dv.get_unchecked(8 * b + 4));
                    let fa = _mm256_mul_ps(dw, _mm256_set1_ps(da));
                    let fb = _mm256_mul_ps(dw, _mm256_set1_ps(db));
                    a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), fa, a[0]);
                    a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), fb, a[1]);
                }
            }
        }
    }
}

/// The AVX-512 VNNI forms.
pub(crate) mod vnni {
    use super::*;
    interleaved_kernels!(
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
        dot_vnni,
        true
    );
}
