//! AVX2 + FMA + F16C kernels over a few scattered rows at once. Row accumulation
//! y += Σ_i a_i · row_i (y is loaded and stored once per group of rows, not once per row),
//! decoding each format on the fly: F16 with `vcvtph2ps`, BF16 by a 16-bit shift, Q8_0 one
//! 32-weight block at a time (Q4_0/Q4_1 rows go to the integer kernel in `avx2_q4_axpy`, which
//! falls back to this block decoder where coefficients are not finite). Dot products of a
//! group of float-format rows with one x (every x vector feeds all rows, and the rows stream
//! from memory side by side; quantized rows use the int16-x kernel in `crate::avx2`). Each
//! call also fetches the rows its caller reads next, line by line in step with its own reads.
//! Reached only through [`super::axpy`] once AVX2/FMA/F16C have been detected.

use super::avx2_q4_axpy::q4_axpy;
use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Rows accumulated together.
pub(super) const GROUP: usize = 8;

/// `$f::<$fmt, R>(args)` for R = `$n`, a row count in 1..=GROUP (nothing for others).
macro_rules! with_rows {
    ($n:expr, $f:ident::<$fmt:ty>($($arg:expr),*)) => {
        match $n {
            8 => $f::<$fmt, 8>($($arg),*),
            7 => $f::<$fmt, 7>($($arg),*),
            6 => $f::<$fmt, 6>($($arg),*),
            5 => $f::<$fmt, 5>($($arg),*),
            4 => $f::<$fmt, 4>($($arg),*),
            3 => $f::<$fmt, 3>($($arg),*),
            2 => $f::<$fmt, 2>($($arg),*),
            1 => $f::<$fmt, 1>($($arg),*),
            _ => {}
        }
    };
}

/// y += Σ_i a[i] · row i, for the `n <= GROUP` rows `rows[..n]`, each holding `y.len()` weights
/// of `dtype` (sizes checked by the caller).
pub(super) fn axpy_group(dtype: DType, rows: &[&[u8]], next: &[&[u8]], a: &[f32], y: &mut [f32]) {
    debug_assert_eq!(crate::simd::detect(), crate::simd::Level::Avx2);
    let want = dtype.row_bytes(y.len()).unwrap_or(usize::MAX);
    assert!(rows.len() == a.len() && rows.len() <= GROUP && rows.iter().all(|r| r.len() >= want));
    let (p, q) = pointers(rows, next);
    let n = rows.len();
    // SAFETY: features detected (the dispatcher's contract, checked in debug builds); the
    // assert above keeps every row's y.len() weights readable.
    unsafe {
        match dtype {
            DType::F32 => with_rows!(n, float_axpy::<F32>(&p, &q, a, y)),
            DType::F16 => with_rows!(n, float_axpy::<F16>(&p, &q, a, y)),
            DType::BF16 => with_rows!(n, float_axpy::<Bf16>(&p, &q, a, y)),
            DType::Q8_0 => with_rows!(n, quant_axpy::<Q8_0>(&p, &q, a, y)),
            DType::Q4_0 => with_rows!(n, q4_axpy::<Q4_0>(&p, &q, a, y)),
            DType::Q4_1 => with_rows!(n, q4_axpy::<Q4_1>(&p, &q, a, y)),
        }
    }
}

/// out[i] = dot(rows[i], x) for the `n <= GROUP` float-format rows `rows[..n]`, each holding
/// `x.len()` values of `dtype` (sizes checked by the caller), fetching the `next` rows
/// alongside. Quantized rows go to the int16-x kernel instead (`crate::avx2`).
pub(super) fn dot_group(dtype: DType, rows: &[&[u8]], next: &[&[u8]], x: &[f32], out: &mut [f32]) {
    debug_assert_eq!(crate::simd::detect(), crate::simd::Level::Avx2);
    let want = dtype.row_bytes(x.len()).unwrap_or(usize::MAX);
    assert!(rows.len() == out.len() && rows.len() <= GROUP && rows.iter().all(|r| r.len() >= want));
    let (p, q) = pointers(rows, next);
    let n = rows.len();
    // SAFETY: features detected (the dispatcher's contract, checked in debug builds); the
    // assert above keeps every row's x.len() weights readable.
    unsafe {
        match dtype {
            DType::F32 => with_rows!(n, float_dot::<F32>(&p, &q, x, out)),
            DType::F16 => with_rows!(n, float_dot::<F16>(&p, &q, x, out)),
            DType::BF16 => with_rows!(n, float_dot::<Bf16>(&p, &q, x, out)),
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
                unreachable!("{dtype}: quantized rows use the int16-x kernel")
            }
        }
    }
}

/// Start addresses of the group's rows and of the rows to fetch while reading them: the next
/// group's rows, each fetched line by line in step with this group's reads, so the memory system
/// always has the following rows in flight. Slots without a next row repeat this group's own
/// rows, whose lines are cached by then.
fn pointers(rows: &[&[u8]], next: &[&[u8]]) -> ([*const u8; GROUP], [*const u8; GROUP]) {
    let mut p = [std::ptr::null::<u8>(); GROUP];
    for (pi, r) in p.iter_mut().zip(rows) {
        *pi = r.as_ptr();
    }
    let mut q = p;
    for (qi, r) in q.iter_mut().zip(next) {
        *qi = r.as_ptr();
    }
    (p, q)
}

