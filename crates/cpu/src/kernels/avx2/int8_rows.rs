//! The dot products of quantized weight rows with int8 x ([`super::int8::X8`]), one kernel per
//! format for 1..[`TOKENS`] tokens at once, written once over [`Int8Format`] and compiled for two
//! instruction sets: AVX2 (`vpmaddubsw` + `vpmaddwd`) and AVX-512 VNNI (`vpdpbusd`).
//!
//! Per row and 32-block the integer dot Σ u·q over the block's 32 quants is exact (and so the
//! same on both instruction sets and in any order), started from the block's bias term; each
//! lane's i32 then enters the row's f32 accumulator with one conversion and one FMA by d_w·d_x
//! (x's scale per 16-value half; the weights' per 32-block or per half). A row's eight blocks
//! are decoded once per chunk and dotted with every token in turn; each (row, token) pair has
//! its own accumulators, which see the same operations in the same order whatever other rows
//! and tokens share the call: so a token's dots are bit-identical whether it comes alone or with
//! others, and on either instruction set. Mins enter once per chunk against x's Σ d·q sums.

use super::int8::{X8View, CHUNK, X8};
use super::int8_formats::{Int8Format, Mins};
use super::reduce::hsum;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

pub(crate) use super::int8_formats::TOKENS;

/// Hint the cache to fetch bytes `start..end` of each row at `next[i]`.
#[inline(always)]
pub(super) fn fetch<const R: usize>(next: &[*const u8; R], start: usize, end: usize) {
    for q in next {
        let mut off = start & !63;
        while off < end {
            // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is
            // baseline on x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(off) as *const i8) };
            off += 64;
        }
    }
}

/// Blocks in chunk `c` of the rows dotted with `x`: `N`, or for `N` 0 the rest of the row (at
/// most [`CHUNK`]).
#[inline(always)]
fn chunk_len<const N: usize>(x: &X8View, c: usize) -> usize {
    if N == 0 {
        (x.blocks() - CHUNK * c).min(CHUNK)
    } else {
        N
    }
}

