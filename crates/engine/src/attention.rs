//! Causal grouped-query attention over the KV cache. One token (decoding) or a CPU without the
//! block kernels: parallel over (token, head) pairs, each `powerinfer_cpu::attend_head`. Several
//! tokens (prompt prefill) on a CPU with them: parallel over heads (and strips of tokens where
//! there are fewer heads than tasks wanted), each strip one `powerinfer_cpu::attend_block`,
//! which reads every key and value once per strip of queries instead of once per query.

use powerinfer_cpu::{
    attend_block, attend_head, attend_head_kv, block_attention_is_fast, BlockScratch, HeadCache,
    KvHeadCache, KvRows, KvScratch, QueryBlock, SoftmaxExtras,
};
use rayon::prelude::*;

/// Tokens from which a call takes the block kernels (where the CPU has them fast): every
/// multi-token pass, so that a prompt's keys and values do not depend on how many of its tokens
/// one pass computed (the block kernels give a query the same bits whatever block it is in).
const BLOCK_MIN_TOKENS: usize = 2;
/// Block tasks wanted per thread (heads are split into strips of tokens to reach it).
const BLOCK_TASKS_PER_THREAD: usize = 2;

/// Multiply-adds (per q·k product) below which attention runs on the calling thread. SmolLM2
/// (9 heads of 64) goes parallel from about 57 positions on; decoding at 400 positions that took
/// it from 107 to 125 tok/s against the old bound of 2^18 (2 threads).
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Shape of one attention call.
pub struct AttnShape<'a> {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window: a token attends to the positions at distance < `w` (None: all before).
    pub window: Option<usize>,
    /// The query scale (None: 1/sqrt(head_dim)).
    pub scale: Option<f32>,
    /// Scores soft-capped to `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// Per query head a sink logit that joins the softmax's max and denominator with no
    /// value (gpt-oss's `attn_sinks`); None: no sinks.
    pub sinks: Option<&'a [f32]>,
}

/// Scratch of the per-head kernels over f32 sides: `attend_head`'s scores, and
/// `attend_head_kv`'s scratch where the scores are soft-capped.
#[derive(Default)]
struct F32Scratch {
    scores: Vec<f32>,
    kv: KvScratch,
}

/// Attention for `n` new tokens whose positions are `start..start+n`.
///
/// `q` is n × (n_heads·head_dim); `keys`/`values` hold positions `0..start+n`, each row
/// n_kv_heads·head_dim wide (f32 values, or a quantized cache's blocks); `out` is
/// n × (n_heads·head_dim). Token t attends to positions `0..=start+t` (or the last `window` of
/// them). Over blocks every (token, head) is one `powerinfer_cpu::attend_head_kv`, so a
/// token's output has the same bits whatever else the call holds.
pub fn attention(
    shape: &AttnShape<'_>,
    q: &[f32],
    keys: KvRows<'_>,
    values: KvRows<'_>,
    start: usize,
    out: &mut [f32],
) {
    match (keys, values) {
        (KvRows::F32(k), KvRows::F32(v)) => attention_f32(shape, q, k, v, start, out),
        _ => attention_blocks(shape, q, keys, values, start, out),
    }
}

/// One (token, head) of an attention call: its query, the offset in the cache rows of its
/// first attended position's KV head (`first · kv_dim + kv_head · head_dim`), and how many
/// positions it attends to.
struct HeadTask<'a> {
    q: &'a [f32],
    offset: usize,
    len: usize,
    /// The head's query head (its sink's index).
    head: usize,
}

