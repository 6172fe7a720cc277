//! Test helpers: a seeded generator of random weights in every format, and the error bound all
//! fast paths must meet against the f64 reference.

pub(crate) mod sparse;

use half::{bf16, f16};
use powerinfer_core::{Buffer, DType, Error, Result, Weight};

/// Allowed |error| of a dot product, relative to Σ|w·x| of that row.
pub(crate) const DOT_REL_TOL: f64 = 1e-4;
/// Allowed absolute |error| of a dot product on top of the relative part.
pub(crate) const DOT_ABS_TOL: f64 = 1e-6;

/// A small seeded generator (splitmix64), so tests need no extra dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-2.0, 2.0)).collect()
    }
}

/// The bytes of one random row of `cols` weights in `dtype` (scales of both signs).
pub(crate) fn random_row(rng: &mut Rng, dtype: DType, cols: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(dtype.row_bytes(cols).unwrap());
    let half = |v: f32| f16::from_f32(v).to_le_bytes();
    for _ in 0..cols / dtype.block_size() {
        match dtype {
            DType::F32 => out.extend(rng.uniform(-1.0, 1.0).to_le_bytes()),
            DType::F16 => out.extend(half(rng.uniform(-1.0, 1.0))),
            DType::BF16 => out.extend(bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes()),
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
                out.extend(half(rng.uniform(-0.1, 0.1)));
                if dtype == DType::Q4_1 {
                    out.extend(half(rng.uniform(-1.0, 1.0)));
                }
                let n = if dtype == DType::Q8_0 { 32 } else { 16 };
                out.extend((0..n).map(|_| rng.next_u64() as u8));
            }
            _ => {
                // Random bytes, then finite f16 scales: the first field is d, the second
                // (a min or dmin) larger for the legacy formats, whose min is a weight value.
                let at = out.len();
                out.extend((0..dtype.block_bytes()).map(|_| rng.next_u64() as u8));
                let (d, m) = match dtype.is_super_block() {
                    true => (0.002, 0.004),
                    false => (0.1, 1.0),
                };
                for (k, &f) in dtype.f16_fields().iter().enumerate() {
                    let r = if k == 0 { d } else { m };
                    out[at + f..at + f + 2].copy_from_slice(&half(rng.uniform(-r, r)));
                }
                if dtype == DType::IQ1_M {
                    // IQ1_M's f16 d lies in the top nibbles of its four scale words.
                    let d = f16::from_f32(rng.uniform(-0.002, 0.002)).to_bits();
                    for i in 0..4 {
                        let w = at + 48 + 2 * i + 1;
                        out[w] = (out[w] & 0x0f) | (((d >> (4 * i)) & 15) as u8) << 4;
                    }
                }
                if dtype == DType::MXFP4 {
                    // An E8M0 exponent of a weight's range, the blocks' scales within a factor
                    // of 8 as a tensor's are (2^−6 .. 2^−3): with 2^−9 .. 2^−2 the int16 x's
                    // rounding of a 100x outlier passes the f32-x bound by 4% (int8 x: exact).
                    out[at] = 122 + (rng.next_u64() % 4) as u8;
                }
                if dtype == DType::NVFP4 {
                    // UE4M3 scales of exponents 4..7 (2^−4 .. 2^−1 once halved), within a
                    // factor of 16 as a tensor's are.
                    for t in 0..4 {
                        out[at + t] = 0x20 + (rng.next_u64() % 24) as u8;
                    }
                }
            }
        }
    }
    out
}