/// The kernel of [`Int8Format`] `F` over `R` rows and the tokens `xs`, for one instruction set:
/// `$feat` its features, `$dot(start, u, x)` its exact i32 lane sums start + Σ u·x over each 4
/// bytes (u unsigned below 128 or exactly 128, x signed).
macro_rules! int8_kernel {
    ($name:ident, $feat:literal, $dot:ident) => {
        /// out[i][t] = dot(row i, token t) for the `R` rows at `p[i]` (`blocks` 32-blocks of `F`
        /// each) and the tokens `xs` (at most [`TOKENS`], each of `blocks` blocks); with `FETCH`
        /// the rows at `next[i]` are fetched alongside.
        ///
        /// # Safety
        /// The rows readable; the CPU has `$feat`. `next` may hold any addresses.
        #[inline]
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn $name<
            F: Int8Format,
            const R: usize,
            const T: usize,
            const FETCH: bool,
        >(
            p: &[*const u8; R],
            next: &[*const u8; R],
            xs: &[&X8],
            blocks: usize,
        ) -> [[f32; TOKENS]; R] {
            debug_assert!(xs.len() <= T && T <= TOKENS);
            debug_assert!(xs.iter().all(|x| x.blocks() == blocks));
            let mut out = [[0f32; TOKENS]; R];
            if xs.is_empty() {
                return out;
            }
            // Each token as `F` reads it (its quants in the decoder's order).
            let xv: [X8View; T] = std::array::from_fn(|t| xs[t.min(xs.len() - 1)].view(F::ORDER));
            // Two accumulators per (row, token): even and odd blocks.
            let mut acc = [[[_mm256_setzero_ps(); 2]; R]; T];
            let mut rows = [Rows::UNSET; R];
            for c in 0..blocks.div_ceil(CHUNK) {
                let n = (blocks - CHUNK * c).min(CHUNK);
                let at = c * F::CHUNK_BYTES;
                if FETCH {
                    let len = if n == CHUNK {
                        F::CHUNK_BYTES
                    } else {
                        n * F::BLOCK_BYTES
                    };
                    fetch(next, at, at + len);
                }
                if T == 1 && F::BLOCKWISE {
                    let pc: [*const u8; R] = std::array::from_fn(|i| p[i].wrapping_add(at));
                    // SAFETY: as below.
                    unsafe {
                        match n {
                            CHUNK => chunk_blockwise::<F, R, CHUNK>(&pc, &xv[0], c, &mut acc[0]),
                            _ => chunk_blockwise::<F, R, 0>(&pc, &xv[0], c, &mut acc[0]),
                        }
                    }
                    continue;
                }
                if T == 1 {
                    // One token: each row's chunk goes from the decoder straight into its dots
                    // (kept in registers, not stored for other tokens); the same arithmetic.
                    for (i, &pi) in p.iter().enumerate() {
                        let mut r = [Rows::UNSET];
                        let mut a = [acc[0][i]];
                        // SAFETY: as below.
                        unsafe {
                            rows_chunk::<F>(&mut r[0], pi.add(at), n);
                            match n {
                                CHUNK => chunk_token::<F, 1, CHUNK>(&r, &xv[0], c, &mut a),
                                _ => chunk_token::<F, 1, 0>(&r, &xv[0], c, &mut a),
                            }
                        }
                        acc[0][i] = a[0];
                    }
                    continue;
                }
                for (r, &pi) in rows.iter_mut().zip(p) {
                    // SAFETY: chunk c of every row holds n readable blocks per the caller; the
                    // tokens hold every block of the rows.
                    unsafe { rows_chunk::<F>(r, pi.add(at), n) };
                }
                for (x, a) in xv.iter().zip(acc.iter_mut()).take(xs.len()) {
                    // SAFETY: the tokens hold every block of the rows.
                    unsafe {
                        match n {
                            CHUNK => chunk_token::<F, R, CHUNK>(&rows, x, c, a),
                            _ => chunk_token::<F, R, 0>(&rows, x, c, a),
                        }
                    }
                }
            }
            for (t, a) in acc.iter().enumerate().take(xs.len()) {
                for (o, ai) in out.iter_mut().zip(a) {
                    o[t] = hsum(_mm256_add_ps(ai[0], ai[1]));
                }
            }
            out
        }

        /// The `n` blocks of a row's chunk at `p` decoded into `r`, as the token loop reads them.
        ///
        /// # Safety
        /// As for [`Int8Format::decode`].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn rows_chunk<F: Int8Format>(r: &mut Rows, p: *const u8, n: usize) {
            // SAFETY: forwarded from the caller.
            let dec = unsafe { F::decode(p, n) };
            for (k, v) in dec.q.iter().enumerate() {
                match F::SIGNED {
                    true => {
                        r.sign[k] = MaybeUninit::new(*v);
                        r.q[k] = MaybeUninit::new(_mm256_abs_epi8(*v));
                    }
                    false => r.q[k] = MaybeUninit::new(*v),
                }
            }
            // Per block, its halves' scales in its dot's lanes 0..4 and 4..8.
            if F::PER16 {
                let halves = _mm256_loadu_si256(F::ORDER.lane_halves().as_ptr().cast());
                for (k, h) in r.half.iter_mut().enumerate() {
                    let idx = _mm256_add_epi32(halves, _mm256_set1_epi32(2 * (k % 4) as i32));
                    *h = MaybeUninit::new(_mm256_permutevar8x32_ps(dec.scale[k / 4], idx));
                }
            }
            r.scale = MaybeUninit::new(dec.scale[0]);
            r.min = dec.min.map(MaybeUninit::new);
        }

        /// [`chunk_token`] for a [`Int8Format::BLOCKWISE`] format, its rows' chunks at `p`:
        /// block by block, each row's block decoded beside its dot (x's block loaded once for
        /// all the rows). Each accumulator sees exactly `chunk_token`'s operations in its order.
        ///
        /// # Safety
        /// As for the kernel; `p[i]` is row i's chunk c.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn chunk_blockwise<F: Int8Format, const R: usize, const N: usize>(
            p: &[*const u8; R],
            x: &X8View,
            c: usize,
            acc_out: &mut [[__m256; 2]; R],
        ) {
            let mut acc = *acc_out;
            let n = chunk_len::<N>(x, c);
            let mut dw = [[0f32; CHUNK]; R];
            // SAFETY: n blocks readable at each p[i] per the caller; x's per-block vectors hold
            // blocks 8c..8c + n (and are padded to whole chunks).
            unsafe {
                for ((&pi, a), dwi) in p.iter().zip(acc.iter_mut()).zip(dw.iter_mut()) {
                    if F::PER16 {
                        continue;
                    }
                    let (scale, min) = F::factors(pi, n);
                    if F::MINS == Mins::Per32 {
                        let s = _mm256_loadu_ps(x.s.as_ptr().add(CHUNK * c));
                        a[1] = _mm256_fmadd_ps(min, s, a[1]);
                    }
                    _mm256_storeu_ps(dwi.as_mut_ptr(), scale);
                }
                for k in 0..n {
                    let b = CHUNK * c + k;
                    let (xv, start, dx) = x_block::<F>(x, b);
                    for ((&pi, a), dwi) in p.iter().zip(acc.iter_mut()).zip(&dw) {
                        let q = F::block(pi, k);
                        let (u, xk) = match F::SIGNED {
                            true => (_mm256_abs_epi8(q), _mm256_sign_epi8(xv, q)),
                            false => (q, xv),
                        };
                        let f = _mm256_cvtepi32_ps($dot(start, u, xk));
                        a[k % 2] = match F::PER16 {
                            // As `chunk_token`'s arms, operation for operation.
                            true => {
                                let h = _mm256_mul_ps(F::half_scales(pi, k), dx);
                                _mm256_fmadd_ps(f, h, a[k % 2])
                            }
                            false => {
                                let d = _mm256_broadcast_ss(dwi.get_unchecked(k));
                                _mm256_fmadd_ps(_mm256_mul_ps(d, dx), f, a[k % 2])
                            }
                        };
                    }
                }
            }
            *acc_out = acc;
        }

        /// The rows' chunk `c` (blocks `8c..`, `N` of them, or the rest of the row for `N` 0)
        /// dotted with one token `x`, added to the rows' accumulators `acc`.
        ///
        /// # Safety
        /// As for the kernel; `rows` are the rows' chunk c.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn chunk_token<F: Int8Format, const R: usize, const N: usize>(
            rows: &[Rows; R],
            x: &X8View,
            c: usize,
            acc_out: &mut [[__m256; 2]; R],
        ) {
            // A local copy, kept in registers (through the reference, every FMA is stored).
            let mut acc = *acc_out;
            let n = chunk_len::<N>(x, c);
            // Each row's per-32 weight scales (formats scaled per 32), broadcast per block.
            let mut dw = [[0f32; CHUNK]; R];
            // SAFETY: the per-block vectors of x are padded to whole chunks; blocks 8c..8c + n
            // exist in x.q and x.neg8; each row field read was set by `rows_chunk` for this
            // format (its reads follow the same `F` constants as its writes).
            unsafe {
                for ((row, a), dwi) in rows.iter().zip(acc.iter_mut()).zip(dw.iter_mut()) {
                    match F::MINS {
                        Mins::None => {}
                        Mins::Per32 => {
                            let s = _mm256_loadu_ps(x.s.as_ptr().add(CHUNK * c));
                            a[1] = _mm256_fmadd_ps(row.min[0].assume_init(), s, a[1]);
                        }
                        Mins::Per16 => {
                            let s = x.s16.as_ptr().add(2 * CHUNK * c);
                            a[1] =
                                _mm256_fmadd_ps(row.min[0].assume_init(), _mm256_loadu_ps(s), a[1]);
                            let m1 = row.min[1].assume_init();
                            a[1] = _mm256_fmadd_ps(m1, _mm256_loadu_ps(s.add(8)), a[1]);
                        }
                    }
                    if !F::PER16 {
                        _mm256_storeu_ps(dwi.as_mut_ptr(), row.scale.assume_init());
                    }
                }
                for k in 0..n {
                    let b = CHUNK * c + k;
                    let (xv, start, dx) = x_block::<F>(x, b);
                    for ((row, a), dwi) in rows.iter().zip(acc.iter_mut()).zip(&dw) {
                        let xk = match F::SIGNED {
                            true => _mm256_sign_epi8(xv, row.sign[k].assume_init()),
                            false => xv,
                        };
                        let f = _mm256_cvtepi32_ps($dot(start, row.q[k].assume_init(), xk));
                        a[k % 2] = match F::PER16 {
                            true => {
                                let h = _mm256_mul_ps(row.half[k].assume_init(), dx);
                                _mm256_fmadd_ps(f, h, a[k % 2])
                            }
                            false => {
                                let d = _mm256_broadcast_ss(dwi.get_unchecked(k));
                                _mm256_fmadd_ps(_mm256_mul_ps(d, dx), f, a[k % 2])
                            }
                        };
                    }
                }
            }
            *acc_out = acc;
        }
    };
}

