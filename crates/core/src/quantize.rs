//! Encoding f32 rows into the block formats (the ggml reference rounding), for the layouts the
//! engine builds once at load (the transposed down projection of the sparse FFN) and for the
//! synthetic model writers. The K-quants' encoders live in [`crate::quantize_k`], the table
//! formats' in [`crate::quantize_table`], the ternary ones' in [`crate::quantize_ternary`], the
//! low-bit ones' in [`crate::quantize_lowbit`].

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::Result;
use crate::quantize_k::{q2_k_block, q3_k_block, q45_k_block, q6_k_block};
use crate::quantize_lowbit::{nvfp4_block, q1_0_block, q2_0_block};
use crate::quantize_table::{iq4_nl_block, iq4_xs_block, mxfp4_block};
use crate::quantize_ternary::{tq1_0_block, tq2_0_block};

/// Encode `src` (one row) as `dtype` into `dst` (exactly `dtype.row_bytes(src.len())` bytes);
/// `Error::Unsupported` for the lattice i-quants, which we read but do not write
/// ([`DType::has_encoder`]).
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    dtype.check_row(src.len(), dst.len())?;
    match dtype {
        DType::F32 => put_each(src, dst, |v| v.to_le_bytes()),
        DType::F16 => put_each(src, dst, |v| f16::from_f32(v).to_le_bytes()),
        DType::BF16 => put_each(src, dst, |v| bf16::from_f32(v).to_le_bytes()),
        DType::Q8_0 => per_block(dtype, src, dst, q8_0_block),
        DType::Q4_0 => per_block(dtype, src, dst, q4_0_block),
        DType::Q4_1 => per_block(dtype, src, dst, q4_1_block),
        DType::Q5_0 => per_block(dtype, src, dst, q5_0_block),
        DType::Q5_1 => per_block(dtype, src, dst, q5_1_block),
        DType::Q2_K => per_block(dtype, src, dst, q2_k_block),
        DType::Q3_K => per_block(dtype, src, dst, q3_k_block),
        DType::Q4_K => per_block(dtype, src, dst, |x, o| q45_k_block(x, o, false)),
        DType::Q5_K => per_block(dtype, src, dst, |x, o| q45_k_block(x, o, true)),
        DType::Q6_K => per_block(dtype, src, dst, q6_k_block),
        DType::IQ4_NL => per_block(dtype, src, dst, iq4_nl_block),
        DType::IQ4_XS => per_block(dtype, src, dst, iq4_xs_block),
        DType::MXFP4 => per_block(dtype, src, dst, mxfp4_block),
        DType::TQ1_0 => per_block(dtype, src, dst, tq1_0_block),
        DType::TQ2_0 => per_block(dtype, src, dst, tq2_0_block),
        DType::NVFP4 => per_block(dtype, src, dst, nvfp4_block),
        DType::Q1_0 => per_block(dtype, src, dst, q1_0_block),
        DType::Q2_0 => per_block(dtype, src, dst, q2_0_block),
        // No encoder of ours (`DType::has_encoder`): their files come from llama.cpp's quantizer
        // (importance-matrix searches over the codebooks).
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ1_M => {
            crate::bail!(
                Unsupported,
                "no encoder for {dtype}, a read-only format (a lattice search under an \
                 importance matrix: use llama.cpp's quantizer)"
            )
        }
    }
    Ok(())
}

fn put_each<const N: usize>(src: &[f32], dst: &mut [u8], enc: impl Fn(f32) -> [u8; N]) {
    for (v, out) in src.iter().zip(dst.chunks_exact_mut(N)) {
        out.copy_from_slice(&enc(*v));
    }
}

fn per_block(dtype: DType, src: &[f32], dst: &mut [u8], enc: impl Fn(&[f32], &mut [u8])) {
    let blocks = src.chunks_exact(dtype.block_size());
    for (b, out) in blocks.zip(dst.chunks_exact_mut(dtype.block_bytes())) {
        enc(b, out);
    }
}

/// Q8_0: d = max|x| / 127, q = round(x / d).
fn q8_0_block(x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (o, v) in out[2..].iter_mut().zip(x) {
        *o = (v * id).round().clamp(-127.0, 127.0) as i8 as u8;
    }
}