/// Run `one` for every (token, head) of `out` (n × n_heads·head_dim), in order on one thread
/// for small calls, else in parallel with a scratch `S` per worker; each head's output is its
/// own slice, so the bits do not depend on the split.
fn each_head<S: Default + Send>(
    shape: &AttnShape<'_>,
    q: &[f32],
    start: usize,
    out: &mut [f32],
    one: impl Fn(&mut S, HeadTask<'_>, &mut [f32]) + Sync,
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let task = |s: &mut S, idx: usize, o: &mut [f32]| {
        let (t, h) = (idx / shape.n_heads, idx % shape.n_heads);
        let end = start + t + 1;
        let first = shape.window.map_or(0, |w| end.saturating_sub(w));
        let head = HeadTask {
            q: &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd],
            offset: first * kv_dim + (h / group) * hd,
            len: end - first,
            head: h,
        };
        one(s, head, o);
    };
    // Multiply-adds of the whole call; below this a parallel region costs more than it saves.
    let work = out.len() / hd * (start + out.len() / q_dim) * hd;
    if work < PARALLEL_MIN_WORK {
        let mut s = S::default();
        for (idx, o) in out.chunks_mut(hd).enumerate() {
            task(&mut s, idx, o);
        }
    } else {
        out.par_chunks_mut(hd)
            .enumerate()
            .for_each_init(S::default, |s, (idx, o)| task(s, idx, o));
    }
}

/// [`attention`] over a cache with a block side: one [`attend_head_kv`] per (token, head).
fn attention_blocks(
    shape: &AttnShape<'_>,
    q: &[f32],
    keys: KvRows<'_>,
    values: KvRows<'_>,
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let kv_dim = shape.n_kv_heads * hd;
    let scale = shape.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    each_head(shape, q, start, out, |scratch: &mut KvScratch, head, o| {
        let cache = KvHeadCache {
            keys: keys.skip(head.offset),
            values: values.skip(head.offset),
            stride: kv_dim,
        };
        let extras = SoftmaxExtras {
            softcap: shape.softcap,
            sink: shape.sinks.map(|s| s[head.head]),
        };
        attend_head_kv(head.q, cache, head.len, scale, extras, scratch, o);
    });
}

/// [`attention`] over f32 keys and values.
fn attention_f32(
    shape: &AttnShape<'_>,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let kv_dim = shape.n_kv_heads * hd;
    let scale = shape.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    let n = out.len() / (shape.n_heads * hd);
    // The block kernels have no sinks.
    if n >= BLOCK_MIN_TOKENS && block_attention_is_fast() && shape.sinks.is_none() {
        return blocked(shape, q, keys, values, start, out);
    }
    each_head(shape, q, start, out, |s: &mut F32Scratch, head, o| {
        let sink = shape.sinks.map(|s| s[head.head]);
        match shape.softcap {
            None => {
                let cache = HeadCache {
                    keys: &keys[head.offset..],
                    values: &values[head.offset..],
                    stride: kv_dim,
                };
                attend_head(head.q, cache, head.len, scale, sink, &mut s.scores, o)
            }
            Some(cap) => {
                let cache = KvHeadCache {
                    keys: KvRows::F32(&keys[head.offset..]),
                    values: KvRows::F32(&values[head.offset..]),
                    stride: kv_dim,
                };
                let extras = SoftmaxExtras {
                    softcap: Some(cap),
                    sink,
                };
                attend_head_kv(head.q, cache, head.len, scale, extras, &mut s.kv, o)
            }
        }
    });
}