/// One row's chunk of eight blocks ready for the token loop: its quants (as unsigned bytes,
/// with their signs apart for a signed format), the per-block lane scales of a per-16 format,
/// its per-32 scales and its mins. Fields start unset (no stores: a kernel call is often only a
/// few rows' work): the decoder sets what the format reads, the token loop reads only that.
#[derive(Clone, Copy)]
struct Rows {
    q: [MaybeUninit<__m256i>; CHUNK],
    sign: [MaybeUninit<__m256i>; CHUNK],
    half: [MaybeUninit<__m256>; CHUNK],
    scale: MaybeUninit<__m256>,
    min: [MaybeUninit<__m256>; 2],
}

impl Rows {
    const UNSET: Rows = Rows {
        q: [MaybeUninit::uninit(); CHUNK],
        sign: [MaybeUninit::uninit(); CHUNK],
        half: [MaybeUninit::uninit(); CHUNK],
        scale: MaybeUninit::uninit(),
        min: [MaybeUninit::uninit(); 2],
    };
}

/// What block `b` of `x` brings to every row's dot: its 32 quants, the integer start value of
/// format `F` ([`bias_start`]) and its two half scales in the lanes of the dot.
///
/// # Safety
/// Block b exists in `x`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn x_block<F: Int8Format>(x: &X8View, b: usize) -> (__m256i, __m256i, __m256) {
    // SAFETY: block b's quants, lanes and scales are in x per the caller.
    unsafe {
        (
            _mm256_loadu_si256(x.q.as_ptr().add(32 * b).cast()),
            bias_start::<F>(x, b),
            _mm256_loadu_ps(x.dv.as_ptr().add(8 * b)),
        )
    }
}

