//! The quantized formats of 32-weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) under AVX2/F16C: blocks of 32 weights, w = d·q +
//! offset, decoded to f32 vectors (dense dots, row decoding, row accumulation) or to i16 (the
//! int16-x dot of [`super::int16`]).

use std::arch::x86_64::*;

/// What a quantized format adds to d·q for each weight.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Offset {
    /// w = d·q (Q8_0).
    None,
    /// w = d·(q − 8) (Q4_0).
    MinusEight,
    /// w = d·q + m with a stored per-block min `m` (Q4_1).
    Min,
}

/// A format of 32-weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
pub(super) trait QuantFormat {
    /// Bytes per block.
    const BLOCK_BYTES: usize;
    /// How the offset is stored.
    const OFFSET: Offset;
    /// Byte offset of the quants in a block. For the 4-bit formats: 16 bytes of nibbles, byte j
    /// holding weight j in its low nibble and weight j + 16 in its high nibble.
    const QS: usize;

    /// The block's 32 raw quants as f32, in weight order (8 per vector). The default decodes
    /// the 4-bit formats' nibbles.
    ///
    /// # Safety
    /// `p..p + BLOCK_BYTES` must be readable (any alignment); the CPU must have AVX2/FMA/F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> [__m256; 4] {
        // SAFETY: the nibbles are bytes QS..QS + 16 of the readable block.
        unsafe { nibbles(p.add(Self::QS)) }
    }

    /// The block's 32 raw quants as i16: weights 0..16, then 16..32. Widened by zero/sign-
    /// extending *loads*: the register forms of `vpmov{z,s}xbw` cross lanes and issue about once
    /// per 1.25 cycles on Zen 3, the load forms cost little more than the load. The default
    /// decodes the 4-bit formats' nibbles.
    ///
    /// # Safety
    /// As for [`QuantFormat::quants`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants16(p: *const u8) -> [__m256i; 2] {
        // SAFETY: the nibbles are bytes QS..QS + 16 of the readable block.
        unsafe { nibbles16(p.add(Self::QS)) }
    }

    /// The block's 32 weights as (d, m, q) with w = d·q + m: q as four 8-lane f32 vectors in
    /// weight order (Q4_0's −8 already subtracted), d and m as scalars (the row accumulation's
    /// decoder).
    ///
    /// # Safety
    /// As for [`QuantFormat::quants`].
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]);

    /// The block's scale `d`, in every lane.
    ///
    /// # Safety
    /// As for [`QuantFormat::quants`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scale(p: *const u8) -> __m256 {
        // SAFETY: the block starts with its f16 scale, readable per the caller.
        unsafe { half_at(p) }
    }

    /// The scales `d` of `n <= 8` consecutive blocks starting at `p`, one per lane (lanes `n..`
    /// are zero).
    ///
    /// # Safety
    /// The `n` blocks at `p` must be readable (`n >= 1`); the CPU must have AVX2/FMA/F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales8(p: *const u8, n: usize) -> __m256 {
        // SAFETY: each block starts with its f16 scale, so p .. p + (n − 1)·BLOCK_BYTES + 2 lies
        // inside the readable blocks.
        unsafe { halves8(p, Self::BLOCK_BYTES, n) }
    }

    /// The stored mins `m` of `n <= 8` consecutive blocks, as [`QuantFormat::scales8`] (only
    /// called when OFFSET is Min).
    ///
    /// # Safety
    /// As for [`QuantFormat::scales8`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mins8(p: *const u8, n: usize) -> __m256 {
        // SAFETY: Q4_1 stores m as the f16 after d: p + 2 .. p + (n − 1)·BLOCK_BYTES + 4 lies
        // inside the readable blocks.
        unsafe { halves8(p.add(2), Self::BLOCK_BYTES, n) }
    }

    /// The block's stored min `m` in every lane (only called when OFFSET is Min).
    ///
    /// # Safety
    /// As for [`QuantFormat::quants`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn min(p: *const u8) -> __m256 {
        // SAFETY: Q4_1 stores m as the f16 after d, inside the readable block.
        unsafe { half_at(p.add(2)) }
    }
}

/// The little-endian f16 at `p`, converted and broadcast to all eight lanes.
///
/// # Safety
/// Two bytes at `p` must be readable; the CPU must have AVX2 and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn half_at(p: *const u8) -> __m256 {
    // SAFETY: two readable bytes per the caller; read_unaligned takes any alignment.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    // Convert in an xmm (one uop) and broadcast, rather than converting a whole ymm.
    _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The f16s at `p + k·stride` for `k < n <= 8`, converted to f32 in lanes `0..n` (zeros above).
