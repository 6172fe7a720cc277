//! Encoding f32 into the K-quants (256-weight super-blocks, see [`crate::dtype`]).
//!
//! A plain min/max search, not ggml's iterative `make_qkx2_quants`: each sub-block takes the
//! scale (and min, clamped to <= 0 as ggml does) that spans its values; the sub-block scales
//! are then quantized against the super-block's largest (6, 8 or 4 bits), and every weight is
//! rounded with the scale actually stored. The bytes are valid ggml blocks; the rounding error
//! is a little larger than llama.cpp's (measured in the tests below and in the note of the
//! K-quant issue).

use half::f16;

/// Round `v` to the nearest integer in `lo..=hi` (0 for NaN from a zero scale).
#[inline]
fn q(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// f32 through its f16 encoding, as the decoder will see it.
#[inline]
fn f16_round(v: f32) -> (f32, [u8; 2]) {
    let h = f16::from_f32(v);
    (h.to_f32(), h.to_le_bytes())
}

/// 1 / v, or 0 for v == 0.
#[inline]
fn inv(v: f32) -> f32 {
    if v != 0.0 {
        1.0 / v
    } else {
        0.0
    }
}

/// The value of largest magnitude in `x` (signed; 0 for all zeros).
fn signed_max(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// (max(x), −min(min(x), 0)): the span of an affine sub-block with a non-positive offset.
fn span(x: &[f32]) -> (f32, f32) {
    let (lo, hi) = x.iter().fold((0.0f32, f32::NEG_INFINITY), |(a, b), &v| {
        (a.min(v), b.max(v))
    });
    (hi, -lo)
}

/// An affine super-block's parts: w = d·sc·q − dmin·mn per sub-block.
struct Affine {
    /// f16 bytes of d.
    d: [u8; 2],
    /// f16 bytes of dmin.
    dmin: [u8; 2],
    /// Per sub-block integer scale.
    sc: Vec<u8>,
    /// Per sub-block integer min.
    mn: Vec<u8>,
    /// Per weight, 0..=nmax.
    q: Vec<u8>,
}

/// Affine sub-blocks (Q2_K, Q4_K, Q5_K): per sub-block of `len` weights, the 6- or 4-bit scale
/// and min (`bits`) against super-block `d`, `dmin`, and quants in 0..=`nmax`.
fn affine(x: &[f32], len: usize, nmax: i32, bits: u32) -> Affine {
    let top = (1i32 << bits) - 1;
    let spans: Vec<(f32, f32)> = x.chunks_exact(len).map(span).collect();
    let scale: Vec<f32> = spans
        .iter()
        .map(|&(hi, mn)| (hi + mn) / nmax as f32)
        .collect();
    let max_scale = scale.iter().fold(0.0f32, |a, &b| a.max(b));
    let max_min = spans.iter().fold(0.0f32, |a, &(_, m)| a.max(m));
    let (d, d_bytes) = f16_round(max_scale / top as f32);
    let (dmin, dmin_bytes) = f16_round(max_min / top as f32);
    let sc: Vec<u8> = scale.iter().map(|&s| q(s * inv(d), 0, top) as u8).collect();
    let mn: Vec<u8> = spans
        .iter()
        .map(|&(_, m)| q(m * inv(dmin), 0, top) as u8)
        .collect();
    let mut quants = vec![0u8; x.len()];
    for (s, (xs, qs)) in x
        .chunks_exact(len)
        .zip(quants.chunks_exact_mut(len))
        .enumerate()
    {
        let (dl, ml) = (d * sc[s] as f32, dmin * mn[s] as f32);
        let idl = inv(dl);
        for (o, &v) in qs.iter_mut().zip(xs) {
            *o = q((v + ml) * idl, 0, nmax) as u8;
        }
    }
    Affine {
        d: d_bytes,
        dmin: dmin_bytes,
        sc,
        mn,
        q: quants,
    }
}

/// Symmetric sub-blocks (Q3_K, Q6_K): per sub-block of 16 weights a signed scale with
/// w = d·sc·q, q in −`half`..`half` − 1, sc in −`sc_half`..`sc_half` − 1. Returns (d bytes,
/// scales, quants offset by +`half`).
fn symmetric(x: &[f32], half: i32, sc_half: i32) -> ([u8; 2], Vec<i32>, Vec<u8>) {
    let scale: Vec<f32> = x
        .chunks_exact(16)
        .map(|xs| signed_max(xs) / -(half as f32))
        .collect();
    let max_scale = signed_max(&scale);
    let iscale = -(sc_half as f32) * inv(max_scale);
    let (d, d_bytes) = f16_round(inv(iscale));
    let sc: Vec<i32> = scale
        .iter()
        .map(|&s| q(s * iscale, -sc_half, sc_half - 1))
        .collect();
    let mut quants = vec![0u8; x.len()];
    for (s, (xs, qs)) in x
        .chunks_exact(16)
        .zip(quants.chunks_exact_mut(16))
        .enumerate()
    {
        let idl = inv(d * sc[s] as f32);
        for (o, &v) in qs.iter_mut().zip(xs) {
            *o = (q(v * idl, -half, half - 1) + half) as u8;
        }
    }
    (d_bytes, sc, quants)
}

/// Q2_K: 16 × 16 weights, 4-bit scales and mins, 2-bit quants.
pub(crate) fn q2_k_block(x: &[f32], out: &mut [u8]) {
    let Affine {
        d,
        dmin,
        sc,
        mn,
        q: qs,
    } = affine(x, 16, 3, 4);
    out.fill(0);
    for s in 0..16 {
        out[s] = sc[s] | (mn[s] << 4);
    }
    for (i, &v) in qs.iter().enumerate() {
        let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
        out[16 + 32 * n + l] |= v << (2 * j);
    }
    out[80..82].copy_from_slice(&d);
    out[82..84].copy_from_slice(&dmin);
}

/// Q3_K: 16 × 16 weights, 6-bit signed scales, 3-bit signed quants.
pub(crate) fn q3_k_block(x: &[f32], out: &mut [u8]) {
    let (d, sc, qs) = symmetric(x, 4, 32);
    out.fill(0);
    for (i, &v) in qs.iter().enumerate() {
        let (n, j, l) = (i / 128, i % 128 / 32, i % 32);
        out[32 + 32 * n + l] |= (v & 3) << (2 * j);
        out[l] |= (v >> 2) << (4 * n + j);
    }
    let scales = &mut out[96..108];
    for (s, &v) in sc.iter().enumerate() {
        let v = (v + 32) as u8;
        if s < 8 {
            scales[s] |= v & 15;
        } else {
            scales[s - 8] |= (v & 15) << 4;
        }
        scales[8 + s % 4] |= (v >> 4) << (2 * (s / 4));
    }
    out[108..110].copy_from_slice(&d);
}

/// Q4_K (`five` false) and Q5_K: 8 × 32 weights, 6-bit scales and mins, 4- or 5-bit quants.
pub(crate) fn q45_k_block(x: &[f32], out: &mut [u8], five: bool) {
    let nmax = if five { 31 } else { 15 };
    let Affine {
        d,
        dmin,
        sc,
        mn,
        q: qs,
    } = affine(x, 32, nmax, 6);
    out.fill(0);
    out[0..2].copy_from_slice(&d);
    out[2..4].copy_from_slice(&dmin);
    let sm = &mut out[4..16];
    for s in 0..8 {
        if s < 4 {
            sm[s] |= sc[s];
            sm[s + 4] |= mn[s];
        } else {
            sm[s + 4] = (sc[s] & 15) | ((mn[s] & 15) << 4);
            sm[s - 4] |= (sc[s] >> 4) << 6;
            sm[s] |= (mn[s] >> 4) << 6;
        }
    }
    let at = if five { 48 } else { 16 };
    for (i, &v) in qs.iter().enumerate() {
        let (c, h, l) = (i / 64, i % 64 / 32, i % 32);
        out[at + 32 * c + l] |= (v & 15) << (4 * h);
        if five {
            out[16 + l] |= (v >> 4) << (i / 32);
        }
    }
}

/// Q6_K: 16 × 16 weights, 8-bit signed scales, 6-bit signed quants.
pub(crate) fn q6_k_block(x: &[f32], out: &mut [u8]) {
    let (d, sc, qs) = symmetric(x, 32, 128);
    out.fill(0);
    for (i, &v) in qs.iter().enumerate() {
        let (n, k, l) = (i / 128, i % 128 / 32, i % 32);
        out[64 * n + 32 * (k % 2) + l] |= (v & 15) << (4 * (k / 2));
        out[128 + 32 * n + l] |= (v >> 4) << (2 * k);
    }
    for (s, &v) in sc.iter().enumerate() {
        out[192 + s] = v as i8 as u8;
    }
    out[208..210].copy_from_slice(&d);
}

#[cfg(test)]
mod tests {
    use crate::dequantize::dequantize_row;
    use crate::testing::pseudo_random;
    use crate::{quantize_row, DType};

    /// Roughly Gaussian weights (sum of four uniforms) with a few outliers and a varying
    /// magnitude per 64 weights, like real weight rows.
    fn weights(n: usize, seed: u64) -> Vec<f32> {
        let u = pseudo_random(4 * n, seed);
        (0..n)
            .map(|i| {
                let g: f32 = u[4 * i..4 * i + 4].iter().sum::<f32>() * 0.866;
                let scale = 0.02 * (1.0 + (i / 64 % 5) as f32);
                let outlier = if i % 97 == 5 { 4.0 } else { 1.0 };
                g * scale * outlier
            })
            .collect()
    }

    /// RMS of the round-trip error over RMS of the values.
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

    /// The measured relative RMS errors (seed 3, 64 super-blocks) stay below these bounds; the
    /// legacy formats of the same bits beside them for scale.
    #[test]
    fn round_trip_error_is_bounded() {
        let x = weights(256 * 64, 3);
        let bounds = [
            (DType::Q2_K, 0.40),
            (DType::Q3_K, 0.20),
            (DType::Q4_K, 0.10),
            (DType::Q5_K, 0.05),
            (DType::Q6_K, 0.025),
            (DType::Q4_0, 0.12),
            (DType::Q5_0, 0.06),
            (DType::Q5_1, 0.05),
            (DType::Q8_0, 0.01),
        ];
        for (dtype, bound) in bounds {
            let e = relative_rms(dtype, &x);
            eprintln!("{dtype}: relative RMS error {e:.4}");
            assert!(e < bound, "{dtype}: {e} >= {bound}");
        }
    }

    #[test]
    fn zero_and_constant_blocks() {
        for dtype in DType::K_QUANTS {
            for v in [0.0f32, 0.5, -3.0] {
                let x = vec![v; 256];
                let e = if v == 0.0 {
                    let mut buf = vec![0xffu8; dtype.block_bytes()];
                    quantize_row(dtype, &x, &mut buf).unwrap();
                    let mut back = vec![1f32; 256];
                    dequantize_row(dtype, &buf, &mut back).unwrap();
                    assert!(back.iter().all(|&b| b == 0.0), "{dtype}");
                    0.0
                } else {
                    relative_rms(dtype, &x)
                };
                assert!(e < 0.02, "{dtype} constant {v}: {e}");
            }
        }
    }
}