/// The integer start value of block `b`'s dot for format `F`: −BIAS · Σ q of each 4 quants of
/// x, from x's −8 · Σ (exact shifts: every lane is a multiple of 8).
///
/// # Safety
/// Block b exists in `x`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bias_start<F: Int8Format>(x: &X8View, b: usize) -> __m256i {
    if F::BIAS == 0 {
        return _mm256_setzero_si256();
    }
    // SAFETY: block b's eight lanes are in neg8 per the caller.
    let neg8 = unsafe { _mm256_loadu_si256(x.neg8.as_ptr().add(8 * b).cast()) };
    match F::BIAS {
        1 => _mm256_srai_epi32::<3>(neg8),
        4 => _mm256_srai_epi32::<1>(neg8),
        8 => neg8,
        12 => _mm256_add_epi32(neg8, _mm256_srai_epi32::<1>(neg8)),
        16 => _mm256_slli_epi32::<1>(neg8),
        32 => _mm256_slli_epi32::<2>(neg8),
        _ => unreachable!("no start value for a bias of {}", F::BIAS),
    }
}

/// start + Σ u·x per 4 bytes with `vpmaddubsw` (pairs, exact below i16's bounds: |u·x| sums of
/// two stay <= 2·128·127) and `vpmaddwd` by ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_avx2(start: __m256i, u: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(u, x);
    _mm256_add_epi32(start, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// start + Σ u·x per 4 bytes with `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn dot_vnni(start: __m256i, u: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(start, u, x)
}

/// The AVX2 form.
pub(super) mod avx2 {
    use super::*;
    int8_kernel!(rows, "avx2,fma,f16c", dot_avx2);
}

/// The AVX-512 VNNI form.
pub(super) mod vnni {
    use super::*;
    int8_kernel!(
        rows,
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
        dot_vnni
    );
}

