//! One attention head over a cache whose keys or values are ggml's 32-value blocks (q8_0,
//! q4_0, q4_1; the other side may be f32 rows), as llama.cpp reads a quantized KV cache:
//!
//! 1. q·k: the query quantized once to q8_0 (ggml's reference rounding), then per position and
//!    block an exact integer dot, scaled by both blocks' scales (and, for q4_1, its min times
//!    the query block's sum), the blocks' terms added in order in f32;
//! 2. the softmax in f32 (e^x from [`super::exp_nonpositive`]);
//! 3. out = Σ_p w_p · v_p from each value block dequantized on the fly (w_p·d per block times
//!    its integers, plus w_p·m for q4_1).
//!
//! One body, `#[inline(always)]`, generic over the block format ([`KvBlock`]): the scalar level
//! calls it as portable Rust, the AVX2 level from a `#[target_feature]` function so the same
//! loops compile to 256-bit integer and float code. Every level gives the same bits (integer
//! sums are exact in any order; every float operation is in the same order).

use half::f16;
use powerinfer_core::DType;

use super::exp_nonpositive;
use super::scalar::dot_f32;
use crate::operands::attention::{KvHead, KvRows, KvScratch};

/// Values per block.
pub(crate) const QK: usize = 32;

/// The f16 at byte `at` of `b`, as f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// A block format of the cache: how one block dots with a q8_0 query block and adds into an
/// output row.
trait KvBlock {
    /// Bytes per block.
    const BYTES: usize;
    /// Σ_i q_i·k_i for the block `b` and a query block (`dq` its scale, `qs` its 32 integers,
    /// `qsum` their sum).
    fn dot(b: &[u8], dq: f32, qs: &[i8], qsum: i32) -> f32;
    /// out[i] += w · v_i for the block's 32 values.
    fn axpy(b: &[u8], w: f32, out: &mut [f32]);
}

/// q8_0: d, 32 × i8.
struct Q8_0;
/// q4_0: d, 16 bytes (value j in byte j's low nibble, j + 16 in its high one), v = d·(n − 8).
struct Q4_0;
/// q4_1: d, m, 16 bytes as q4_0's, v = d·n + m.
struct Q4_1;

impl KvBlock for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    fn dot(b: &[u8], dq: f32, qs: &[i8], _: i32) -> f32 {
        let ks = &b[2..2 + QK];
        let mut s = 0i32;
        // i8 · i8 fits i16 (at most 128²): 16-bit products, which vectorise to pair sums.
        for (&k, &q) in ks.iter().zip(&qs[..QK]) {
            s += i32::from(k as i8 as i16 * q as i16);
        }
        (f16_at(b, 0) * dq) * s as f32
    }
    #[inline(always)]
    fn axpy(b: &[u8], w: f32, out: &mut [f32]) {
        let c = w * f16_at(b, 0);
        for (o, &k) in out[..QK].iter_mut().zip(&b[2..2 + QK]) {
            *o += c * (k as i8 as f32);
        }
    }
}

/// Σ_j q_j·lo_j + q_{j+16}·hi_j over a block's 16 nibble bytes, less `bias`·Σ q.
#[inline(always)]
fn nibble_dot(ns: &[u8], qs: &[i8], bias: i32) -> i32 {
    let (lo, hi) = qs[..QK].split_at(QK / 2);
    let mut s = 0i32;
    for ((&n, &a), &b) in ns[..QK / 2].iter().zip(lo).zip(hi) {
        s += ((n & 15) as i32 - bias) * a as i32 + ((n >> 4) as i32 - bias) * b as i32;
    }
    s
}

/// out[j] += c·(lo_j − bias) + m, out[j + 16] += c·(hi_j − bias) + m.
#[inline(always)]
fn nibble_axpy(ns: &[u8], c: f32, m: f32, bias: i32, out: &mut [f32]) {
    let (lo, hi) = out[..QK].split_at_mut(QK / 2);
    for ((&n, a), b) in ns[..QK / 2].iter().zip(lo).zip(hi) {
        *a += c * ((n & 15) as i32 - bias) as f32 + m;
        *b += c * ((n >> 4) as i32 - bias) as f32 + m;
    }
}

impl KvBlock for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    fn dot(b: &[u8], dq: f32, qs: &[i8], _: i32) -> f32 {
        (f16_at(b, 0) * dq) * nibble_dot(&b[2..], qs, 8) as f32
    }
    #[inline(always)]
    fn axpy(b: &[u8], w: f32, out: &mut [f32]) {
        nibble_axpy(&b[2..], w * f16_at(b, 0), 0.0, 8, out);
    }
}

impl KvBlock for Q4_1 {
    const BYTES: usize = 20;
    #[inline(always)]
    fn dot(b: &[u8], dq: f32, qs: &[i8], qsum: i32) -> f32 {
        let isum = nibble_dot(&b[4..], qs, 0);
        (f16_at(b, 0) * dq) * isum as f32 + f16_at(b, 2) * (dq * qsum as f32)
    }
    #[inline(always)]
    fn axpy(b: &[u8], w: f32, out: &mut [f32]) {
        nibble_axpy(&b[4..], w * f16_at(b, 0), w * f16_at(b, 2), 0, out);
    }
}

