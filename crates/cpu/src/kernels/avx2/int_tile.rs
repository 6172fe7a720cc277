//! The integer matmul of prompt prefill on the AVX-512 level: a tile of quantized weight rows
//! times every token with `vpdpwssd` (32 int16 multiply-adds per instruction, twice the f32 FMA
//! rate), for every quantized format.
//!
//! **Weights.** A tile of [`TILE_ROWS`] rows is decoded once per call into int16 with the
//! format's small integer sub-block scales folded in (Q4_K: q·sc <= 15·63; Q6_K:
//! (q − 32)·sc, |·| <= 32·128), leaving one float factor per row and *span* (the 256 weights
//! of a K-quant super-block, or a 32-weight block). The int16 weights are stored
//! transposed, lanes = rows: each 64-byte vector holds columns 2k, 2k + 1 of sixteen rows, so
//! one `vpdpwssd` against a broadcast pair of a token's x adds two columns to sixteen rows'
//! sums, and the sums come out as a vector of sixteen rows with no horizontal reduction.
//! The formats with mins (Q2_K, Q4_K, Q5_K, Q4_1, Q5_1) keep them as f32 coefficients per
//! sub-block, applied as FMAs with the token's f32 sums of x over the sub-block.
//!
//! **Tokens.** Each token's x is quantized to int16 with one f32 scale per 32 values (as the
//! matvec's `int16` path), no larger than the format's [`IntTile::X_MAX`], the largest
//! magnitude for which a 32-value block of products sums without overflowing the int32 lanes:
//! 32 · max|wq| · X_MAX < 2³¹, so Q6_K takes x up to ±16383 and every other format the full
//! ±32767. Each block's int32 sums are converted once and added with an FMA by the block's
//! s_x into f32 span sums, which take the rows' factors d once per span (per block for the
//! 32-weight formats, whose d changes every block: there the two multiplies are fused as
//! d·s_x). So per 16 rows and token, a K-quant span costs 128 `vpdpwssd`, 8 conversions, 8
//! FMAs and one FMA by d (plus 8 or 16 FMAs of mins); a 32-weight block 16 `vpdpwssd`, a
//! conversion, a multiply and an FMA.
//!
//! A scale per 256 values would save the per-block conversions (about 10% of the K-quants'
//! tile time), but only with x at 12 to 14 bits (the overflow bound over 256 columns), and an
//! outlier in x then costs the whole super-block its precision: with one value in 97 thirty
//! times larger, the dots of random rows missed the crate's bound by up to 9x (Q6_K).
//!
//! **Blocking.** The register block is [`G`] groups of 16 rows by up to `T` tokens ([`T_K`]
//! for the K-quants, which hold G·T int32, span and total accumulators; [`T_32`] for the
//! 32-weight formats, which need no span sums): G weight vectors per column pair and one
//! broadcast per token. A tile's weights (G·16 rows, all columns) stay in L2 while every token block sweeps
//! them.