/// A random `rows` × `cols` weight in `dtype`.
pub(crate) fn random_weight(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Weight {
    let bytes: Vec<u8> = (0..rows)
        .flat_map(|_| random_row(rng, dtype, cols))
        .collect();
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}

/// Panic unless `got` is within the dot-product bound of the f64 reference for this row.
pub(crate) fn assert_dot_close(got: f32, dtype: DType, row: &[u8], x: &[f32], what: &str) {
    let want = crate::reference::dot_row_f64(dtype, row, x);
    let scale = crate::reference::abs_dot_row(dtype, row, x);
    let err = (got as f64 - want).abs();
    let tol = DOT_REL_TOL * scale + DOT_ABS_TOL;
    assert!(
        err <= tol,
        "{what} {dtype} cols {}: got {got}, want {want}, err {err:e} > tol {tol:e}",
        x.len()
    );
}

/// The int8 x̂ a product of `dtype` rows with `x` computes with on `level`, where it takes a
/// quantized x of int8: per 256 for the formats that take that one (`kernels::avx2::takes_x8k`,
/// x finite and whole 256-blocks), else per 32 under the int8 numerics or for an
/// `int8_always` format (the low-bit and fused IQ3/IQ1 ones; quantized rows on the x86
/// levels, x finite and whole 32-blocks); `None` otherwise.
pub(crate) fn x8_seen(level: crate::simd::Level, dtype: DType, x: &[f32]) -> Option<Vec<f32>> {
    if !level.is_x86_simd() || !dtype.is_quantized() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::avx2::takes_x8k(dtype) {
        if let Some(hat) = crate::reference::x8k::x8k_hat(x) {
            return Some(hat);
        }
    }
    let int8 = crate::numerics::numerics() == crate::numerics::Numerics::Int8;
    (int8 || crate::numerics::int8_always(dtype))
        .then(|| crate::reference::x8::x8_hat(x))
        .flatten()
}

/// Allowed |error| of an int8-x dot against the float64 dot of the same weights and the same
/// x̂, relative to Σ|w·x̂|: the f32 roundings of its accumulation alone (a unit roundoff per
/// 32-block in a lane, a few more for the scales and the final sum).
pub(crate) fn x8_tol(cols: usize) -> f64 {
    f64::from(f32::EPSILON) * (cols / 32 + 16) as f64
}

/// The x a product of `dtype` rows computes with on `level`: x̂ where it takes an int8-x
/// kernel ([`x8_seen`]), else x itself.
pub(crate) fn x_seen(level: crate::simd::Level, dtype: DType, x: &[f32]) -> Vec<f32> {
    x8_seen(level, dtype, x).unwrap_or_else(|| x.to_vec())
}

/// Panic unless `got`, a dot of `row` with `x` computed on `level`, is right: within the f32
/// roundings of the float64 dot with x̂ where the level takes an int8-x kernel (exact on the
/// same quantized x), else within the f32-x bound of [`assert_dot_close`].
pub(crate) fn assert_dot_seen(
    got: f32,
    level: crate::simd::Level,
    dtype: DType,
    row: &[u8],
    x: &[f32],
    what: &str,
) {
    let Some(hat) = x8_seen(level, dtype, x) else {
        return assert_dot_close(got, dtype, row, x, what);
    };
    let want = crate::reference::dot_row_f64(dtype, row, &hat);
    let scale = crate::reference::abs_dot_row(dtype, row, &hat);
    let err = (got as f64 - want).abs();
    let tol = x8_tol(x.len()) * scale + 1e-30;
    assert!(
        err <= tol,
        "{what} {dtype} cols {} (int8 x): got {got}, want {want}, err {err:e} > tol {tol:e}",
        x.len()
    );
}

/// How far the int8 x can move a dot of `row` on `level`: Σ|w|·|x − x̂| where the level takes
/// an int8-x kernel, else 0 (a bound, not an estimate).
pub(crate) fn x8_gap(level: crate::simd::Level, dtype: DType, row: &[u8], x: &[f32]) -> f64 {
    let Some(hat) = x8_seen(level, dtype, x) else {
        return 0.0;
    };
    let mut w = vec![0f32; x.len()];
    crate::reference::dequantize_row(dtype, row, &mut w).unwrap();
    w.iter()
        .zip(x.iter().zip(&hat))
        .map(|(&wi, (&a, &b))| (wi as f64).abs() * (a as f64 - b as f64).abs())
        .sum()
}

/// Column counts valid for `dtype` that exercise tails: odd ones for the float formats.
pub(crate) fn test_cols(dtype: DType) -> &'static [usize] {
    if dtype.is_super_block() {
        &[256, 512, 256 * 3, 256 * 9, 4096]
    } else if dtype.is_lowbit() {
        // Whole blocks of 64 and 128: odd counts of them, and partial chunks of eight 32s.
        &[128, 384, 640, 128 * 37, 4096]
    } else if dtype.is_quantized() {
        &[32, 64, 96, 32 * 37, 4096]
    } else {
        &[1, 7, 8, 15, 17, 33, 129, 1001, 4096]
    }
}

/// A column count of whole blocks for `dtype`: `cols` (a multiple of 32) as is, or eight times
/// it for the K-quants (so the same number of 256-weight super-blocks as of 32-weight blocks),
/// or four times it for the low-bit formats (whole blocks of 64 and 128).
pub(crate) fn qcols(dtype: DType, cols: usize) -> usize {
    if dtype.is_super_block() {
        8 * cols
    } else if dtype.is_lowbit() {
        4 * cols
    } else {
        cols
    }
}

/// Whether `r` is an `Error::Shape` (size mismatches must be errors, not panics).
pub(crate) fn is_shape(r: Result<()>) -> bool {
    matches!(r, Err(Error::Shape(_)))
}

/// A rayon pool of `threads` threads.
pub(crate) fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// `f(rng, dtype, cols, row)` for every dtype and each of its [`test_cols`], `row` a random row
/// of `cols` weights, on a generator seeded with `seed`.
pub(crate) fn each_row(seed: u64, mut f: impl FnMut(&mut Rng, DType, usize, Vec<u8>)) {
    let mut rng = Rng::new(seed);
    for dtype in DType::ALL {
        for &cols in test_cols(dtype) {
            let row = random_row(&mut rng, dtype, cols);
            f(&mut rng, dtype, cols, row);
        }
    }
}