/// Run `$body` with `$t` the [`KvBlock`] of `$dtype` (q8_0, q4_0 or q4_1).
macro_rules! with_block {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::Q8_0 => {
                type $t = Q8_0;
                $body
            }
            DType::Q4_0 => {
                type $t = Q4_0;
                $body
            }
            DType::Q4_1 => {
                type $t = Q4_1;
                $body
            }
            other => unreachable!("{other} is no KV block format (checked by the op)"),
        }
    };
}

/// The query quantized to q8_0 into `scratch` (scales, integers, per-block sums).
#[inline(always)]
fn quantize_query(q: &[f32], scratch: &mut KvScratch) {
    let nb = q.len() / QK;
    scratch.qbytes.resize(nb * Q8_0::BYTES, 0);
    // The shape was checked by the op: whole blocks, so this cannot fail.
    let _ = powerinfer_core::quantize::quantize_row(DType::Q8_0, q, &mut scratch.qbytes);
    scratch.qd.clear();
    scratch.qs.clear();
    scratch.qsum.clear();
    for b in scratch.qbytes.chunks_exact(Q8_0::BYTES) {
        scratch.qd.push(f16_at(b, 0));
        let ints = b[2..].iter().map(|&v| v as i8);
        scratch.qs.extend(ints.clone());
        scratch.qsum.push(ints.map(i32::from).sum());
    }
}

/// scores[p] = Σ_blocks dot(key block, query block) for positions `0..n_pos`.
#[inline(always)]
fn block_scores<B: KvBlock>(
    keys: &[u8],
    pos_bytes: usize,
    n_pos: usize,
    s: &KvScratch,
    scores: &mut [f32],
) {
    let nb = s.qd.len();
    for (p, out) in scores.iter_mut().enumerate().take(n_pos) {
        let row = &keys[p * pos_bytes..p * pos_bytes + nb * B::BYTES];
        let mut acc = 0f32;
        for (i, b) in row.chunks_exact(B::BYTES).enumerate() {
            acc += B::dot(b, s.qd[i], &s.qs[i * QK..], s.qsum[i]);
        }
        *out = acc;
    }
}

/// out += Σ_p w[p] · v_p over value blocks.
#[inline(always)]
fn block_values<B: KvBlock>(values: &[u8], pos_bytes: usize, w: &[f32], out: &mut [f32]) {
    let nb = out.len() / QK;
    for (p, &wp) in w.iter().enumerate() {
        let row = &values[p * pos_bytes..p * pos_bytes + nb * B::BYTES];
        for (b, o) in row.chunks_exact(B::BYTES).zip(out.chunks_exact_mut(QK)) {
            B::axpy(b, wp, o);
        }
    }
}

/// The head's attention into `out` (sizes checked by the op; see the module header).
#[inline(always)]
pub(crate) fn attend_head_kv(head: &KvHead<'_>, scratch: &mut KvScratch, out: &mut [f32]) {
    let (q, n_pos, stride) = (head.q, head.n_pos, head.cache.stride);
    let hd = q.len();
    let mut scores = std::mem::take(&mut scratch.scores);
    scores.clear();
    scores.resize(n_pos, 0.0);
    match head.cache.keys {
        KvRows::F32(k) => {
            for (p, s) in scores.iter_mut().enumerate() {
                *s = dot_f32(q, &k[p * stride..p * stride + hd]);
            }
        }
        KvRows::Blocks(dtype, k) => {
            quantize_query(q, scratch);
            let pos_bytes = stride / QK * dtype.block_bytes();
            with_block!(dtype, B => block_scores::<B>(k, pos_bytes, n_pos, scratch, &mut scores));
        }
    }
    for s in scores.iter_mut() {
        *s *= head.scale;
        if let Some(c) = head.softcap {
            *s = c * (*s / c).tanh();
        }
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let inv = 1.0 / scores.iter().sum::<f32>();
    scores.iter_mut().for_each(|s| *s *= inv);
    out.fill(0.0);
    match head.cache.values {
        KvRows::F32(v) => {
            for (p, &w) in scores.iter().enumerate() {
                let row = &v[p * stride..p * stride + hd];
                out.iter_mut().zip(row).for_each(|(o, &x)| *o += w * x);
            }
        }
        KvRows::Blocks(dtype, v) => {
            let pos_bytes = stride / QK * dtype.block_bytes();
            with_block!(dtype, B => block_values::<B>(v, pos_bytes, &scores, out));
        }
    }
    scratch.scores = scores;
}

/// [`attend_head_kv`] in portable Rust (the scalar level).
pub(crate) fn attend_head_kv_portable(head: &KvHead<'_>, scratch: &mut KvScratch, out: &mut [f32]) {
    attend_head_kv(head, scratch, out)
}