/// Hint the cache to fetch the line at byte `off` of each of the first `R` rows in `q`.
#[inline(always)]
pub(super) fn fetch_lines<const R: usize>(q: &[*const u8; GROUP], off: usize) {
    for qi in q.iter().take(R) {
        // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is baseline
        // on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(qi.wrapping_add(off) as *const i8) };
    }
}

/// A format with one value per block.
trait Float {
    /// Bytes per value.
    const BYTES: usize;
    /// Eight values at `p` as f32.
    ///
    /// # Safety
    /// `8·BYTES` bytes readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn load8(p: *const u8) -> __m256;
    /// One value at `p`.
    ///
    /// # Safety
    /// `BYTES` bytes readable at `p`.
    unsafe fn load1(p: *const u8) -> f32;
}

struct F32;
struct F16;
struct Bf16;

impl Float for F32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 32 readable bytes per the caller; unaligned load.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 4 readable bytes per the caller.
        f32::from_le_bytes(unsafe { (p as *const [u8; 4]).read_unaligned() })
    }
}

impl Float for F16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes per the caller; unaligned load.
        _mm256_cvtph_ps(unsafe { _mm_loadu_si128(p as *const __m128i) })
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the caller.
        half::f16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
    }
}

impl Float for Bf16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes per the caller; unaligned load.
        let raw = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes per the caller.
        half::bf16::from_le_bytes(unsafe { (p as *const [u8; 2]).read_unaligned() }).to_f32()
    }
}

/// y += Σ a[i]·row i for `R` float-format rows.
///
/// # Safety
/// `y.len()` values readable at each `p[i]`, `a.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_axpy<F: Float, const R: usize>(
    p: &[*const u8; GROUP],
    q: &[*const u8; GROUP],
    a: &[f32],
    y: &mut [f32],
) {
    let n = y.len();
    let av: [__m256; R] = std::array::from_fn(|i| _mm256_set1_ps(a[i]));
    let yp = y.as_mut_ptr();
    let mut c = 0;
    while c + 16 <= n {
        if (c * F::BYTES) % 64 == 0 {
            fetch_lines::<R>(q, c * F::BYTES);
        }
        // SAFETY: c + 16 <= n: y[c..c+16] in bounds and values c..c+16 readable in every row.
        unsafe {
            let mut y0 = _mm256_loadu_ps(yp.add(c));
            let mut y1 = _mm256_loadu_ps(yp.add(c + 8));
            for i in 0..R {
                let w = p[i].add(c * F::BYTES);
                y0 = _mm256_fmadd_ps(av[i], F::load8(w), y0);
                y1 = _mm256_fmadd_ps(av[i], F::load8(w.add(8 * F::BYTES)), y1);
            }
            _mm256_storeu_ps(yp.add(c), y0);
            _mm256_storeu_ps(yp.add(c + 8), y1);
        }
        c += 16;
    }
    while c + 8 <= n {
        // SAFETY: as above for 8 values.
        unsafe {
            let mut y0 = _mm256_loadu_ps(yp.add(c));
            for i in 0..R {
                y0 = _mm256_fmadd_ps(av[i], F::load8(p[i].add(c * F::BYTES)), y0);
            }
            _mm256_storeu_ps(yp.add(c), y0);
        }
        c += 8;
    }
    for (k, yk) in y.iter_mut().enumerate().skip(c) {
        for i in 0..R {
            // SAFETY: value k < n is readable in every row.
            *yk = a[i].mul_add(unsafe { F::load1(p[i].add(k * F::BYTES)) }, *yk);
        }
    }
}

/// out[i] = dot(row i, x) for `R` float-format rows, two accumulators per row.
///
/// # Safety
/// `x.len()` values readable at each `p[i]`, `out.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_dot<F: Float, const R: usize>(
    p: &[*const u8; GROUP],
    q: &[*const u8; GROUP],
    x: &[f32],
    out: &mut [f32],
) {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let mut c = 0;
    while c + 16 <= n {
        if (c * F::BYTES) % 64 == 0 {
            fetch_lines::<R>(q, c * F::BYTES);
        }
        // SAFETY: c + 16 <= n: x[c..c+16] and values c..c+16 of every row are in bounds.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            let x1 = _mm256_loadu_ps(xp.add(c + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                let w = p[i].add(c * F::BYTES);
                a[0] = _mm256_fmadd_ps(F::load8(w), x0, a[0]);
                a[1] = _mm256_fmadd_ps(F::load8(w.add(8 * F::BYTES)), x1, a[1]);
            }
        }
        c += 16;
    }
    if c + 8 <= n {
        // SAFETY: as above for 8 values.
        unsafe {
            let x0 = _mm256_loadu_ps(xp.add(c));
            for (i, a) in acc.iter_mut().enumerate() {
                a[0] = _mm256_fmadd_ps(F::load8(p[i].add(c * F::BYTES)), x0, a[0]);
            }
        }
        c += 8;
    }
    for (i, (a, o)) in acc.iter().zip(out.iter_mut()).enumerate() {
        let mut sum = hsum(_mm256_add_ps(a[0], a[1]));
        for (k, &xk) in x.iter().enumerate().skip(c) {
            // SAFETY: value k < n of row i is readable.
            sum += unsafe { F::load1(p[i].add(k * F::BYTES)) } * xk;
        }
        *o = sum;
    }
}

/// Sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// A format of 32-weight blocks: w = d·q + offset.
pub(super) trait Quant {
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// True when blocks store a min `m` (w = d·q + m); false when m is always 0.
    const HAS_MIN: bool;
    /// The block's 32 weights as (d, m, q) with w = d·q + m: q as four 8-lane f32 vectors in
    /// weight order, d and m as scalars.
    ///
    /// # Safety
    /// `BLOCK_BYTES` readable at `p`; the CPU has AVX2/FMA/F16C.
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]);
}

struct Q8_0;
pub(super) struct Q4_0;
pub(super) struct Q4_1;

/// The two little-endian f16 at `p` and `p + 2` as f32 (one conversion).
///
/// # Safety
/// 4 bytes readable at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves(p: *const u8) -> (f32, f32) {
    // SAFETY: 4 readable bytes per the caller.
    let bits = unsafe { (p as *const u32).read_unaligned() };
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// Sixteen signed bytes as two 8-lane f32 vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8x16_to_f32(v: __m128i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(v, v))),
    ]
}

impl Quant for Q8_0 {
    const BLOCK_BYTES: usize = 34;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 34 bytes are readable per the caller.
        unsafe {
            let bits = (p as *const u16).read_unaligned();
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)));
            let lo = i8x16_to_f32(_mm_loadu_si128(p.add(2) as *const __m128i));
            let hi = i8x16_to_f32(_mm_loadu_si128(p.add(18) as *const __m128i));
            (d, 0.0, [lo[0], lo[1], hi[0], hi[1]])
        }
    }
}

impl Quant for Q4_0 {
    const BLOCK_BYTES: usize = 18;
    const HAS_MIN: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 18 bytes are readable per the caller.
        unsafe {
            let bits = (p as *const u16).read_unaligned();
            let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)));
            let raw = _mm_loadu_si128(p.add(2) as *const __m128i);
            let mask = _mm_set1_epi8(0x0F);
            let eight = _mm_set1_epi8(8);
            let lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(raw), mask), eight);
            let (l, h) = (i8x16_to_f32(lo), i8x16_to_f32(hi));
            (d, 0.0, [l[0], l[1], h[0], h[1]])
        }
    }
}

impl Quant for Q4_1 {
    const BLOCK_BYTES: usize = 20;
    const HAS_MIN: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 20 bytes are readable per the caller.
        unsafe {
            let (d, m) = halves(p);
            let raw = _mm_loadu_si128(p.add(4) as *const __m128i);
            let mask = _mm_set1_epi8(0x0F);
            // Nibbles are 0..=15, so the signed widening is exact.
            let lo = i8x16_to_f32(_mm_and_si128(raw, mask));
            let hi = i8x16_to_f32(_mm_and_si128(_mm_srli_epi16::<4>(raw), mask));
            (d, m, [lo[0], lo[1], hi[0], hi[1]])
        }
    }
}

/// y += Σ a[i]·row i for `R` quantized rows (`y.len()` a multiple of 32).
///
/// # Safety
/// `y.len() / 32` blocks readable at each `p[i]`, `a.len() >= R`; the CPU has AVX2/FMA/F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quant_axpy<Q: Quant, const R: usize>(
    p: &[*const u8; GROUP],
    q: &[*const u8; GROUP],
    a: &[f32],
    y: &mut [f32],
) {
    let yp = y.as_mut_ptr();
    for b in 0..y.len() / 32 {
        fetch_lines::<R>(q, b * Q::BLOCK_BYTES);
        // SAFETY: block b of every row is readable and y[32b..32b+32] is in bounds.
        unsafe {
            let yb = yp.add(32 * b);
            let mut acc = [0, 8, 16, 24].map(|k| _mm256_loadu_ps(yb.add(k)));
            let mut off = 0f32;
            for i in 0..R {
                let (d, m, q) = Q::block(p[i].add(b * Q::BLOCK_BYTES));
                let ad = _mm256_set1_ps(a[i] * d);
                off = a[i].mul_add(m, off);
                for (ak, qk) in acc.iter_mut().zip(q) {
                    *ak = _mm256_fmadd_ps(ad, qk, *ak);
                }
            }
            for (k, ak) in acc.into_iter().enumerate() {
                let v = match Q::HAS_MIN {
                    true => _mm256_add_ps(ak, _mm256_set1_ps(off)),
                    false => ak,
                };
                _mm256_storeu_ps(yb.add(8 * k), v);
            }
        }
    }
}
