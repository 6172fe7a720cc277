//! The contracts of `kv_store` and `attention_decode` (attention.cu, and their `_f32` twins) on
//! host memory: the KV cache (`[context, kv_dim]` of f16 or f32, position p's row at
//! `p · kv_dim`) and one query's grouped-query attention over it. One body for either element type ([`KvElem`]).

use powerinfer_core::Result;

use super::kv::KvElem;
use crate::host::view::{prefix, prefix_mut, product, shape};
use crate::layout::MAX_HEAD_DIM;

/// Row `pos` of both caches = `k`, `v` (of kv_dim values) as `T` stores them (f16: rounded to
/// nearest even).
pub(crate) fn kv_store<T: KvElem>(
    k: &[f32],
    v: &[f32],
    pos: usize,
    cache_k: &mut [T],
    cache_v: &mut [T],
) -> Result<()> {
    let kv_dim = k.len();
    let at = product(pos, kv_dim, "pos × kv_dim")?;
    let end = at
        .checked_add(kv_dim)
        .ok_or_else(|| shape(format!("position {pos} overflows")))?;
    for (src, cache, what) in [(k, cache_k, "cache_k"), (v, cache_v, "cache_v")] {
        let row = &mut prefix_mut(cache, end, what)?[at..];
        for (o, &x) in row.iter_mut().zip(src) {
            *o = T::from_f32(x);
        }
    }
    Ok(())
}

/// The head shape of an attention launch: `n_heads` query heads over `n_kv_heads` KV heads of
/// `head_dim`, checked as the kernel needs it.
pub(crate) struct Heads {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl Heads {
    /// Checked: query heads a whole multiple of the KV heads, `head_dim` in 1..=MAX_HEAD_DIM.
    pub(crate) fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Result<Heads> {
        if n_kv_heads == 0 || n_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(shape(format!(
                "{n_heads} query heads are no whole multiple of {n_kv_heads} KV heads"
            )));
        }
        if head_dim == 0 || head_dim > MAX_HEAD_DIM {
            return Err(shape(format!(
                "head_dim {head_dim} outside 1..={MAX_HEAD_DIM}"
            )));
        }
        Ok(Heads {
            n_heads,
            n_kv_heads,
            head_dim,
        })
    }
}

/// Where an attention launch writes: with one chunk (`chunk` ≥ the positions) the output, else
/// each chunk's partial state into `part` (`[n_heads][n_chunks][head_dim + 2]`: the
/// unnormalised output, the max score, the normaliser), as attention.cu does.
pub(crate) struct Dst<'a> {
    pub chunk: usize,
    pub part: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// For each query head h (reading KV head `h / (n_heads / n_kv_heads)`) and each chunk of