/// A whole chunk (`n == 8`) is gathered with eight loads and seven word blends into one xmm, so
/// eight conversions cost one `vcvtph2ps`; shorter tails use scalar loads.
///
/// # Safety
/// `p .. p + (n − 1)·stride + 2` must be readable and `stride >= 2`; the CPU must have AVX2
/// and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn halves8(p: *const u8, stride: usize, n: usize) -> __m256 {
    if n == 8 {
        // Load k starts at p + k·(stride − 2), putting half k in word k; it ends at
        // p + k·stride + 16 − 2k <= p + 7·stride + 2 for k <= 7 and stride >= 2.
        // SAFETY: so every load lies inside the readable range of the caller.
        let at = |k: usize| unsafe { _mm_loadu_si128(p.add(k * (stride - 2)) as *const __m128i) };
        let mut v = at(0);
        v = _mm_blend_epi16::<0b0000_0010>(v, at(1));
        v = _mm_blend_epi16::<0b0000_0100>(v, at(2));
        v = _mm_blend_epi16::<0b0000_1000>(v, at(3));
        v = _mm_blend_epi16::<0b0001_0000>(v, at(4));
        v = _mm_blend_epi16::<0b0010_0000>(v, at(5));
        v = _mm_blend_epi16::<0b0100_0000>(v, at(6));
        v = _mm_blend_epi16::<0b1000_0000>(v, at(7));
        return _mm256_cvtph_ps(v);
    }
    // SAFETY: only k < n is read, two bytes each, inside the caller's readable range.
    let h = |k: usize| match k < n {
        true => u64::from(unsafe { (p.add(k * stride) as *const u16).read_unaligned() }),
        false => 0,
    };
    let lo = h(0) | h(1) << 16 | h(2) << 32 | h(3) << 48;
    let hi = h(4) | h(5) << 16 | h(6) << 32 | h(7) << 48;
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Q8_0: f16 d, 32 × i8.
pub(super) struct Q8_0;
/// Q4_0: f16 d, 16 bytes of nibbles, w = d·(q − 8).
pub(super) struct Q4_0;
/// Q4_1: f16 d, f16 m, 16 bytes of nibbles, w = d·q + m.
pub(super) struct Q4_1;

impl QuantFormat for Q8_0 {
    const BLOCK_BYTES: usize = 34;
    const OFFSET: Offset = Offset::None;
    const QS: usize = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants(p: *const u8) -> [__m256; 4] {
        let q = p.wrapping_add(2);
        // SAFETY: bytes 2..34 of the block are readable per the caller; 8-byte unaligned loads.
        let bytes = |i: usize| unsafe { _mm_loadl_epi64(q.add(8 * i) as *const __m128i) };
        let f = |i: usize| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes(i)));
        [f(0), f(1), f(2), f(3)]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn quants16(p: *const u8) -> [__m256i; 2] {
        // SAFETY: bytes 2..34 of the block are readable per the caller; unaligned loads, which
        // LLVM folds into the sign-extending moves.
        let half = |i: usize| unsafe { _mm_loadu_si128(p.add(2 + 16 * i) as *const __m128i) };
        [_mm256_cvtepi8_epi16(half(0)), _mm256_cvtepi8_epi16(half(1))]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 34 bytes are readable per the caller.
        unsafe {
            let d = half(p);
            let lo = i8x16_to_f32(_mm_loadu_si128(p.add(2) as *const __m128i));
            let hi = i8x16_to_f32(_mm_loadu_si128(p.add(18) as *const __m128i));
            (d, 0.0, [lo[0], lo[1], hi[0], hi[1]])
        }
    }
}

/// The 32 nibbles of a Q4 block at `q` (16 bytes): low nibbles are weights 0..16, high nibbles
/// weights 16..32.
///
/// # Safety
/// 16 bytes at `q` must be readable; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(q: *const u8) -> [__m256; 4] {
    // SAFETY: 16 readable bytes per the caller, read as two unaligned 8-byte loads.
    let (a, b) = unsafe {
        (
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(q as *const __m128i)),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8) as *const __m128i)),
        )
    };
    let low = _mm256_set1_epi32(0x0F);
    [
        _mm256_cvtepi32_ps(_mm256_and_si256(a, low)),
        _mm256_cvtepi32_ps(_mm256_and_si256(b, low)),
        _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(a)),
        _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(b)),
    ]
}

/// The 32 nibbles of a Q4 block at `q` (16 bytes) as i16: low nibbles (weights 0..16), then
/// high nibbles (weights 16..32). One zero-extending load; the high nibble of a zero-extended
/// byte needs no mask.
///
/// # Safety
/// 16 bytes at `q` must be readable; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles16(q: *const u8) -> [__m256i; 2] {
    let words: __m256i;
    // SAFETY: 16 readable bytes per the caller; the asm only loads. It is asm because LLVM
    // rewrites the intrinsic form into masks on the bytes plus two register-form zero-extensions,
    // which are the slow kind (see `QuantFormat::quants16`).
    unsafe {
        std::arch::asm!("vpmovzxbw {w}, xmmword ptr [{q}]", w = out(ymm_reg) words, q = in(reg) q,
            options(pure, readonly, nostack, preserves_flags));
    }
    [
        _mm256_and_si256(words, _mm256_set1_epi16(0x0F)),
        _mm256_srli_epi16::<4>(words),
    ]
}

