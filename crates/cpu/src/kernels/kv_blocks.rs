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
//! One body, `#[inline(always)]`, generic over the block format ([`KvBlock`]) and over a SIMD
//! level's two block loops ([`KvPasses`]): the scalar level runs the portable loops
//! ([`Portable`]), the AVX2 level its intrinsics (`super::avx2::kv_passes`: byte-pair
//! products for the integer dot, the output held in registers while the value blocks stream
//! by). Every level gives the same bits (integer sums are exact in any order; every float
//! operation is the same, in the same order).

use half::f16;
use powerinfer_core::DType;

use super::scalar::dot_f32;
use super::{exp_nonpositive, sink_term, softmax_max};
use crate::operands::attention::{KvHead, KvRows, KvScratch};

/// Values per block.
pub(crate) const QK: usize = 32;

/// The f16 at byte `at` of `b`, as f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Where a block's 32 integers are and how they are stored.
#[derive(Clone, Copy)]
pub(crate) enum Ints {
    /// 32 signed bytes from byte `.0`.
    Bytes(usize),
    /// 16 bytes from byte `at`: value j in byte j's low nibble, j + 16 in its high one, each
    /// less `bias`.
    Nibbles { at: usize, bias: i32 },
}

/// A block format of the cache: where its integers are ([`Ints`]), how their dot with a q8_0
/// query block is scaled, and the coefficients of its values.
pub(crate) trait KvBlock {
    /// Bytes per block.
    const BYTES: usize;
    /// The block's integers.
    const INTS: Ints;
    /// The block's term of q·k from `isum` = Σ_i q_i·k_i over its integers (`dq` the query
    /// block's scale, `qsum` the sum of its integers); by default a block of one scale d at
    /// byte 0: d·dq·isum.
    #[inline(always)]
    fn scale(b: &[u8], dq: f32, isum: i32, _qsum: i32) -> f32 {
        (f16_at(b, 0) * dq) * isum as f32
    }
    /// (c, m) with the block's value i = c·k_i + m times the weight `w` (m unused for
    /// [`Ints::Bytes`]); by default (w·d, 0).
    #[inline(always)]
    fn coeffs(b: &[u8], w: f32) -> (f32, f32) {
        (w * f16_at(b, 0), 0.0)
    }
}

/// q8_0: d, 32 × i8.
pub(crate) struct Q8_0;
/// q4_0: d, 16 nibble bytes, v = d·(n − 8).
pub(crate) struct Q4_0;
/// q4_1: d, m, 16 nibble bytes, v = d·n + m.
pub(crate) struct Q4_1;

impl KvBlock for Q8_0 {
    const BYTES: usize = 34;
    const INTS: Ints = Ints::Bytes(2);
}

impl KvBlock for Q4_0 {
    const BYTES: usize = 18;
    const INTS: Ints = Ints::Nibbles { at: 2, bias: 8 };
}