/// `dst.chunk` positions of `positions` (first..n_pos): the chunk's scores
/// `s_p = (q[h]·scale) · k[p]`, soft-capped to `c · tanh(s_p / c)` when the cap `c` > 0, their
/// max m, normaliser `l = Σ_p e^(s_p − m)` and unnormalised output `Σ_p e^(s_p − m) · v[p]`
/// (the sums in f64); one chunk gives `out[h]` = output / l, more go to `dst.part` for
/// [`attention_merge`]. With `sinks` (one logit per query head, gpt-oss) and one chunk, head
/// h's sink joins the max and the normaliser (`m = max(m, sink)`, `l += e^(sink − m)`); more
/// chunks leave it to the merge. `q` and `out` hold n_heads · head_dim values; the range must
/// hold at least one position (the kernel's output would be 0/0).
pub(crate) fn attention_decode<T: KvElem>(
    heads: &Heads,
    q: &[f32],
    [cache_k, cache_v]: [&[T]; 2],
    positions: std::ops::Range<usize>,
    [scale, softcap]: [f32; 2],
    sinks: Option<&[f32]>,
    dst: Dst<'_>,
) -> Result<()> {
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim: hd,
    } = *heads;
    if positions.is_empty() {
        return Err(shape(format!("attention over no position ({positions:?})")));
    }
    if dst.chunk == 0 {
        return Err(shape("attention in chunks of 0 positions".to_string()));
    }
    let n_chunks = positions.len().div_ceil(dst.chunk);
    let stride = hd + 2;
    let part = if n_chunks > 1 {
        let need = product(
            n_heads * n_chunks,
            stride,
            "n_heads × chunks × (head_dim + 2)",
        )?;
        Some(prefix_mut(dst.part, need, "part")?)
    } else {
        None
    };
    let kv_dim = n_kv_heads * hd;
    let need = product(positions.end, kv_dim, "n_pos × kv_dim")?;
    let cache_k = prefix(cache_k, need, "cache_k")?;
    let cache_v = prefix(cache_v, need, "cache_v")?;
    let group = n_heads / n_kv_heads;
    let decode = |x: T| x.to_f32() as f64;
    let cap = softcap as f64;
    let mut acc = vec![0f64; hd];
    let mut part = part;
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        let kv = (h / group) * hd;
        let qs: Vec<f32> = qh.iter().map(|&v| v * scale).collect();
        for c in 0..n_chunks {
            let from = positions.start + c * dst.chunk;
            let range = from..(from + dst.chunk).min(positions.end);
            let scores: Vec<f64> = range
                .clone()
                .map(|p| {
                    let kp = &cache_k[p * kv_dim + kv..][..hd];
                    let s: f64 = qs.iter().zip(kp).map(|(&a, &b)| a as f64 * decode(b)).sum();
                    if cap > 0.0 {
                        cap * (s / cap).tanh()
                    } else {
                        s
                    }
                })
                .collect();
            // With one chunk the head's sink joins here (more: in the merge).
            let sink = sinks.filter(|_| n_chunks == 1).map(|s| s[h] as f64);
            let m = scores
                .iter()
                .copied()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            acc.fill(0.0);
            let mut denom = sink.map_or(0.0, |s| (s - m).exp());
            for (p, &s) in range.zip(&scores) {
                let e = (s - m).exp();
                denom += e;
                let vp = &cache_v[p * kv_dim + kv..][..hd];
                for (a, &b) in acc.iter_mut().zip(vp) {
                    *a += e * decode(b);
                }
            }
            match part.as_deref_mut() {
                None => {
                    for (o, &a) in dst.out[h * hd..][..hd].iter_mut().zip(&acc) {
                        *o = (a / denom) as f32;
                    }
                }
                Some(part) => {
                    let pc = &mut part[(h * n_chunks + c) * stride..][..stride];
                    for (o, &a) in pc.iter_mut().zip(&acc) {
                        *o = a as f32;
                    }
                    pc[hd] = m as f32;
                    pc[hd + 1] = denom as f32;
                }
            }
        }
    }
    Ok(())
}

/// `attention_merge`: for each head, the `n_chunks` partial states of `part` (see
/// [`attention_decode`]) combined in chunk order: `out = Σ_c acc_c e^(m_c − M) /
/// (e^(sink − M) + Σ_c l_c e^(m_c − M))`, M the largest of the m_c and the head's sink
/// (`sinks`; none: no such term), the sums in f64.
pub(crate) fn attention_merge(
    part: &[f32],
    n_chunks: usize,
    head_dim: usize,
    sinks: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let stride = head_dim + 2;
    let n_heads = out.len() / head_dim.max(1);
    let need = product(
        n_heads * n_chunks,
        stride,
        "n_heads × chunks × (head_dim + 2)",
    )?;
    let part = prefix(part, need, "part")?;
    if n_chunks == 0 {
        return Err(shape("attention_merge over no chunk".to_string()));
    }
    for (h, oh) in out.chunks_exact_mut(head_dim).enumerate() {
        let ph = &part[h * n_chunks * stride..][..n_chunks * stride];
        let sink = sinks.map(|s| s[h] as f64);
        let m = ph
            .chunks_exact(stride)
            .map(|pc| pc[head_dim] as f64)
            .chain(sink)
            .fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = ph
            .chunks_exact(stride)
            .map(|pc| (pc[head_dim] as f64 - m).exp())
            .collect();
        let denom: f64 = sink.map_or(0.0, |s| (s - m).exp())
            + ph.chunks_exact(stride)
                .zip(&w)
                .map(|(pc, w)| pc[head_dim + 1] as f64 * w)
                .sum::<f64>();
        for (d, o) in oh.iter_mut().enumerate() {
            let a: f64 = ph
                .chunks_exact(stride)
                .zip(&w)
                .map(|(pc, w)| pc[d] as f64 * w)
                .sum();
            *o = (a / denom) as f32;
        }
    }
    Ok(())
}