/// `$body` with the type `$F` standing for the [`Int8Format`] of the quantized runtime dtype
/// `$dtype`; `$other` for the float formats.
macro_rules! with_int8 {
    ($dtype:expr, $F:ident => $body:expr, else => $other:expr) => {
        with_int8!(@ $dtype, $F => $body, $other; Q8_0 = q::Q8_0, Q4_0 = q::Q4_0,
            Q4_1 = q::Q4_1, Q5_0 = q::Q5_0, Q5_1 = q::Q5_1, Q2_K = k::Q2K, Q3_K = k::Q3K,
            Q4_K = k::Q4K, Q5_K = k::Q5K, Q6_K = k::Q6K, IQ4_NL = t::IQ4NL, IQ4_XS = t::IQ4XS,
            MXFP4 = t::MXFP4, TQ1_0 = tq::TQ1, TQ2_0 = tq::TQ2, NVFP4 = lb::NVFP4, Q1_0 = lb::Q1,
            Q2_0 = lb::Q2, IQ2_XXS = l2::IQ2XXS, IQ2_XS = l2::IQ2XS, IQ2_S = l2::IQ2S,
            IQ3_XXS = i3::IQ3XXS, IQ3_S = i3::IQ3S, IQ1_S = i1::IQ1S, IQ1_M = i1::IQ1M)
    };
    (@ $dtype:expr, $F:ident => $body:expr, $other:expr; $($d:ident = $t:ty),*) => {{
        #[allow(unused_imports)]
        use $crate::kernels::avx2::{
            iq1 as i1, iq2 as l2, iq3 as i3, kquant as k, lowbit as lb, quant as q, table as t,
            ternary as tq,
        };
        match $dtype {
            $(powerinfer_core::DType::$d => {
                type $F = $t;
                $body
            })*
            _ => $other,
        }
    }};
}
pub(super) use with_int8;

