//! Portable kernels with f32 accumulation: the fallback on CPUs without AVX2 (or with
//! `POWERINFER_SIMD=scalar`). Quantized rows are decoded one block (32 weights, or a K-quant's
//! 256) at a time into a stack buffer and dotted from there, so the compiler can vectorise the inner loops; row
//! accumulation decodes a chunk of each row into a stack buffer and adds it in f32.

use super::{exp_nonpositive, sink_term, softmax_max};
use crate::operands::attention::{Head, ScoreBlock, ValueBlock};
use half::{bf16, f16};
use powerinfer_core::DType;

/// Weights per legacy quantized block.
const QK: usize = 32;
/// Weights per K-quant super-block (the largest block).
const QK_K: usize = 256;

/// Read the little-endian f16 at byte `at`.
#[inline]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Decode one quantized block (`dtype.block_bytes()` bytes) into 32 weights.
#[inline]
fn decode_block(dtype: DType, block: &[u8], out: &mut [f32; QK]) {
    match dtype {
        DType::Q8_0 => {
            let d = f16_at(block, 0);
            for (o, &q) in out.iter_mut().zip(&block[2..2 + QK]) {
                *o = d * (q as i8) as f32;
            }
        }
        DType::Q4_0 | DType::Q4_1 => {
            let (d, m, packed) = if dtype == DType::Q4_0 {
                let d = f16_at(block, 0);
                (d, -8.0 * d, &block[2..18])
            } else {
                (f16_at(block, 0), f16_at(block, 2), &block[4..20])
            };
            let (lo, hi) = out.split_at_mut(QK / 2);
            for ((l, h), &b) in lo.iter_mut().zip(hi).zip(packed) {
                *l = d * (b & 0x0F) as f32 + m;
                *h = d * (b >> 4) as f32 + m;
            }
        }
        _ => unreachable!("{dtype} has no 32-weight blocks of Q4/Q8 form"),
    }
}

/// Decode one quantized block of any format into its first `dtype.block_size()` weights of
/// `out`: the Q8/Q4 blocks here, the others through the core's decoder.
#[inline]
fn decode_any(dtype: DType, block: &[u8], out: &mut [f32; QK_K]) {
    match dtype {
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
            let mut buf = [0f32; QK];
            decode_block(dtype, block, &mut buf);
            out[..QK].copy_from_slice(&buf);
        }
        _ => powerinfer_core::dequantize::dequantize_block(dtype, block, out),
    }
}

/// Decode a whole row of `dtype` into `out` (sizes already checked by the caller).
pub(crate) fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            let mut buf = [0f32; QK_K];
            let n = dtype.block_size();
            for (o, block) in out
                .chunks_exact_mut(n)
                .zip(row.chunks_exact(dtype.block_bytes()))
            {
                decode_any(dtype, block, &mut buf);
                o.copy_from_slice(&buf[..n]);
            }
        }
    }
}