impl KvBlock for Q4_1 {
    const BYTES: usize = 20;
    const INTS: Ints = Ints::Nibbles { at: 4, bias: 0 };
    #[inline(always)]
    fn scale(b: &[u8], dq: f32, isum: i32, qsum: i32) -> f32 {
        (f16_at(b, 0) * dq) * isum as f32 + f16_at(b, 2) * (dq * qsum as f32)
    }
    #[inline(always)]
    fn coeffs(b: &[u8], w: f32) -> (f32, f32) {
        (w * f16_at(b, 0), w * f16_at(b, 2))
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

/// Σ_i q_i·k_i over block `b`'s integers and a query block's.
#[inline(always)]
fn int_dot<B: KvBlock>(b: &[u8], qs: &[i8]) -> i32 {
    match B::INTS {
        Ints::Bytes(at) => {
            let mut s = 0i32;
            // i8 · i8 fits i16 (at most 128²): 16-bit products, which vectorise to pair sums.
            for (&k, &q) in b[at..at + QK].iter().zip(&qs[..QK]) {
                s += i32::from(k as i8 as i16 * q as i16);
            }
            s
        }
        Ints::Nibbles { at, bias } => nibble_dot(&b[at..], qs, bias),
    }
}

/// out[i] += w · v_i for block `b`'s 32 values.
#[inline(always)]
fn block_axpy<B: KvBlock>(b: &[u8], w: f32, out: &mut [f32]) {
    let (c, m) = B::coeffs(b, w);
    match B::INTS {
        Ints::Bytes(at) => {
            for (o, &k) in out[..QK].iter_mut().zip(&b[at..at + QK]) {
                *o += c * (k as i8 as f32);
            }
        }
        Ints::Nibbles { at, bias } => nibble_axpy(&b[at..], c, m, bias, out),
    }
}

/// A SIMD level's loops over the block side of a head (the portable ones: [`Portable`]).
/// Every level's must give [`Portable`]'s bits: the integer sums are exact, and each output
/// is the same float operations in the same order.
pub(crate) trait KvPasses {
    /// scores[p] = Σ_blocks B::scale(key block, its dot with the query block), blocks in
    /// order, for positions `0..n_pos`.
    fn scores<B: KvBlock>(k: &[u8], pos_bytes: usize, n_pos: usize, s: &KvScratch, out: &mut [f32]);
    /// out += Σ_p w[p] · v_p over value blocks, positions in order for every output.
    fn values<B: KvBlock>(v: &[u8], pos_bytes: usize, w: &[f32], out: &mut [f32]);
}

/// The portable loops (the scalar level; the reference of the others).
pub(crate) struct Portable;

impl KvPasses for Portable {
    #[inline(always)]
    fn scores<B: KvBlock>(
        k: &[u8],
        pos_bytes: usize,
        n_pos: usize,
        s: &KvScratch,
        out: &mut [f32],
    ) {
        let nb = s.qd.len();
        for (p, o) in out.iter_mut().enumerate().take(n_pos) {
            let row = &k[p * pos_bytes..p * pos_bytes + nb * B::BYTES];
            let mut acc = 0f32;
            for (i, b) in row.chunks_exact(B::BYTES).enumerate() {
                acc += B::scale(b, s.qd[i], int_dot::<B>(b, &s.qs[i * QK..]), s.qsum[i]);
            }
            *o = acc;
        }
    }
    #[inline(always)]
    fn values<B: KvBlock>(v: &[u8], pos_bytes: usize, w: &[f32], out: &mut [f32]) {
        let nb = out.len() / QK;
        for (p, &wp) in w.iter().enumerate() {
            let row = &v[p * pos_bytes..p * pos_bytes + nb * B::BYTES];
            for (b, o) in row.chunks_exact(B::BYTES).zip(out.chunks_exact_mut(QK)) {
                block_axpy::<B>(b, wp, o);
            }
        }
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

/// The head's attention into `out` (sizes checked by the op; see the module header).
#[inline(always)]
pub(crate) fn attend_head_kv<L: KvPasses>(
    head: &KvHead<'_>,
    scratch: &mut KvScratch,
    out: &mut [f32],
) {
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
            with_block!(dtype, B => L::scores::<B>(k, pos_bytes, n_pos, scratch, &mut scores));
        }
    }
    for s in scores.iter_mut() {
        *s *= head.scale;
        if let Some(c) = head.extras.softcap {
            *s = c * (*s / c).tanh();
        }
    }
    let sink = head.extras.sink;
    let max = softmax_max(&scores, sink);
    for s in scores.iter_mut() {
        *s = exp_nonpositive(*s - max);
    }
    let inv = 1.0 / (scores.iter().sum::<f32>() + sink_term(sink, max));
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
            with_block!(dtype, B => L::values::<B>(v, pos_bytes, &scores, out));
        }
    }
    scratch.scores = scores;
}

/// [`attend_head_kv`] in portable Rust (the scalar level).
pub(crate) fn attend_head_kv_portable(head: &KvHead<'_>, scratch: &mut KvScratch, out: &mut [f32]) {
    attend_head_kv::<Portable>(head, scratch, out)
}