/// The kernel of `F` on `R` rows for the instruction set `vnni` says.
///
/// # Safety
/// As for the kernels; `vnni` only on the AVX-512 level.
#[inline]
pub(super) unsafe fn rows_of<F: Int8Format, const R: usize, const FETCH: bool>(
    vnni: bool,
    p: &[*const u8; R],
    next: &[*const u8; R],
    xs: &[&X8],
    blocks: usize,
) -> [[f32; TOKENS]; R] {
    // SAFETY: forwarded from the caller. One token takes the kernel sized for one (its
    // accumulators set up and stored for it alone); its arithmetic is the same. A fused
    // kernel is AVX2 alone, so the same on both levels.
    unsafe {
        if F::FUSED {
            return match xs.len() {
                1 => F::fused::<R, 1, FETCH>(p, next, xs, blocks),
                _ => F::fused::<R, TOKENS, FETCH>(p, next, xs, blocks),
            };
        }
        match (vnni, xs.len()) {
            (true, 1) => vnni::rows::<F, R, 1, FETCH>(p, next, xs, blocks),
            (true, _) => vnni::rows::<F, R, TOKENS, FETCH>(p, next, xs, blocks),
            (false, 1) => avx2::rows::<F, R, 1, FETCH>(p, next, xs, blocks),
            (false, _) => avx2::rows::<F, R, TOKENS, FETCH>(p, next, xs, blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{rows_dot_x8, scattered_dot_x8, wide_choices};
    use super::*;
    use crate::reference::{abs_dot_row, dot_row_f64, x8::x8_hat};
    use crate::testutil::{random_weight, Rng};
    use powerinfer_core::DType;

    /// Allowed |error| of an int8-x dot against the float64 dot of the same weights with the
    /// same x̂, relative to Σ|w·x̂|: the f32 roundings of the accumulation (a unit roundoff per
    /// block in each lane, and a few for the scales and the final sum), nothing else.
    fn tol(cols: usize) -> f64 {
        f64::from(f32::EPSILON) * (cols / 32 + 16) as f64
    }

    /// Every quantized format, rows of 1..=17 blocks (K-quants 1..=3 super-blocks), 1..=9 rows
    /// (groups and single rows), 1..=9 tokens (a call of eight and one more), both instruction
    /// sets: every dot is within [`tol`] of the float64 oracle on x̂, and bit-identical to the
    /// same token dotted alone, on the other instruction set, and through the scattered-row
    /// entry.
    #[test]
    fn exact_on_the_same_x_and_the_same_bits_at_any_batch() {
        let mut rng = Rng::new(83);
        for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            let counts: Vec<usize> = match dtype.block_size() {
                256 => vec![8, 16, 24],
                // Whole blocks of 64 or 128: odd chunk counts and partial last chunks.
                b => (1..=20).filter(|k| (32 * k) % b == 0).collect(),
            };
            for blocks in counts {
                let cols = 32 * blocks;
                let rows = 1 + rng.next_u64() as usize % 9;
                let tokens = 1 + rng.next_u64() as usize % 9;
                let w = random_weight(&mut rng, dtype, rows, cols);
                let row_bytes = dtype.row_bytes(cols).unwrap();
                let mut x: Vec<Vec<f32>> = (0..tokens).map(|_| rng.vec(cols)).collect();
                // An outlier channel, as LLM activations have.
                x[0][cols / 3] = 90.0;
                let xq: Vec<X8> = x.iter().map(|t| X8::new(t).unwrap()).collect();
                let refs: Vec<&X8> = xq.iter().collect();
                let mut first: Option<Vec<Vec<f32>>> = None;
                for vnni in wide_choices() {
                    let mut outs = vec![vec![f32::NAN; rows]; tokens];
                    let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
                    rows_dot_x8(dtype, w.bytes(), row_bytes, &refs, &mut o, vnni);
                    for (t, out) in outs.iter().enumerate() {
                        let hat = x8_hat(&x[t]).unwrap();
                        for (r, &got) in out.iter().enumerate() {
                            let want = dot_row_f64(dtype, w.row(r), &hat);
                            let scale = abs_dot_row(dtype, w.row(r), &hat);
                            let err = (got as f64 - want).abs();
                            assert!(
                                err <= tol(cols) * scale + 1e-30,
                                "{dtype} blocks {blocks} row {r} token {t} vnni {vnni}: got {got}, want {want}, err {err:e}"
                            );
                        }
                        let mut alone = vec![f32::NAN; rows];
                        rows_dot_x8(
                            dtype,
                            w.bytes(),
                            row_bytes,
                            &[refs[t]],
                            &mut [&mut alone],
                            vnni,
                        );
                        assert_eq!(bits(&alone), bits(out), "{dtype} token {t} alone");
                        let scattered: Vec<&[u8]> =
                            (0..rows.min(8)).rev().map(|r| w.row(r)).collect();
                        let mut s = vec![f32::NAN; scattered.len()];
                        scattered_dot_x8(dtype, &scattered, &[], refs[t], &mut s, vnni);
                        let want: Vec<f32> = (0..rows.min(8)).rev().map(|r| out[r]).collect();
                        assert_eq!(bits(&s), bits(&want), "{dtype} token {t} scattered");
                    }
                    match &first {
                        None => first = Some(outs),
                        Some(f) => {
                            for (a, b) in f.iter().zip(&outs) {
                                assert_eq!(bits(a), bits(b), "{dtype}: AVX2 and VNNI differ");
                            }
                        }
                    }
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Q4_0 blocks whose quants are all 8 and Q5_0 blocks all 16 are zero weights: their dot is
    /// exactly zero whatever d and x (the bias is taken in integers).
    #[test]
    fn biased_zero_weights_give_exactly_zero() {
        use half::f16;
        let mut rng = Rng::new(84);
        for (dtype, body) in [
            (DType::Q4_0, vec![0x88u8; 16]),
            (DType::Q5_0, {
                let mut b = vec![0u8; 4];
                b.extend([0u8; 16]);
                b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
                b
            }),
        ] {
            let (rows, blocks) = (5, 13);
            let mut bytes = Vec::new();
            for _ in 0..rows * blocks {
                bytes.extend(f16::from_f32(rng.uniform(0.5, 3.0)).to_le_bytes());
                bytes.extend(&body);
            }
            let x: Vec<f32> = rng.vec(32 * blocks).iter().map(|v| v * 1e3).collect();
            let xq = X8::new(&x).unwrap();
            let row_bytes = dtype.row_bytes(32 * blocks).unwrap();
            for vnni in wide_choices() {
                let mut y = vec![f32::NAN; rows];
                rows_dot_x8(dtype, &bytes, row_bytes, &[&xq], &mut [&mut y], vnni);
                assert_eq!(y, vec![0.0; rows], "{dtype}");
            }
        }
    }
}