/// f32 dot product with eight partial sums (vectorisable, and more accurate than one chain).
#[inline]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (ca, cb) in a8.zip(b8) {
        for k in 0..8 {
            acc[k] += ca[k] * cb[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Dot product of one `dtype` row with `x` in f32.
pub(crate) fn dot_row(dtype: DType, row: &[u8], x: &[f32]) -> f32 {
    if !dtype.is_quantized() {
        let mut buf = [0f32; 64];
        let mut sum = 0f32;
        let bb = dtype.block_bytes();
        for (xc, rc) in x.chunks(buf.len()).zip(row.chunks(buf.len() * bb)) {
            dequantize_row(dtype, rc, &mut buf[..xc.len()]);
            sum += dot_f32(&buf[..xc.len()], xc);
        }
        return sum;
    }
    let mut buf = [0f32; QK_K];
    let mut sum = 0f32;
    let n = dtype.block_size();
    for (xb, block) in x.chunks_exact(n).zip(row.chunks_exact(dtype.block_bytes())) {
        decode_any(dtype, block, &mut buf);
        sum += dot_f32(&buf[..n], xb);
    }
    sum
}

/// out[i] = dot(row i, x) for the consecutive rows in `rows` (each `row_bytes` long).
pub(crate) fn rows_dot(dtype: DType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    if row_bytes == 0 {
        out.fill(0.0);
        return;
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(row_bytes)) {
        *o = dot_row(dtype, row, x);
    }
}

/// Tile product for matmul: `w` holds `r` dequantised rows of `cols`, `x` holds tokens of `cols`;
/// out[t·r + i] = dot(w row i, x token t).
pub(crate) fn tile_dot(w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    let r = w.len() / cols;
    for (xt, ot) in x.chunks_exact(cols).zip(out.chunks_exact_mut(r)) {
        for (o, wr) in ot.iter_mut().zip(w.chunks_exact(cols)) {
            *o = dot_f32(wr, xt);
        }
    }
}

/// Weights decoded per step of row accumulation (a multiple of the 32-weight block).
const CHUNK: usize = 256;

/// y += Σ_i a[i] · rows[i], each row holding `y.len()` weights of `dtype` (sizes checked by
/// the caller), one row at a time.
pub(crate) fn axpy_group(dtype: DType, rows: &[&[u8]], a: &[f32], y: &mut [f32]) {
    for (row, &ai) in rows.iter().zip(a) {
        axpy_row(dtype, row, ai, y);
    }
}

/// y += a · row, in f32.
fn axpy_row(dtype: DType, row: &[u8], a: f32, y: &mut [f32]) {
    let mut buf = [0f32; CHUNK];
    let bytes_per_chunk = CHUNK / dtype.block_size() * dtype.block_bytes();
    for (yc, rc) in y.chunks_mut(CHUNK).zip(row.chunks(bytes_per_chunk)) {
        let w = &mut buf[..yc.len()];
        dequantize_row(dtype, rc, w);
        for (yk, &wk) in yc.iter_mut().zip(w.iter()) {
            *yk += a * wk;
        }
    }
}

/// out[i] = dot(rows[i], x) for a few scattered rows.
pub(crate) fn dot_group(dtype: DType, rows: &[&[u8]], x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows) {
        *o = dot_row(dtype, row, x);
    }
}

/// One attention head in portable Rust: the scalar path's eight-sum dot, four positions per
/// pass over the output (sizes checked by [`Head::check`]).
pub(crate) fn attend_head<'h>(head: &Head<'h>, scores: &mut Vec<f32>, out: &mut [f32]) {
    let (q, cache, n_pos, scale) = (head.q, head.cache, head.n_pos, head.scale);
    let hd = q.len();
    let stride = cache.stride;
    let at = |data: &'h [f32], p: usize| -> &'h [f32] { &data[p * stride..p * stride + hd] };
    scores.clear();
    scores.resize(n_pos, 0.0);
    for (p, s) in scores.iter_mut().enumerate() {
        *s = dot_f32(q, at(cache.keys, p)) * scale;
    }
    let max = softmax_max(scores, head.sink);
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let inv = 1.0 / (scores.iter().sum::<f32>() + sink_term(head.sink, max));
    out.fill(0.0);
    // Four positions per pass: out is read and written once per four value vectors.
    let mut quads = scores.chunks_exact(4);
    let mut p = 0;
    for w in &mut quads {
        let (v0, v1) = (at(cache.values, p), at(cache.values, p + 1));
        let (v2, v3) = (at(cache.values, p + 2), at(cache.values, p + 3));
        let (w0, w1, w2, w3) = (w[0] * inv, w[1] * inv, w[2] * inv, w[3] * inv);
        let rows = v0.iter().zip(v1).zip(v2).zip(v3);
        for (o, (((a, b), c), d)) in out.iter_mut().zip(rows) {
            *o += w0 * a + w1 * b + w2 * c + w3 * d;
        }
        p += 4;
    }
    for &w in quads.remainder() {
        let w = w * inv;
        for (o, &vi) in out.iter_mut().zip(at(cache.values, p)) {
            *o += w * vi;
        }
        p += 1;
    }
}

/// The scores of a query sub-block (see `crate::ops::attend_block`): each query's row
/// accumulated one key dimension at a time.
pub(crate) fn block_scores(sb: &ScoreBlock<'_>, s: &mut [f32]) {
    let w = sb.width;
    for (b, row) in s.chunks_exact_mut(w).take(sb.n_q).enumerate() {
        row.fill(0.0);
        for c in 0..sb.hd {
            let qc = sb.q[b * sb.q_stride + c];
            let krow = &sb.kt[c * sb.kt_stride..c * sb.kt_stride + w];
            row.iter_mut().zip(krow).for_each(|(o, &k)| *o += qc * k);
        }
        row.iter_mut().for_each(|v| *v *= sb.scale);
    }
}

/// row[p] = e^(row[p] − max) on lo..hi (max over those), 0 elsewhere; returns the row's sum.
pub(crate) fn block_softmax_row(row: &mut [f32], lo: usize, hi: usize) -> f32 {
    let max = row[lo..hi].iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    row[..lo].fill(0.0);
    row[hi..].fill(0.0);
    let mut sum = 0.0;
    for v in &mut row[lo..hi] {
        *v = exp_nonpositive(*v - max);
        sum += *v;
    }
    sum
}

/// The weighted value sums of a query sub-block (see `crate::ops::attend_block`).
pub(crate) fn block_values(vb: &ValueBlock<'_>, out: &mut [f32], out_stride: usize) {
    let hd = vb.hd;
    for (b, (w, &inv)) in vb.s.chunks_exact(vb.width).zip(vb.inv).enumerate() {
        let o = &mut out[b * out_stride..b * out_stride + hd];
        o.fill(0.0);
        for (p, &wp) in w.iter().enumerate().take(vb.np) {
            let v = &vb.values[p * vb.stride..p * vb.stride + hd];
            o.iter_mut().zip(v).for_each(|(oc, &vc)| *oc += wp * vc);
        }
        o.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Wrapping sum of `data` (the bandwidth probe's reader): eight independent chains so the adds
/// never limit the loads.
pub(crate) fn read_sum(data: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(v);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &v| a.wrapping_add(v));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}