impl QuantFormat for Q4_0 {
    const BLOCK_BYTES: usize = 18;
    const OFFSET: Offset = Offset::MinusEight;
    const QS: usize = 2;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 18 bytes are readable per the caller: d, then the nibbles.
        unsafe { (half(p), 0.0, nibbles_i8::<8>(p.add(2))) }
    }
}

impl QuantFormat for Q4_1 {
    const BLOCK_BYTES: usize = 20;
    const OFFSET: Offset = Offset::Min;
    const QS: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
        // SAFETY: the block's 20 bytes are readable per the caller: d and m, then the nibbles.
        unsafe {
            let (d, m) = halves(p);
            (d, m, nibbles_i8::<0>(p.add(4)))
        }
    }
}

/// Q5_0: f16 d, u32 qh, 16 bytes of nibbles, w = d·(q − 16) (the −16 applied in the quants).
pub(super) struct Q5_0;
/// Q5_1: f16 d, f16 m, u32 qh, 16 bytes of nibbles, w = d·q + m.
pub(super) struct Q5_1;

/// The 32 five-bit quants of a Q5 block (u32 `qh` at `p`, the 16 nibble bytes after it) minus
/// `BIAS`, as i16: weights 0..16, then 16..32. Bit j of qh is bit 4 of weight j.
///
/// # Safety
/// 20 bytes readable at `p`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn five_bits16<const BIAS: i16>(p: *const u8) -> [__m256i; 2] {
    // SAFETY: 20 readable bytes per the caller: qh, then the nibbles.
    let (qh, [lo, hi]) = unsafe { ((p as *const u32).read_unaligned(), nibbles16(p.add(4))) };
    let lanes = _mm256_setr_epi16(
        1,
        2,
        4,
        8,
        16,
        32,
        64,
        128,
        256,
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        i16::MIN,
    );
    let fifth = |bits: u32| {
        let set = _mm256_and_si256(_mm256_set1_epi16(bits as u16 as i16), lanes);
        _mm256_and_si256(_mm256_cmpeq_epi16(set, lanes), _mm256_set1_epi16(16))
    };
    let bias = _mm256_set1_epi16(BIAS);
    [
        _mm256_sub_epi16(_mm256_or_si256(lo, fifth(qh & 0xffff)), bias),
        _mm256_sub_epi16(_mm256_or_si256(hi, fifth(qh >> 16)), bias),
    ]
}

/// Sixteen i16 lanes as two 8-lane f32 vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i16x16_to_f32(v: __m256i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v))),
        _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(v))),
    ]
}

/// [`QuantFormat`] for the Q5 formats: qh at `$qh`, minus `$bias`.
macro_rules! impl_q5 {
    ($t:ty, $bytes:expr, $offset:expr, $qh:expr, $bias:expr) => {
        impl QuantFormat for $t {
            const BLOCK_BYTES: usize = $bytes;
            const OFFSET: Offset = $offset;
            const QS: usize = $qh + 4;

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn quants16(p: *const u8) -> [__m256i; 2] {
                // SAFETY: qh and the nibbles are bytes $qh..BLOCK_BYTES of the readable block.
                unsafe { five_bits16::<$bias>(p.add($qh)) }
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn quants(p: *const u8) -> [__m256; 4] {
                // SAFETY: forwarded from the caller.
                let [lo, hi] = unsafe { Self::quants16(p) };
                let (a, b) = (i16x16_to_f32(lo), i16x16_to_f32(hi));
                [a[0], a[1], b[0], b[1]]
            }

            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn block(p: *const u8) -> (f32, f32, [__m256; 4]) {
                // SAFETY: the block is readable per the caller; m follows d where OFFSET is Min.
                unsafe {
                    let m = if $offset == Offset::Min {
                        half(p.add(2))
                    } else {
                        0.0
                    };
                    (half(p), m, Self::quants(p))
                }
            }
        }
    };
}
impl_q5!(Q5_0, 22, Offset::None, 2, 16);
impl_q5!(Q5_1, 24, Offset::Min, 4, 0);

/// The 32 nibbles q of a Q4 block at `q` (16 bytes) minus `BIAS`, as four 8-lane f32 vectors in
/// weight order, subtracted and widened in bytes (q − BIAS fits an i8 for BIAS in 0..=8, so the
/// signed widening is exact).
///
/// # Safety
/// 16 bytes at `q` must be readable; the CPU must have AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_i8<const BIAS: i8>(q: *const u8) -> [__m256; 4] {
    // SAFETY: 16 readable bytes per the caller; unaligned load.
    let raw = unsafe { _mm_loadu_si128(q as *const __m128i) };
    let mask = _mm_set1_epi8(0x0F);
    let bias = _mm_set1_epi8(BIAS);
    let lo = i8x16_to_f32(_mm_sub_epi8(_mm_and_si128(raw, mask), bias));
    let hi = i8x16_to_f32(_mm_sub_epi8(
        _mm_and_si128(_mm_srli_epi16::<4>(raw), mask),
        bias,
    ));
    [lo[0], lo[1], hi[0], hi[1]]
}

/// The little-endian f16 at `p` as f32.
///
/// # Safety
/// 2 bytes readable at `p`; the CPU has F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes per the caller.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

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