use super::kquant::{Q2K, Q3K, Q4K, Q5K, Q6K};
use super::quant::{Offset, QuantFormat, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::wide_k::WideK;
use powerinfer_core::dequantize::{k3_scale, k4_scale_min};
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Rows per 512-bit vector of int32 lanes.
const LANES: usize = 16;
/// Groups of 16 rows per register block (and per tile).
const G: usize = 2;
/// Weight rows decoded together into one tile.
pub(crate) const TILE_ROWS: usize = G * LANES;
/// Tokens per register block of the K-quants (3·G·T accumulators).
const T_K: usize = 4;
/// Tokens per register block of the 32-weight formats (2·G·T accumulators).
const T_32: usize = 6;
/// Values of x per scale (and per int32 accumulation).
const XB: usize = 32;
/// Largest rounding error of a token's int16 x, Σ over its values of half a step, as a share
/// of Σ|x|, for which a matmul takes this tile (else [`XTile::new`] says None and the f32 tile
/// runs): Gaussian x sits near 5e-5 (1e-4 for Q6_K's ±16383), the synthetic models' Q6_K
/// layers at most 1.27e-4. Blocks with outliers (SmolLM2's massive activations: median 8e-5,
/// up to 4.5e-4) cost every value of the block precision; with no bound its prefill logits
/// missed the float64 reference by up to 1.3e-3 (the bound is 1e-3), with this one 7.6e-4.
const RHO_MAX: f32 = 1.5e-4;

/// Sixteen int32 lanes, 64-byte aligned (one tile vector).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct V32([i32; 16]);

/// Sixteen f32 lanes, 64-byte aligned (per-row factors of one group).
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct F32x16([f32; 16]);

/// A quantized format as the integer tile decodes it: spans of `SPAN` weights (a block or a
/// super-block), w = d · wq + Σ_j [weight in sub-block j] · min_j, wq the int16 weight with
/// the sub-block scale folded in.
pub(super) trait IntTile {
    /// Bytes per span.
    const BYTES: usize;
    /// Weights per span (256 or 32): one float factor `d` per span.
    const SPAN: usize;
    /// Largest |x| integer: 32 · max|wq| · X_MAX < 2³¹.
    const X_MAX: f32;
    /// Min coefficients per span (0: none), each for `SPAN / MINS` consecutive weights.
    const MINS: usize;

    /// The span at `p` decoded: `SPAN / 32` vectors of 32 int16 weights wq in weight order
    /// written to `out`, the span's factor `d` returned.
    ///
    /// # Safety
    /// `BYTES` readable at `p`; the CPU has the AVX-512 level.
    unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32;

    /// The span's `MINS` min coefficients into `out` (w gains min_j on sub-block j).
    ///
    /// # Safety
    /// As for [`IntTile::decode`].
    #[inline]
    unsafe fn mins(_p: *const u8, _out: &mut [f32; 16]) {}
}

/// The f16 at `p` as f32.
///
/// # Safety
/// Two bytes readable at `p`.
#[inline]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: two readable bytes per the caller.
    half::f16::from_bits(unsafe { (p as *const u16).read_unaligned() }).to_f32()
}

/// `v` times the i16 `s` in every lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn times(v: __m512i, s: i16) -> __m512i {
    _mm512_mullo_epi16(v, _mm512_set1_epi16(s))
}

/// `v` times `a` in lanes 0..16 and `b` in lanes 16..32 (two 16-weight sub-blocks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn times2(v: __m512i, a: i16, b: i16) -> __m512i {
    let s = _mm512_inserti64x4::<1>(_mm512_set1_epi16(a), _mm256_set1_epi16(b));
    _mm512_mullo_epi16(v, s)
}

/// Q4_K and Q5_K: the super-block's scales times its quants (`chunk32` of the format), d, and
/// the mins −dmin·m.
macro_rules! impl_q45 {
    ($t:ty) => {
        impl IntTile for $t {
            const BYTES: usize = <$t as super::kquant::KFormat>::BYTES;
            const SPAN: usize = 256;
            // |wq| <= 31·63 = 1953 (Q5_K): 32·1953·32767 < 2³¹.
            const X_MAX: f32 = 32767.0;
            const MINS: usize = 8;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32 {
                // SAFETY: the 12 scale bytes follow d and dmin; chunk32 reads inside the block.
                unsafe {
                    let sm = &*(p.add(4) as *const [u8; 12]);
                    for c in 0..4 {
                        let q = <$t as WideK>::chunk32(p, c);
                        for h in 0..2 {
                            let (sc, _) = k4_scale_min(2 * c + h, sm);
                            out[2 * c + h] = times(q[h], sc as i16);
                        }
                    }
                    f16_at(p)
                }
            }

            #[inline]
            unsafe fn mins(p: *const u8, out: &mut [f32; 16]) {
                // SAFETY: dmin at 2 and the 12 scale bytes at 4 lie inside the block.
                unsafe {
                    let dmin = f16_at(p.add(2));
                    let sm = &*(p.add(4) as *const [u8; 12]);
                    for (j, o) in out.iter_mut().take(8).enumerate() {
                        *o = -dmin * k4_scale_min(j, sm).1 as f32;
                    }
                }
            }
        }
    };
}
impl_q45!(Q4K);
impl_q45!(Q5K);