/// [`attention`] for several tokens on the block kernels: one task per (head, strip of
/// tokens), each task's output gathered into `out` afterwards.
fn blocked(
    shape: &AttnShape<'_>,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let q_dim = shape.n_heads * hd;
    let kv_dim = shape.n_kv_heads * hd;
    let group = shape.n_heads / shape.n_kv_heads;
    let n = out.len() / q_dim;
    let scale = shape.scale.unwrap_or(1.0 / (hd as f32).sqrt());
    let wanted = rayon::current_num_threads() * BLOCK_TASKS_PER_THREAD;
    let strips = wanted.div_ceil(shape.n_heads).clamp(1, n);
    let per = n.div_ceil(strips);
    let tasks: Vec<(usize, usize)> = (0..shape.n_heads)
        .flat_map(|h| (0..n).step_by(per).map(move |t0| (h, t0)))
        .collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(BlockScratch::default, |scratch, &(h, t0)| {
            let n_q = per.min(n - t0);
            let kvh = h / group;
            let blk = QueryBlock {
                q: &q[t0 * q_dim + h * hd..],
                q_stride: q_dim,
                n_q,
                hd,
                cache: HeadCache {
                    keys: &keys[kvh * hd..],
                    values: &values[kvh * hd..],
                    stride: kv_dim,
                },
                end0: start + t0 + 1,
                window: shape.window,
                scale,
                softcap: shape.softcap,
            };
            let mut o = vec![0.0f32; n_q * hd];
            attend_block(&blk, scratch, &mut o, hd);
            o
        })
        .collect();
    for (&(h, t0), part) in tasks.iter().zip(&parts) {
        for (i, row) in part.chunks_exact(hd).enumerate() {
            let at = (t0 + i) * q_dim + h * hd;
            out[at..at + hd].copy_from_slice(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straight f64 loops over the definition.
    fn reference(
        shape: &AttnShape<'_>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        start: usize,
        n: usize,
    ) -> Vec<f64> {
        let hd = shape.head_dim;
        let (qd, kd) = (shape.n_heads * hd, shape.n_kv_heads * hd);
        let g = shape.n_heads / shape.n_kv_heads;
        let mut out = vec![0.0f64; n * qd];
        for t in 0..n {
            for h in 0..shape.n_heads {
                let kvh = h / g;
                let first = shape
                    .window
                    .map_or(0, |w| (start + t + 1).saturating_sub(w));
                let s: Vec<f64> = (first..=start + t)
                    .map(|p| {
                        (0..hd)
                            .map(|i| {
                                q[t * qd + h * hd + i] as f64 * k[p * kd + kvh * hd + i] as f64
                            })
                            .sum::<f64>()
                            * shape.scale.map_or(1.0 / (hd as f64).sqrt(), f64::from)
                    })
                    .map(|s| match shape.softcap {
                        Some(c) => c as f64 * (s / c as f64).tanh(),
                        None => s,
                    })
                    .collect();
                let sink = shape.sinks.map(|s| s[h] as f64);
                let m = s
                    .iter()
                    .cloned()
                    .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                for (p, w) in (first..).zip(&e) {
                    for i in 0..hd {
                        out[t * qd + h * hd + i] += w / z * v[p * kd + kvh * hd + i] as f64;
                    }
                }
            }
        }
        out
    }

    fn check(start: usize, n: usize, window: Option<usize>) {
        check_with(start, n, window, None, None);
    }

    /// Sink logits of the six heads of [`check_with`]: small, large (the sink takes most of
    /// the weight) and negative.
    const SINKS: [f32; 6] = [0.3, 4.0, -2.0, 0.0, 1.5, -0.5];

    fn check_with(
        start: usize,
        n: usize,
        window: Option<usize>,
        scale: Option<f32>,
        softcap: Option<f32>,
    ) {
        check_sinks(start, n, window, scale, softcap, None);
        check_sinks(start, n, window, scale, softcap, Some(&SINKS));
    }

    fn check_sinks(
        start: usize,
        n: usize,
        window: Option<usize>,
        scale: Option<f32>,
        softcap: Option<f32>,
        sinks: Option<&[f32]>,
    ) {
        let shape = AttnShape {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 10,
            window,
            scale,
            softcap,
            sinks,
        };
        let total = start + n;
        let gen = |len: usize, seed: u32| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 500.0 - 1.0
                })
                .collect()
        };
        let q = gen(n * 60, 1);
        let k = gen(total * 20, 2);
        let v = gen(total * 20, 3);
        let mut out = vec![0.0f32; n * 60];
        attention(
            &shape,
            &q,
            KvRows::F32(&k),
            KvRows::F32(&v),
            start,
            &mut out,
        );
        let r = reference(&shape, &q, &k, &v, start, n);
        for (a, b) in out.iter().zip(&r) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn matches_reference_with_gqa_serial_path() {
        check(5, 3, None);
        check(5, 3, Some(4));
        check(5, 3, Some(100));
        check_with(7, 4, Some(5), Some(0.9), Some(0.5));
        check_with(7, 4, None, None, Some(50.0));
    }

    #[test]
    fn matches_reference_with_gqa_parallel_path() {
        // 4 tokens x 6 heads x ~2000 positions x 10 is above PARALLEL_MIN_WORK.
        check(2000, 4, None);
        check(2000, 4, Some(300));
    }

    #[test]
    fn matches_reference_on_prefills() {
        // Many tokens: the block kernels where the CPU has them (strips of tokens per head).
        check(0, 70, None);
        check(3, 41, Some(17));
        check_with(0, 33, Some(9), Some(0.7), Some(20.0));
        check_with(12, 5, None, None, Some(0.5));
    }

    /// Keys and values quantized to `dtype` as a cache stores them (rows of `width`).
    fn blocks(dtype: powerinfer_core::DType, x: &[f32], width: usize) -> (Vec<u8>, Vec<f32>) {
        let rb = dtype.row_bytes(width).unwrap();
        let mut b = vec![0u8; x.len() / width * rb];
        let mut back = vec![0f32; x.len()];
        powerinfer_core::quantize::quantize_row(dtype, x, &mut b).unwrap();
        powerinfer_core::dequantize_row(dtype, &b, &mut back).unwrap();
        (b, back)
    }

    #[test]
    fn block_caches_give_batched_rows_the_bits_of_steps_and_match_f32_values() {
        use powerinfer_core::DType;
        let (start, n) = (37, 9);
        let total = start + n;
        let sinks = [0.5f32, 3.0, -1.0, 0.0];
        for (window, softcap, sinks) in [
            (None, None, None),
            (Some(11), Some(20.0), None),
            (Some(11), None, Some(&sinks[..])),
        ] {
            let shape = AttnShape {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 64,
                window,
                scale: None,
                softcap,
                sinks,
            };
            let gen = |len: usize, seed: u32| -> Vec<f32> {
                (0..len)
                    .map(|i| {
                        (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 500.0
                            - 1.0
                    })
                    .collect()
            };
            let (q, k, v) = (gen(n * 256, 1), gen(total * 128, 2), gen(total * 128, 3));
            for dt in [DType::Q8_0, DType::Q4_0, DType::Q4_1] {
                let (kb, _) = blocks(dt, &k, 128);
                let (vb, vback) = blocks(dt, &v, 128);
                let (kr, vr) = (KvRows::Blocks(dt, &kb), KvRows::Blocks(dt, &vb));
                let mut batch = vec![0f32; n * 256];
                attention(&shape, &q, kr, vr, start, &mut batch);
                let mut steps = vec![0f32; n * 256];
                for (t, o) in steps.chunks_exact_mut(256).enumerate() {
                    attention(&shape, &q[t * 256..(t + 1) * 256], kr, vr, start + t, o);
                }
                assert_eq!(batch, steps, "{dt} {window:?}");
                // f32 keys, block values: only the value sums' rounding differs from f32.
                let mut mixed = vec![0f32; n * 256];
                attention(&shape, &q, KvRows::F32(&k), vr, start, &mut mixed);
                let mut float = vec![0f32; n * 256];
                attention(
                    &shape,
                    &q,
                    KvRows::F32(&k),
                    KvRows::F32(&vback),
                    start,
                    &mut float,
                );
                for (a, b) in mixed.iter().zip(&float) {
                    assert!((a - b).abs() < 1e-5, "{dt} {window:?}: {a} vs {b}");
                }
            }
        }
    }
}
