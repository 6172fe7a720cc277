//! `kv_store` and `attention_decode` (attention.cu): the f16 KV cache (`[context, kv_dim]`,
//! position p's row at `p · kv_dim`) and one query's grouped-query attention over it.

use half::f16;
use powerinfer_core::Result;

use super::view::{prefix, prefix_mut, product, shape};
use crate::layout::MAX_HEAD_DIM;

/// Row `pos` of both caches = `k`, `v` (of kv_dim values) rounded to f16, nearest even.
pub(super) fn kv_store(
    k: &[f32],
    v: &[f32],
    pos: usize,
    cache_k: &mut [u16],
    cache_v: &mut [u16],
) -> Result<()> {
    let kv_dim = k.len();
    let at = product(pos, kv_dim, "pos × kv_dim")?;
    let end = at
        .checked_add(kv_dim)
        .ok_or_else(|| shape(format!("position {pos} overflows")))?;
    for (src, cache, what) in [(k, cache_k, "cache_k"), (v, cache_v, "cache_v")] {
        let row = &mut prefix_mut(cache, end, what)?[at..];
        for (o, &x) in row.iter_mut().zip(src) {
            *o = f16::from_f32(x).to_bits();
        }
    }
    Ok(())
}

/// The head shape of an attention launch: `n_heads` query heads over `n_kv_heads` KV heads of
/// `head_dim`, checked as the kernel needs it.
pub(super) struct Heads {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
}

impl Heads {
    /// Checked: query heads a whole multiple of the KV heads, `head_dim` in 1..=MAX_HEAD_DIM.
    pub(super) fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> Result<Heads> {
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

/// For each query head h (reading KV head `h / (n_heads / n_kv_heads)`):
/// `out[h] = Σ_p softmax_p(q[h]·scale · k[p]) · v[p]` over positions 0..n_pos of the f16
/// caches (the sums in f64). `q` and `out` hold n_heads · head_dim values; `n_pos` must be at
/// least 1 (the kernel's output would be 0/0).
pub(super) fn attention_decode(
    heads: &Heads,
    q: &[f32],
    [cache_k, cache_v]: [&[u16]; 2],
    n_pos: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    let Heads {
        n_heads,
        n_kv_heads,
        head_dim: hd,
    } = *heads;
    if n_pos == 0 {
        return Err(shape("attention over 0 positions".into()));
    }
    let kv_dim = n_kv_heads * hd;
    let need = product(n_pos, kv_dim, "n_pos × kv_dim")?;
    let cache_k = prefix(cache_k, need, "cache_k")?;
    let cache_v = prefix(cache_v, need, "cache_v")?;
    let group = n_heads / n_kv_heads;
    let decode = |bits: u16| f16::from_bits(bits).to_f32() as f64;
    let mut scores = vec![0f64; n_pos];
    let mut acc = vec![0f64; hd];
    for (h, (qh, oh)) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)).enumerate() {
        let kv = (h / group) * hd;
        let qs: Vec<f32> = qh.iter().map(|&v| v * scale).collect();
        for (p, s) in scores.iter_mut().enumerate() {
            let kp = &cache_k[p * kv_dim + kv..][..hd];
            *s = qs.iter().zip(kp).map(|(&a, &b)| a as f64 * decode(b)).sum();
        }
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        acc.fill(0.0);
        let mut denom = 0.0;
        for (p, &s) in scores.iter().enumerate() {
            let e = (s - m).exp();
            denom += e;
            let vp = &cache_v[p * kv_dim + kv..][..hd];
            for (a, &b) in acc.iter_mut().zip(vp) {
                *a += e * decode(b);
            }
        }
        for (o, &a) in oh.iter_mut().zip(&acc) {
            *o = (a / denom) as f32;
        }
    }
    Ok(())
}