impl IntTile for Q6K {
    const BYTES: usize = 210;
    const SPAN: usize = 256;
    // |wq| = |q − 32|·|sc| <= 32·128 = 4096: 32·4096·16383 < 2³¹.
    const X_MAX: f32 = 16383.0;
    const MINS: usize = 0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32 {
        // SAFETY: the 16 i8 scales sit at 192, d at 208; chunk32 reads inside the block.
        unsafe {
            let sc = &*(p.add(192) as *const [i8; 16]);
            for n in 0..2 {
                let q = <Q6K as WideK>::chunk32(p, n);
                for (k, &v) in q.iter().enumerate() {
                    let b = 4 * n + k;
                    let v = _mm512_sub_epi16(v, _mm512_set1_epi16(32));
                    out[b] = times2(v, sc[2 * b] as i16, sc[2 * b + 1] as i16);
                }
            }
            f16_at(p.add(208))
        }
    }
}

impl IntTile for Q2K {
    const BYTES: usize = 84;
    const SPAN: usize = 256;
    // |wq| <= 3·15 = 45.
    const X_MAX: f32 = 32767.0;
    const MINS: usize = 16;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32 {
        // SAFETY: the 16 scale bytes lead the block, d sits at 80; chunk32 reads inside it.
        unsafe {
            let sc = &*(p as *const [u8; 16]);
            for n in 0..2 {
                let q = <Q2K as WideK>::chunk32(p, n);
                for (k, &v) in q.iter().enumerate() {
                    let b = 4 * n + k;
                    out[b] = times2(v, (sc[2 * b] & 15) as i16, (sc[2 * b + 1] & 15) as i16);
                }
            }
            f16_at(p.add(80))
        }
    }

    #[inline]
    unsafe fn mins(p: *const u8, out: &mut [f32; 16]) {
        // SAFETY: the 16 scale bytes lead the block, dmin sits at 82.
        unsafe {
            let dmin = f16_at(p.add(82));
            let sc = &*(p as *const [u8; 16]);
            for (o, &s) in out.iter_mut().zip(sc) {
                *o = -dmin * (s >> 4) as f32;
            }
        }
    }
}

impl IntTile for Q3K {
    const BYTES: usize = 110;
    const SPAN: usize = 256;
    // |wq| <= 4·32 = 128.
    const X_MAX: f32 = 32767.0;
    const MINS: usize = 0;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32 {
        // SAFETY: the 12 scale bytes sit at 96, d at 108; chunk32 reads inside the block.
        unsafe {
            let raw = &*(p.add(96) as *const [u8; 12]);
            let sc = |s: usize| k3_scale(s, raw) as i16 - 32;
            for n in 0..2 {
                let q = <Q3K as WideK>::chunk32(p, n);
                for (k, &v) in q.iter().enumerate() {
                    let b = 4 * n + k;
                    out[b] = times2(v, sc(2 * b), sc(2 * b + 1));
                }
            }
            f16_at(p.add(108))
        }
    }
}

/// The 32-weight formats: the block's quants as i16 (Q4_0's −8 subtracted), d, and the
/// stored min of Q4_1 and Q5_1.
macro_rules! impl_legacy {
    ($t:ty, $mins:expr) => {
        impl IntTile for $t {
            const BYTES: usize = <$t as QuantFormat>::BLOCK_BYTES;
            const SPAN: usize = 32;
            // |wq| <= 128: 32·128·32767 < 2³¹.
            const X_MAX: f32 = 32767.0;
            const MINS: usize = $mins;

            #[inline]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
            unsafe fn decode(p: *const u8, out: &mut [__m512i; 8]) -> f32 {
                // SAFETY: quants16 reads inside the block; d leads it.
                unsafe {
                    let [lo, hi] = <$t as QuantFormat>::quants16(p);
                    let mut v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    if <$t as QuantFormat>::OFFSET == Offset::MinusEight {
                        v = _mm512_sub_epi16(v, _mm512_set1_epi16(8));
                    }
                    out[0] = v;
                    f16_at(p)
                }
            }

            #[inline]
            unsafe fn mins(p: *const u8, out: &mut [f32; 16]) {
                // SAFETY: Q4_1 and Q5_1 store m as the f16 after d.
                if $mins == 1 {
                    out[0] = unsafe { f16_at(p.add(2)) };
                }
            }
        }
    };
}
impl_legacy!(Q8_0, 0);
impl_legacy!(Q4_0, 0);
impl_legacy!(Q5_0, 0);
impl_legacy!(Q4_1, 1);
impl_legacy!(Q5_1, 1);

