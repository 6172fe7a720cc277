//! Encoding f32 rows into the table formats (IQ4_NL, IQ4_XS, MXFP4; layouts in
//! [`crate::dtype`]) with ggml's reference rounding, for the layouts the engine rebuilds at load
//! (the transposed down projection) and for tests. IQ4_NL and IQ4_XS follow ggml's
//! `quantize_row_iq4_nl_impl` without an importance matrix (weights x², seven trial scales
//! either side of the first); MXFP4 follows `quantize_row_mxfp4_ref`.

use half::f16;

use crate::dequantize::{e8m0_half, IQ4NL_VALUES, MXFP4_VALUES};

/// The index of the value of `values` (sorted ascending) nearest `x`, ties to the upper one, as
/// ggml's `best_index_int8`.
fn best_index(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let mu = values.iter().position(|&v| v as f32 > x).unwrap_or(15);
    let (lo, hi) = (values[mu - 1] as f32, values[mu] as f32);
    if x - lo < hi - x {
        mu as u8 - 1
    } else {
        mu as u8
    }
}

/// Below this a block's largest |x| counts as zero (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// One 32-weight sub-block's IQ4_NL scale (least squares over the trial scales, weights x²),
/// its indices written to `idx`.
fn iq4nl_scale(x: &[f32], idx: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            (amax, max) = (v.abs(), v);
        }
    }
    if amax < GROUP_MAX_EPS {
        idx.fill(0);
        return 0.0;
    }
    let v0 = IQ4NL_VALUES[0] as f32;
    let sums = |id: f32, idx: &mut [u8]| {
        let (mut sqx, mut sq2) = (0f32, 0f32);
        for (&xj, l) in x.iter().zip(idx.iter_mut()) {
            *l = best_index(&IQ4NL_VALUES, id * xj);
            let (q, w) = (IQ4NL_VALUES[*l as usize] as f32, xj * xj);
            sqx += w * q * xj;
            sq2 += w * q * q;
        }
        (sqx, sq2)
    };
    let (sqx, sq2) = sums(1.0 / (-max / v0), idx);
    let mut d = sqx / sq2;
    let mut best = d * sqx;
    let mut trial = [0u8; 32];
    for itry in -7..=7 {
        let (sqx, sq2) = sums((itry as f32 + v0) / max, &mut trial[..x.len()]);
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    d
}

/// The indices of `x` under scale `d` (ggml's final pass with the stored scale).
fn indices(x: &[f32], d: f32, idx: &mut [u8]) {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in idx.iter_mut().zip(x) {
        *l = best_index(&IQ4NL_VALUES, id * v);
    }
}

/// Pack 32 indices per sub-block as Q4_0 nibbles (weight j low, j + 16 high).
fn pack(idx: &[u8], out: &mut [u8]) {
    for (o, l) in out.chunks_exact_mut(16).zip(idx.chunks_exact(32)) {
        for j in 0..16 {
            o[j] = l[j] | l[j + 16] << 4;
        }
    }
}

/// IQ4_NL: one 32-weight block.
pub(crate) fn iq4_nl_block(x: &[f32], out: &mut [u8]) {
    let mut idx = [0u8; 32];
    let d = iq4nl_scale(x, &mut idx);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    indices(x, d, &mut idx);
    pack(&idx, &mut out[2..18]);
}

/// IQ4_XS: one 256-weight super-block (eight IQ4_NL sub-block scales, then 6-bit ones relative
/// to d = −(the scale of largest magnitude)/32).
pub(crate) fn iq4_xs_block(x: &[f32], out: &mut [u8]) {
    let mut idx = [0u8; 256];
    let mut scales = [0f32; 8];
    let (mut amax, mut max) = (0f32, 0f32);
    for (s, sc) in scales.iter_mut().enumerate() {
        *sc = iq4nl_scale(&x[32 * s..32 * s + 32], &mut idx[32 * s..32 * s + 32]);
        if sc.abs() > amax {
            (amax, max) = (sc.abs(), *sc);
        }
    }
    let d = -max / 32.0;
    out[..8].fill(0);
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut high = 0u16;
    for (s, &sc) in scales.iter().enumerate() {
        let l = ((id * sc).round() as i32).clamp(-32, 31);
        indices(
            &x[32 * s..32 * s + 32],
            d * l as f32,
            &mut idx[32 * s..32 * s + 32],
        );
        let l = (l + 32) as u8;
        out[4 + s / 2] |= (l & 15) << (4 * (s % 2));
        high |= ((l >> 4) as u16) << (2 * s);
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
    pack(&idx, &mut out[8..136]);
}

/// MXFP4: one 32-weight block: e = ⌊log2 max|x|⌋ − 2 + 127, each weight the nearest value
/// (the first of equals).
pub(crate) fn mxfp4_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = match amax > 0.0 {
        true => (amax.log2().floor() - 2.0 + 127.0) as u8,
        false => 0,
    };
    let d = e8m0_half(e);
    out[0] = e;
    let best = |v: f32| {
        let mut best = (0u8, (MXFP4_VALUES[0] as f32 * d - v).abs());
        for (i, &k) in MXFP4_VALUES.iter().enumerate().skip(1) {
            let err = (k as f32 * d - v).abs();
            if err < best.1 {
                best = (i as u8, err);
            }
        }
        best.0
    };
    for j in 0..16 {
        out[1 + j] = best(x[j]) | best(x[j + 16]) << 4;
    }
}

#[cfg(test)]
mod tests {
    use crate::dtype::DType;
    use crate::{dequantize_row, quantize_row};

    /// Relative RMS round-trip error of `dtype` on `x`.
    fn relative_rms(dtype: DType, x: &[f32]) -> f64 {
        let mut buf = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
        quantize_row(dtype, x, &mut buf).unwrap();
        let mut back = vec![0f32; x.len()];
        dequantize_row(dtype, &buf, &mut back).unwrap();
        let err: f64 = x
            .iter()
            .zip(&back)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        let norm: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
        (err / norm).sqrt()
    }

    /// Gaussian-ish weights (a sum of four uniforms) with a few outliers.
    fn weights(n: usize) -> Vec<f32> {
        let mut s = 7u64;
        let mut u = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        (0..n)
            .map(|i| {
                let g = u() + u() + u() + u();
                if i % 97 == 0 {
                    4.0 * g
                } else {
                    g
                }
            })
            .collect()
    }

    /// The measured relative RMS errors stay below these bounds (Q4_0's beside them: IQ4_NL
    /// and IQ4_XS are the better 4-bit formats, MXFP4's power-of-two scales the coarser one).
    #[test]
    fn round_trip_error_is_bounded() {
        let x = weights(256 * 32);
        let q4 = relative_rms(DType::Q4_0, &x);
        for (dtype, bound) in [
            (DType::IQ4_NL, 0.9),
            (DType::IQ4_XS, 0.9),
            (DType::MXFP4, 1.6),
        ] {
            let e = relative_rms(dtype, &x);
            eprintln!("{dtype}: relative RMS error {e:.4} (Q4_0 {q4:.4})");
            assert!(e < bound * q4, "{dtype}: {e} >= {bound} x Q4_0's {q4}");
        }
    }

    #[test]
    fn zero_blocks_encode_to_zero() {
        for dtype in DType::TABLE {
            let n = dtype.block_size();
            let mut buf = vec![0xffu8; dtype.block_bytes()];
            quantize_row(dtype, &vec![0.0; n], &mut buf).unwrap();
            let mut back = vec![1f32; n];
            dequantize_row(dtype, &buf, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0.0), "{dtype}");
        }
    }
}
