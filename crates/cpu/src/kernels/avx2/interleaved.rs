//! Dot products of Q4_0 and Q4_1 rows interleaved by eight (`crate::operands::interleaved`) with
//! quantized x: the eight rows of a group sit in the eight i32 lanes of every byte dot, each
//! against one broadcast word (four values) of x, so a block costs eight byte dots, one scale
//! conversion and one or two FMAs for eight rows, and no horizontal sum. For either numerics:
//! the int16 x (its high and low bytes dotted apart, `256·Σh + Σl`, exact) or the int8 x (a
//! scale per 16 values: each half's dot apart). Q4_0's −8 is the dots' integer start value, Q4_1's
//! mins one FMA per block against x's block sums (of x itself for the int16 x, as the row kernels
//! take them; of x̂ for the int8 x). Written once over the instruction set's byte dot and the
//! format (`MIN`: Q4_1), as `super::int8_rows`.

use super::int16::XQuant;
use super::int8::X8;
use super::int8_rows::{dot_avx2, dot_vnni};
use std::arch::x86_64::*;

/// Per-block integer start values an x brings to the interleaved Q4_0 dots: −8·Σq (its bias)
/// over the block (int16) or over each half (int8).
pub(crate) struct Starts(Vec<[i32; 2]>);

impl Starts {
    /// For the int16 x.
    pub(crate) fn of_int16(xq: &XQuant) -> Starts {
        Starts(
            xq.neg_bias8
                .chunks_exact(8)
                .map(|l| [l.iter().sum(), 0])
                .collect(),
        )
    }

    /// For the int8 x.
    pub(crate) fn of_int8(x: &X8) -> Starts {
        Starts(
            x.neg8
                .chunks_exact(8)
                .map(|l| [l[..4].iter().sum(), l[4..].iter().sum()])
                .collect(),
        )
    }
}

/// A group block's bytes and where its quants start: Q4_1 (`MIN`) carries eight mins after the
/// eight scales.
#[inline(always)]
const fn layout<const MIN: bool>() -> (usize, usize) {
    match MIN {
        true => (8 * 20, 32),
        false => (8 * 18, 16),
    }
}

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

/// The group kernels for one instruction set (`$dot` its byte dot), for `T` tokens at once:
/// each block's quants are unpacked once, then every token's dots and FMAs follow in the order
/// one token alone takes (`T` = 1), so a token's results are the same bits in any company.
macro_rules! interleaved_kernels {
    ($feat:literal, $dot:ident) => {
        /// The eight rows of the group at `g` (`nb` blocks; Q4_1 where `MIN`, else Q4_0)
        /// dotted with each of `T` int16 x.
        ///
        /// # Safety
        /// `nb` group blocks readable at `g`; every `xs[t]` and `st[t]` of `nb` blocks; the CPU
        /// has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn group_i16<const MIN: bool, const T: usize>(
            g: *const u8,
            nb: usize,
            xs: [&XQuant; T],
            st: [&Starts; T],
        ) -> [[f32; 8]; T] {
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nb {
                // SAFETY: block b of the group, and of every x, are readable per the caller.
                unsafe {
                    let (dw, mins, lo, hi) = group_block::<MIN>(g, b);
                    for ((xq, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                        let (h, l) = (xq.hl.as_ptr().add(64 * b), xq.hl.as_ptr().add(64 * b + 32));
                        let mut sh = _mm256_setzero_si256();
                        let mut sl = match MIN {
                            true => _mm256_setzero_si256(),
                            false => _mm256_set1_epi32(st.0.get_unchecked(b)[0]),
                        };
                        if MIN {
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
            let mut out = [[0f32; 8]; T];
            for (o, a) in out.iter_mut().zip(acc) {
                *o = sum8(a);
            }
            out
        }

        /// The eight rows of the group at `g` (`nb` blocks; Q4_1 where `MIN`, else Q4_0)
        /// dotted with each of `T` int8 x.
        ///
        /// # Safety
        /// As for `group_i16`.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn group_i8<const MIN: bool, const T: usize>(
            g: *const u8,
            nb: usize,
            xs: [&X8; T],
            st: [&Starts; T],
        ) -> [[f32; 8]; T] {
            let mut acc = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nb {
                // SAFETY: block b of the group, and of every x, are readable per the caller.
                unsafe {
                    let (dw, mins, lo, hi) = group_block::<MIN>(g, b);
                    for ((x, st), a) in xs.iter().zip(&st).zip(acc.iter_mut()) {
                        let q = x.q.as_ptr().add(32 * b);
                        let [na, nb_] = match MIN {
                            true => [0, 0],
                            false => *st.0.get_unchecked(b),
                        };
                        let (mut sa, mut sb) = (_mm256_set1_epi32(na), _mm256_set1_epi32(nb_));
                        if MIN {
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
            let mut out = [[0f32; 8]; T];
            for (o, a) in out.iter_mut().zip(acc) {
                *o = sum8(a);
            }
            out
        }

        /// Group block `b` at `g` (Q4_1 where `MIN`): its eight rows' scales, their mins (Q4_1;
        /// else zeros), and its four 32-byte quant chunks as low and high nibbles.
        ///
        /// # Safety
        /// Block b of the group readable at `g`; the CPU has `$feat`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn group_block<const MIN: bool>(
            g: *const u8,
            b: usize,
        ) -> (__m256, __m256, [__m256i; 4], [__m256i; 4]) {
            let (gbb, qo) = layout::<MIN>();
            let m = _mm256_set1_epi8(0x0F);
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            // SAFETY: the block's scales, mins and quant chunks are readable per the caller.
            unsafe {
                let p = g.add(b * gbb);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(p.cast()));
                let mins = match MIN {
                    true => _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
                    false => _mm256_setzero_ps(),
                };
                for j in 0..4 {
                    let v = _mm256_loadu_si256(p.add(qo + 32 * j).cast());
                    lo[j] = _mm256_and_si256(v, m);
                    hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
                }
                (dw, mins, lo, hi)
            }
        }

        /// The eight rows' sums of the two accumulators.
        #[inline]
        #[target_feature(enable = $feat)]
        fn sum8(a: [__m256; 2]) -> [f32; 8] {
            let mut out = [0f32; 8];
            // SAFETY: eight floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(a[0], a[1])) };
            out
        }
    };
}

/// The AVX2 forms.
pub(crate) mod avx2 {
    use super::*;
    interleaved_kernels!("avx2,fma,f16c", dot_avx2);
}

/// The AVX-512 VNNI forms.
pub(crate) mod vnni {
    use super::*;
    interleaved_kernels!(
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
        dot_vnni
    );
}