/// `$body` with `$F` bound to the [`IntTile`] type of `$dtype` (a quantized format), in the
/// style of `select::with_format`.
macro_rules! with_tile_format {
    ($dtype:expr, $F:ident => $body:expr) => {
        with_tile_format!(@ $dtype, $F => $body; Q8_0 = Q8_0, Q4_0 = Q4_0, Q4_1 = Q4_1,
            Q5_0 = Q5_0, Q5_1 = Q5_1, Q2_K = Q2K, Q3_K = Q3K, Q4_K = Q4K, Q5_K = Q5K, Q6_K = Q6K)
    };
    (@ $dtype:expr, $F:ident => $body:expr; $($d:ident = $t:ty),*) => {
        match $dtype {
            $(DType::$d => {
                type $F = $t;
                $body
            })*
            DType::F32 | DType::F16 | DType::BF16 => unreachable!("float format in the int tile"),
            DType::IQ4_NL
            | DType::IQ4_XS
            | DType::MXFP4
            | DType::TQ1_0
            | DType::TQ2_0
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
            | DType::IQ1_S
            | DType::IQ1_M => {
                unreachable!("no int tile for the decoded formats (XTile::new declines them)")
            }
            DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => {
                unreachable!("no int tile for the low-bit formats (XTile::new declines them)")
            }
        }
    };
}

/// Tokens quantized for the integer tile of one format: per token, x as int16 with one scale
/// per span, and the f32 sums of x over each min sub-block.
pub(crate) struct XTile {
    dtype: DType,
    /// round(x / scale), `cols` per token.
    q: Vec<i16>,
    /// Per token and 32-value block: x ≈ scale · q.
    scale: Vec<f32>,
    /// Per token and min sub-block: Σx (from the f32 x); empty without mins.
    sum: Vec<f32>,
    n: usize,
    cols: usize,
}

impl XTile {
    /// `n` tokens of `cols` (whole spans of `dtype`, a quantized format) prepared for the
    /// tile; `None` when x holds a NaN or infinity (the f32 path then propagates it) or `dtype` is
    /// a table format (no integer tile: their matmuls take the per-token kernels). Callers
    /// first keep to the tokens [`token_fits`] accepts.
    pub(crate) fn new(dtype: DType, x: &[f32], n: usize, cols: usize) -> Option<XTile> {
        crate::simd::debug_check_wide(true);
        if dtype.is_decoded() || dtype.is_lowbit() {
            return None;
        }
        assert!(
            dtype.is_quantized()
                && x.len() == n * cols
                && cols.is_multiple_of(256.min(dtype.block_size()))
        );
        // SAFETY: only built on the AVX-512 level (the dispatcher checks); sizes asserted.
        with_tile_format!(dtype, F => unsafe { quantize::<F>(dtype, x, n, cols) })
    }
}

/// Whether one token's x (`dtype` a quantized format) takes the integer tile: every value
/// finite, and its int16 rounding bound, Σ over its 32-value blocks of 32 · half a step, at
/// most [`RHO_MAX`] of Σ|x|. Depends on the token alone, so a token's products come out the
/// same whichever tokens share its matmul.
pub(crate) fn token_fits(dtype: DType, x: &[f32]) -> bool {
    if dtype.is_decoded() || dtype.is_lowbit() {
        return false;
    }
    let x_max = with_tile_format!(dtype, F => F::X_MAX);
    let (mut l1, mut steps) = (0f32, 0f32);
    for block in x.chunks(XB) {
        let mut amax = 0f32;
        for &v in block {
            if !v.is_finite() {
                return false;
            }
            amax = amax.max(v.abs());
            l1 += v.abs();
        }
        steps += amax;
    }
    steps * XB as f32 / (2.0 * x_max) <= RHO_MAX * l1
}