/// Q4_0: d = (the value of largest magnitude) / −8, q = clamp(round(x / d) + 8, 0, 15).
fn q4_0_block(x: &[f32], out: &mut [u8]) {
    let id = signed_scale(x, -8.0, out);
    let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    for j in 0..16 {
        out[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Q4_1: m = min, d = (max − min) / 15, q = clamp(round((x − m) / d), 0, 15).
fn q4_1_block(x: &[f32], out: &mut [u8]) {
    let (min, id) = affine_scale(x, 15.0, out);
    let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
    for j in 0..16 {
        out[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Q5_0: d = (the value of largest magnitude) / −16, q = clamp(round(x / d) + 16, 0, 31); bit 4
/// of q[j] goes to bit j of `qh`.
fn q5_0_block(x: &[f32], out: &mut [u8]) {
    let id = signed_scale(x, -16.0, out);
    let q: Vec<u32> = x
        .iter()
        .map(|v| ((v * id + 16.5) as i32).clamp(0, 31) as u32)
        .collect();
    put_five_bits(&q, &mut out[2..]);
}

/// Q5_1: m = min, d = (max − min) / 31, q = clamp(round((x − m) / d), 0, 31).
fn q5_1_block(x: &[f32], out: &mut [u8]) {
    let (min, id) = affine_scale(x, 31.0, out);
    let q: Vec<u32> = x
        .iter()
        .map(|v| (((v - min) * id + 0.5) as i32).clamp(0, 31) as u32)
        .collect();
    put_five_bits(&q, &mut out[4..]);
}

/// The scale of a block with a zero point (Q4_0, Q5_0): d = (the value of largest magnitude)
/// / `div`, written to `out[..2]` as f16; returns 1 / d (0 for d = 0).
fn signed_scale(x: &[f32], div: f32, out: &mut [u8]) -> f32 {
    let max = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / div;
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The scale and min of a block with a min (Q4_1, Q5_1): d = (max − min) / `levels`, written
/// to `out[..2]` and the min to `out[2..4]` as f16; returns (min, 1 / d (0 for d = 0)).
fn affine_scale(x: &[f32], levels: f32, out: &mut [u8]) -> (f32, f32) {
    let (min, max) = x
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let d = (max - min) / levels;
    out[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    out[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
    (min, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// 32 five-bit quants as `qh` (4 bytes) then 16 bytes of low nibbles (Q4_0's order).
fn put_five_bits(q: &[u32], out: &mut [u8]) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | ((v >> 4) << j));
    out[..4].copy_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        out[4 + j] = (q[j] & 15) as u8 | (((q[j + 16] & 15) as u8) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quant `j` of a block's 16 bytes of nibbles: the low nibbles hold 0..16, the high 16..32.
    fn nibble(qs: &[u8], j: usize) -> u8 {
        if j < 16 {
            qs[j] & 15
        } else {
            qs[j - 16] >> 4
        }
    }

    /// Decode one block-format row with plain loops (independent of the encoder above).
    fn decode(dtype: DType, row: &[u8], n: usize) -> Vec<f32> {
        let h = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let all: Vec<f32> = match dtype {
            DType::F32 => row
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            DType::F16 => row.chunks(2).map(h).collect(),
            DType::BF16 => row
                .chunks(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            DType::Q8_0 => row
                .chunks(34)
                .flat_map(|b| (0..32).map(move |j| h(b) * b[2 + j] as i8 as f32))
                .collect(),
            DType::Q4_0 => row
                .chunks(18)
                .flat_map(|b| (0..32).map(move |j| h(b) * (nibble(&b[2..], j) as f32 - 8.0)))
                .collect(),
            DType::Q4_1 => row
                .chunks(20)
                .flat_map(|b| (0..32).map(move |j| h(b) * nibble(&b[4..], j) as f32 + h(&b[2..])))
                .collect(),
            // Independent of the encoders; checked against gguf-py in tests/.
            _ => {
                let mut out = vec![0f32; n];
                crate::dequantize::dequantize_row(dtype, row, &mut out).unwrap();
                out
            }
        };
        all.into_iter().take(n).collect()
    }

    #[test]
    fn round_trip_error_is_within_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.11)
            .collect();
        let plain = |d: &DType| !d.is_super_block() && !d.is_decoded() && !d.is_lowbit();
        for dtype in DType::ALL.into_iter().filter(plain) {
            let mut buf = vec![0u8; dtype.row_bytes(x.len()).unwrap()];
            quantize_row(dtype, &x, &mut buf).unwrap();
            let back = decode(dtype, &buf, x.len());
            for (blk, (xb, yb)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let range = xb.iter().cloned().fold(f32::MIN, f32::max)
                    - xb.iter().cloned().fold(f32::MAX, f32::min);
                let step = match dtype {
                    DType::F32 => 0.0,
                    DType::F16 => amax / 1024.0,
                    DType::BF16 => amax / 128.0,
                    DType::Q8_0 => amax / 127.0,
                    // q − 8 spans −8..7: the opposite extreme can be a whole step off.
                    DType::Q4_0 => 2.0 * amax / 8.0,
                    DType::Q4_1 => range / 15.0,
                    DType::Q5_0 => 2.0 * amax / 16.0,
                    DType::Q5_1 => range / 31.0,
                    _ => unreachable!(),
                };
                for (a, b) in xb.iter().zip(yb) {
                    assert!(
                        (a - b).abs() <= 0.5 * step * 1.01 + 1e-6,
                        "{dtype} block {blk}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_sizes_are_errors() {
        let mut buf = [0u8; 10];
        assert!(quantize_row(DType::Q8_0, &[0.0; 32], &mut buf).is_err());
        assert!(quantize_row(DType::Q4_0, &[0.0; 31], &mut [0u8; 18]).is_err());
        // All-zero blocks encode to zero without dividing by zero.
        let mut z = [0xffu8; 20];
        quantize_row(DType::Q4_1, &[0.0; 32], &mut z).unwrap();
        assert_eq!(decode(DType::Q4_1, &z, 32), vec![0.0; 32]);
    }
}