/// [`XTile::new`] for format `F`.
///
/// # Safety
/// The CPU has the AVX-512 level; `x.len() == n · cols`, `cols` a multiple of `F::SPAN`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quantize<F: IntTile>(dtype: DType, x: &[f32], n: usize, cols: usize) -> Option<XTile> {
    let min_len = F::SPAN / F::MINS.max(1);
    let mut xt = XTile {
        dtype,
        q: vec![0; n * cols],
        scale: vec![0.0; n * cols / XB],
        sum: vec![0.0; if F::MINS > 0 { n * cols / min_len } else { 0 }],
        n,
        cols,
    };
    let sign = _mm512_set1_ps(-0.0);
    for (b, (xs, qs)) in x
        .chunks_exact(XB)
        .zip(xt.q.chunks_exact_mut(XB))
        .enumerate()
    {
        // SAFETY: xs holds 32 values.
        let v = unsafe {
            [
                _mm512_loadu_ps(xs.as_ptr()),
                _mm512_loadu_ps(xs.as_ptr().add(16)),
            ]
        };
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[0])
            | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[1]);
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(
            _mm512_andnot_ps(sign, v[0]),
            _mm512_andnot_ps(sign, v[1]),
        ));
        // max_ps may drop a NaN: the mask catches it.
        if nan != 0 || !amax.is_finite() {
            return None;
        }
        match min_len {
            16 => {
                xt.sum[2 * b] = _mm512_reduce_add_ps(v[0]);
                xt.sum[2 * b + 1] = _mm512_reduce_add_ps(v[1]);
            }
            32 if F::MINS > 0 => xt.sum[b] = _mm512_reduce_add_ps(_mm512_add_ps(v[0], v[1])),
            _ => {}
        }
        // 0 for a block of zeros, and for one so small (max|x| below ~1e-34) that the factor
        // overflows: its values are 0 here.
        let inv = match F::X_MAX / amax {
            inv if amax > 0.0 && inv.is_finite() => inv,
            _ => 0.0,
        };
        let inv = _mm512_set1_ps(inv);
        xt.scale[b] = amax / F::X_MAX;
        for (h, vh) in v.iter().enumerate() {
            // Round to nearest (the default MXCSR mode); |x·inv| <= X_MAX.
            let i = _mm512_cvtps_epi32(_mm512_mul_ps(*vh, inv));
            // SAFETY: qs holds 32 i16: 16 stored at 16h.
            unsafe {
                _mm256_storeu_si256(
                    qs.as_mut_ptr().add(16 * h).cast(),
                    _mm512_cvtsepi32_epi16(i),
                )
            };
        }
    }
    Some(xt)
}

/// One tile: [`TILE_ROWS`] rows decoded (rows past the weight's end are zero).
struct WTile {
    /// Per column pair kp and group g, at kp·G + g: the pair of int16 weights of 16 rows.
    w: Vec<V32>,
    /// Per span s and group g, at s·G + g: the rows' factors d.
    d: Vec<F32x16>,
    /// Per span s, min j and group g, at (s·MINS + j)·G + g: the rows' min coefficients.
    mins: Vec<F32x16>,
}

/// The 16×16 transpose of i32 lanes: out[j] lane i = r[i] lane j.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    // a[2k] chunk c: r2k[4c], r2k+1[4c], r2k[4c+1], r2k+1[4c+1]; a[2k+1] the same for 4c+2, 4c+3.
    let a: [__m512i; 16] = std::array::from_fn(|i| {
        let (x, y) = (r[i & !1], r[i | 1]);
        match i % 2 {
            0 => _mm512_unpacklo_epi32(x, y),
            _ => _mm512_unpackhi_epi32(x, y),
        }
    });
    // b[4m + e] chunk c: column 4c + e of rows 4m..4m + 4.
    let b: [__m512i; 16] = std::array::from_fn(|i| {
        let (m, e) = (i / 4, i % 4);
        let (x, y) = (a[4 * m + e / 2], a[4 * m + 2 + e / 2]);
        match e % 2 {
            0 => _mm512_unpacklo_epi64(x, y),
            _ => _mm512_unpackhi_epi64(x, y),
        }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for e in 0..4 {
        let (b0, b1, b2, b3) = (b[e], b[4 + e], b[8 + e], b[12 + e]);
        let u0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b0, b1);
        let u1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b0, b1);
        let v0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b2, b3);
        let v1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b2, b3);
        out[e] = _mm512_shuffle_i32x4::<0b10_00_10_00>(u0, v0);
        out[4 + e] = _mm512_shuffle_i32x4::<0b11_01_11_01>(u0, v0);
        out[8 + e] = _mm512_shuffle_i32x4::<0b10_00_10_00>(u1, v1);
        out[12 + e] = _mm512_shuffle_i32x4::<0b11_01_11_01>(u1, v1);
    }
    out
}

/// Decode `count <= TILE_ROWS` rows (`row_bytes` apart from `rows`, `spans` spans each) into
/// `tile`, zero rows above `count`.
///
/// # Safety
/// The rows' spans are readable; the CPU has the AVX-512 level.
// The loops index several arrays by the same row, block and sub-block numbers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_tile<F: IntTile>(
    rows: *const u8,
    row_bytes: usize,
    count: usize,
    spans: usize,
    tile: &mut WTile,
) {
    let pairs = F::SPAN / 2;
    let mut q = [[_mm512_setzero_si512(); 8]; LANES];
    let mut mins = [[0f32; 16]; LANES];
    for g in 0..G {
        for s in 0..spans {
            let mut d = [0f32; LANES];
            for (i, (qi, mi)) in q.iter_mut().zip(&mut mins).enumerate() {
                let row = g * LANES + i;
                if row < count {
                    // SAFETY: row < count and s < spans, readable per the caller.
                    unsafe {
                        let p = rows.add(row * row_bytes + s * F::BYTES);
                        d[i] = F::decode(p, qi);
                        F::mins(p, mi);
                    }
                } else {
                    *qi = [_mm512_setzero_si512(); 8];
                    *mi = [0.0; 16];
                }
            }
            tile.d[s * G + g] = F32x16(d);
            for j in 0..F::MINS {
                tile.mins[(s * F::MINS + j) * G + g] = F32x16(std::array::from_fn(|i| mins[i][j]));
            }
            for b in 0..F::SPAN / 32 {
                let cols = transpose16(&std::array::from_fn(|i| q[i][b]));
                for (k, v) in cols.iter().enumerate() {
                    let kp = s * pairs + 16 * b + k;
                    // SAFETY: kp < spans · SPAN / 2, so the slot exists; V32 is 64-aligned.
                    unsafe { _mm512_store_si512(tile.w.as_mut_ptr().add(kp * G + g).cast(), *v) };
                }
            }
        }
    }
}

/// out[t·out_stride + row] = dot(tile row, x token t0 + t) for `TT` tokens, rows under `valid`
/// (a mask per group of 16 rows).
///
/// # Safety
/// Tokens t0..t0 + TT exist in `x`, the tile holds `x.cols` columns, the out indices are in
/// bounds for the valid rows; the CPU has the AVX-512 level.
// The register block's loops index several arrays by the same (group, token) pair.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn micro<F: IntTile, const TT: usize>(
    tile: &WTile,
    x: &XTile,
    t0: usize,
    out: *mut f32,
    out_stride: usize,
    valid: [__mmask16; G],
) {
    let spans = x.cols / F::SPAN;
    // Min sub-blocks per token.
    let groups = x.cols * F::MINS / F::SPAN;
    let mut facc = [[_mm512_setzero_ps(); TT]; G];
    let xp: [*const i32; TT] = std::array::from_fn(|t| x.q[(t0 + t) * x.cols..].as_ptr().cast());
    let sx: [*const f32; TT] = std::array::from_fn(|t| x.scale[(t0 + t) * x.cols / XB..].as_ptr());
    let wp = tile.w.as_ptr() as *const __m512i;
    for s in 0..spans {
        // Σ over the span's blocks of s_x · (int32 block sums); only the K-quants use it.
        let mut span = [[_mm512_setzero_ps(); TT]; G];
        for b in s * F::SPAN / XB..(s + 1) * F::SPAN / XB {
            let mut iacc = [[_mm512_setzero_si512(); TT]; G];
            for kp in b * XB / 2..(b + 1) * XB / 2 {
                // SAFETY: kp < cols / 2: the tile's pair kp and each token's x pair exist.
                unsafe {
                    let wv: [__m512i; G] =
                        std::array::from_fn(|g| _mm512_load_si512(wp.add(kp * G + g).cast()));
                    for t in 0..TT {
                        let xb = _mm512_set1_epi32(xp[t].add(kp).read_unaligned());
                        for g in 0..G {
                            iacc[g][t] = _mm512_dpwssd_epi32(iacc[g][t], wv[g], xb);
                        }
                    }
                }
            }
            for t in 0..TT {
                // SAFETY: block b of token t0 + t exists.
                let k = _mm512_set1_ps(unsafe { *sx[t].add(b) });
                for g in 0..G {
                    let v = _mm512_cvtepi32_ps(iacc[g][t]);
                    if F::SPAN == XB {
                        let d = _mm512_load_ps(tile.d[s * G + g].0.as_ptr());
                        facc[g][t] = _mm512_fmadd_ps(v, _mm512_mul_ps(d, k), facc[g][t]);
                    } else {
                        span[g][t] = _mm512_fmadd_ps(v, k, span[g][t]);
                    }
                }
            }
        }
        if F::SPAN != XB {
            for g in 0..G {
                let d = _mm512_load_ps(tile.d[s * G + g].0.as_ptr());
                for t in 0..TT {
                    facc[g][t] = _mm512_fmadd_ps(span[g][t], d, facc[g][t]);
                }
            }
        }
        for j in 0..F::MINS {
            for g in 0..G {
                let m = _mm512_load_ps(tile.mins[(s * F::MINS + j) * G + g].0.as_ptr());
                for t in 0..TT {
                    let sum = x.sum[(t0 + t) * groups + s * F::MINS + j];
                    facc[g][t] = _mm512_fmadd_ps(m, _mm512_set1_ps(sum), facc[g][t]);
                }
            }
        }
    }
    for g in 0..G {
        for t in 0..TT {
            // SAFETY: the valid rows of group g of token t0 + t are in bounds per the caller.
            unsafe {
                let o = out.add(t * out_stride + g * LANES);
                _mm512_mask_storeu_ps(o, valid[g], facc[g][t]);
            }
        }
    }
}

/// out[t·count + i] = dot(row i, x token t) for `count` rows of `x.dtype()` starting at `rows`,
/// `row_bytes` apart: tile by tile, every token block against each tile.
pub(crate) fn rows_times_tokens(
    rows: &[u8],
    row_bytes: usize,
    count: usize,
    x: &XTile,
    out: &mut [f32],
) {
    crate::simd::debug_check_wide(true);
    let dtype = x.dtype;
    assert!(
        out.len() == count * x.n
            && row_bytes >= dtype.row_bytes(x.cols).unwrap_or(usize::MAX)
            && rows.len() >= count * row_bytes
    );
    // SAFETY: the level is checked by the dispatcher; the asserts bound every row and output.
    with_tile_format!(dtype, F => unsafe { rows_with::<F>(rows.as_ptr(), row_bytes, count, x, out) })
}

/// [`rows_times_tokens`] for format `F`.
///
/// # Safety
/// As asserted by [`rows_times_tokens`]; the CPU has the AVX-512 level.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows_with<F: IntTile>(
    rows: *const u8,
    row_bytes: usize,
    count: usize,
    x: &XTile,
    out: &mut [f32],
) {
    let spans = x.cols / F::SPAN;
    let mut tile = WTile {
        w: vec![V32::default(); x.cols / 2 * G],
        d: vec![F32x16::default(); spans * G],
        mins: vec![F32x16::default(); spans * F::MINS * G],
    };
    for r0 in (0..count).step_by(TILE_ROWS) {
        let r = TILE_ROWS.min(count - r0);
        // SAFETY: rows r0..r0 + r are readable per the caller.
        unsafe { decode_tile::<F>(rows.add(r0 * row_bytes), row_bytes, r, spans, &mut tile) };
        let valid: [__mmask16; G] = std::array::from_fn(|g| {
            let k = r.saturating_sub(g * LANES).min(LANES);
            ((1u32 << k) - 1) as __mmask16
        });
        let o = out[r0..].as_mut_ptr();
        let block = if F::SPAN == XB { T_32 } else { T_K };
        let mut t0 = 0;
        while t0 < x.n {
            let tt = block.min(x.n - t0);
            let at = o.wrapping_add(t0 * count);
            // SAFETY: tokens t0..t0 + tt exist; out[(t0 + t)·count + r0 + i] is in bounds for
            // i < r, the rows the masks let through.
            unsafe {
                match tt {
                    6 => micro::<F, 6>(&tile, x, t0, at, count, valid),
                    5 => micro::<F, 5>(&tile, x, t0, at, count, valid),
                    4 => micro::<F, 4>(&tile, x, t0, at, count, valid),
                    3 => micro::<F, 3>(&tile, x, t0, at, count, valid),
                    2 => micro::<F, 2>(&tile, x, t0, at, count, valid),
                    _ => micro::<F, 1>(&tile, x, t0, at, count, valid),
                }
            }
            t0 += tt;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        if crate::simd::detect() != crate::simd::Level::Avx512 {
            return;
        }
        let m: [[i32; 16]; 16] =
            std::array::from_fn(|i| std::array::from_fn(|j| (100 * i + j) as i32));
        // SAFETY: the CPU has the AVX-512 level (checked above).
        let got = unsafe {
            let r: [__m512i; 16] =
                std::array::from_fn(|i| _mm512_loadu_si512(m[i].as_ptr().cast()));
            transpose16(&r).map(|v| std::mem::transmute::<__m512i, [i32; 16]>(v))
        };
        for (j, col) in got.iter().enumerate() {
            for (i, &v) in col.iter().enumerate() {
                assert_eq!(v, m[i][j], "out[{j}][{i}]");
            }
        }
    }

    /// Every quantized format, row counts off the tile (and under one group), token counts off
    /// the register block, several span counts: each output meets the dot bound against the
    /// f64 reference.
    #[test]
    fn tile_matches_f64_on_odd_shapes() {
        use crate::testutil::{assert_dot_close, random_weight, Rng};
        if crate::simd::detect() != crate::simd::Level::Avx512 {
            return;
        }
        let mut rng = Rng::new(77);
        for dtype in DType::ALL
            .into_iter()
            .filter(|d| d.is_quantized() && !d.is_decoded() && !d.is_lowbit())
        {
            let cols_list: &[usize] = match dtype.is_super_block() {
                true => &[256, 512, 2816],
                false => &[32, 96, 2816],
            };
            for &cols in cols_list {
                for (rows, n) in [(1, 1), (5, 2), (17, 3), (33, 5), (45, 7), (64, 17), (3, 13)] {
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let x = rng.vec(n * cols);
                    let xt = XTile::new(dtype, &x, n, cols).unwrap();
                    let mut out = vec![f32::NAN; rows * n];
                    let row_bytes = dtype.row_bytes(cols).unwrap();
                    rows_times_tokens(w.bytes(), row_bytes, rows, &xt, &mut out);
                    for (t, xt) in x.chunks_exact(cols).enumerate() {
                        for r in 0..rows {
                            let what = format!("int tile {rows}x{cols} n{n} [{t}, {r}]");
                            assert_dot_close(out[t * rows + r], dtype, w.row(r), xt, &what);
                        }
                    }
                }
            }
        }
    }

    /// Non-finite x is refused (the f32 path then propagates it).
    #[test]
    fn non_finite_x_is_refused() {
        if crate::simd::detect() != crate::simd::Level::Avx512 {
            return;
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = vec![0.5f32; 3 * 256];
            x[300] = bad;
            assert!(XTile::new(DType::Q4_K, &x, 3, 256).is_none());
            assert!(XTile::new(DType::Q8_0, &x, 3, 256).is_none());
        }
    }

    /// A token whose blocks carry outliers (its int16 rounding bound above RHO_MAX of Σ|x|)
    /// is left to the f32 tile; uniform x takes the integer tile; so does a non-finite one not.
    #[test]
    fn ill_conditioned_x_is_refused() {
        let mut x = crate::testutil::Rng::new(5).vec(512);
        for dtype in [DType::Q4_K, DType::Q6_K, DType::Q8_0] {
            assert!(token_fits(dtype, &x), "{dtype}");
        }
        let mut outliers = x.clone();
        // One value per block 300 times the rest.
        for b in 0..16 {
            outliers[32 * b + 7] = 600.0;
        }
        x[3] = f32::NAN;
        for dtype in [DType::Q4_K, DType::Q6_K, DType::Q8_0] {
            assert!(!token_fits(dtype, &outliers), "{dtype}");
            assert!(!token_fits(dtype, &x), "{dtype}");
        }
    }
}
