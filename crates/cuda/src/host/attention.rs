//! `kv_store` and `attention_decode` (attention.cu, and their `_f32` twins): the KV cache
//! (`[context, kv_dim]` of f16 or f32, position p's row at `p · kv_dim`) and one query's
//! grouped-query attention over it. One body for either element type ([`KvElem`]).

use powerinfer_core::Result;

use super::view::{prefix, prefix_mut, product, shape};
use crate::backend::KvElem;
use crate::layout::MAX_HEAD_DIM;

/// Row `pos` of both caches = `k`, `v` (of kv_dim values) as `T` stores them (f16: rounded to
/// nearest even).
pub(super) fn kv_store<T: KvElem>(
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

/// Where an attention launch writes: with one chunk (`chunk` ≥ the positions) the output, else
/// each chunk's partial state into `part` (`[n_heads][n_chunks][head_dim + 2]`: the
/// unnormalised output, the max score, the normaliser), as attention.cu does.
pub(super) struct Dst<'a> {
    pub chunk: usize,
    pub part: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// For each query head h (reading KV head `h / (n_heads / n_kv_heads)`) and each chunk of
/// `dst.chunk` positions of `positions` (first..n_pos): the chunk's scores
/// `s_p = (q[h]·scale) · k[p]`, soft-capped to `c · tanh(s_p / c)` when the cap `c` > 0, their
/// max m, normaliser `l = Σ_p e^(s_p − m)` and unnormalised output `Σ_p e^(s_p − m) · v[p]`
/// (the sums in f64); one chunk gives `out[h]` = output / l, more go to `dst.part` for
/// [`attention_merge`]. `q` and `out` hold n_heads · head_dim values; the range must hold at
/// least one position (the kernel's output would be 0/0).
pub(super) fn attention_decode<T: KvElem>(
    heads: &Heads,
    q: &[f32],
    [cache_k, cache_v]: [&[T]; 2],
    positions: std::ops::Range<usize>,
    [scale, softcap]: [f32; 2],
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
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            acc.fill(0.0);
            let mut denom = 0.0;
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
/// [`attention_decode`]) combined in chunk order: `out = Σ_c acc_c e^(m_c − M) / Σ_c l_c
/// e^(m_c − M)`, M the largest m_c (the sums in f64).
pub(super) fn attention_merge(
    part: &[f32],
    n_chunks: usize,
    head_dim: usize,
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
        let m = ph
            .chunks_exact(stride)
            .map(|pc| pc[head_dim] as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = ph
            .chunks_exact(stride)
            .map(|pc| (pc[head_dim] as f64 - m).exp())
            .collect();
        let denom: f64 = ph
            .chunks_exact(stride)
            .zip(&w)
            .map(|(pc, w)| pc[head_dim + 1] as f64 * w)
            .sum();
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

#[cfg(test)]
mod tests {
    use half::f16;
    use powerinfer_core::testing::pseudo_random;

    use super::super::testutil::*;
    use crate::backend::{Backend, KvElem, Launch};
    use crate::{HostBackend, HostBuf};

    /// Store `n_pos` positions of random keys and values (kv_dim each) in caches of `ctx` of
    /// `T`; returns the caches and the f32 values stored.
    fn fill<T: KvElem>(
        be: &HostBackend,
        kv_dim: usize,
        n_pos: usize,
        ctx: usize,
    ) -> (HostBuf<T>, HostBuf<T>, Vec<f32>, Vec<f32>) {
        let (k, v) = (
            pseudo_random(n_pos * kv_dim, 17),
            pseudo_random(n_pos * kv_dim, 18),
        );
        let mut ck = be.zeros::<T>(ctx * kv_dim).unwrap();
        let mut cv = be.zeros::<T>(ctx * kv_dim).unwrap();
        for p in 0..n_pos {
            let dk = upload(be, &k[p * kv_dim..(p + 1) * kv_dim]);
            let dv = upload(be, &v[p * kv_dim..(p + 1) * kv_dim]);
            launch(
                be,
                Launch::KvStore {
                    k: &dk,
                    v: &dv,
                    kv_dim,
                    pos: p,
                    caches: T::caches_mut::<HostBackend>(&mut ck, &mut cv),
                },
            )
            .unwrap();
        }
        (ck, cv, k, v)
    }

    #[test]
    fn kv_store_rounds_to_nearest_even_f16() {
        let be = HostBackend::new();
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even is 1 (0x3C00); 1 + 3·2^-11 ties
        // between 0x3C01 and 0x3C02: even is 0x3C02.
        let k = [
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            -2.5,
            70000.0,
        ];
        let v = [0.1f32, 1e-8, f32::INFINITY, -0.0];
        let (dk, dv) = (upload(&be, &k), upload(&be, &v));
        let mut ck = be.zeros::<u16>(12).unwrap();
        let mut cv = be.zeros::<u16>(12).unwrap();
        let store = |pos, ck: &mut HostBuf<u16>, cv: &mut HostBuf<u16>| {
            launch(
                &be,
                Launch::KvStore {
                    k: &dk,
                    v: &dv,
                    kv_dim: 4,
                    pos,
                    caches: u16::caches_mut::<HostBackend>(ck, cv),
                },
            )
        };
        store(1, &mut ck, &mut cv).unwrap();
        let ck_host = download(&be, &ck);
        assert_eq!(ck_host[..4], [0; 4]);
        assert_eq!(ck_host[4..6], [0x3C00, 0x3C02]);
        assert_eq!(ck_host[6], f16::from_f32(-2.5).to_bits());
        assert_eq!(ck_host[7], f16::INFINITY.to_bits()); // overflow
        let cv_host = download(&be, &cv);
        let want: Vec<u16> = v.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        assert_eq!(cv_host[4..8], want[..]);
        assert!(
            is_shape(store(3, &mut ck, &mut cv)),
            "position past the cache"
        );
        let mut short = be.zeros::<u16>(7).unwrap();
        assert!(is_shape(store(1, &mut ck, &mut short)));
    }

    #[test]
    fn kv_store_f32_keeps_every_value() {
        let be = HostBackend::new();
        let (ck, cv, k, v) = fill::<f32>(&be, 5, 3, 4);
        let (ck, cv) = (download(&be, &ck), download(&be, &cv));
        assert_eq!(ck[..15], k[..]);
        assert_eq!(cv[..15], v[..]);
        assert_eq!(ck[15..], [0.0; 5]);
    }

    #[test]
    fn attention_decode_is_grouped_query_softmax_over_the_window() {
        attention_decode_at::<u16>();
        attention_decode_at::<f32>();
    }

    /// Against an f64 reference reading the keys and values as caches of `T` hold them.
    fn attention_decode_at<T: KvElem>() {
        let be = HostBackend::new();
        for (nh, nkv, hd, n_pos) in [
            (6, 2, 64, 37),
            (4, 4, 128, 9),
            (8, 1, 256, 5),
            (3, 3, 80, 1),
        ] {
            let kv_dim = nkv * hd;
            let (ck, cv, k, v) = fill::<T>(&be, kv_dim, n_pos, n_pos + 3);
            let q: Vec<f32> = pseudo_random(nh * hd, hd as u64)
                .iter()
                .map(|v| 8.0 * v)
                .collect();
            let scale = 1.0 / (hd as f32).sqrt();
            // The reference reads the same (for f16: rounded) keys and values.
            let round =
                |v: &[f32]| -> Vec<f32> { v.iter().map(|x| T::from_f32(*x).to_f32()).collect() };
            let (kr, vr) = (round(&k), round(&v));
            // All positions, the last 3 (a window), and soft-capped scores.
            for (first, cap) in [(0, 0.0f32), (n_pos.saturating_sub(3), 0.0), (0, 0.5)] {
                let mut want = vec![0f32; nh * hd];
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let s: Vec<f64> = (first..n_pos)
                        .map(|p| {
                            let s = (0..hd)
                                .map(|i| {
                                    q[h * hd + i] as f64 * kr[p * kv_dim + kvh * hd + i] as f64
                                })
                                .sum::<f64>()
                                * scale as f64;
                            if cap > 0.0 {
                                cap as f64 * (s / cap as f64).tanh()
                            } else {
                                s
                            }
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for i in 0..hd {
                        want[h * hd + i] = (first..n_pos)
                            .zip(&s)
                            .map(|(p, s)| (s - m).exp() / z * vr[p * kv_dim + kvh * hd + i] as f64)
                            .sum::<f64>() as f32;
                    }
                }
                let dq = upload(&be, &q);
                // One chunk (the output directly), and chunks of 4 positions merged.
                for chunk in [n_pos, 4] {
                    let n_chunks = (n_pos - first).div_ceil(chunk);
                    let mut out = be.zeros::<f32>(nh * hd).unwrap();
                    let mut part = be.zeros::<f32>(nh * n_chunks * (hd + 2)).unwrap();
                    launch(
                        &be,
                        Launch::AttentionDecode {
                            q: &dq,
                            caches: T::caches::<HostBackend>(&ck, &cv),
                            first,
                            n_pos,
                            n_heads: nh,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            scale,
                            softcap: cap,
                            chunk,
                            part: &mut part,
                            out: &mut out,
                        },
                    )
                    .unwrap();
                    if n_chunks > 1 {
                        let merge = Launch::AttentionMerge {
                            part: &part,
                            n_heads: nh,
                            head_dim: hd,
                            n_chunks,
                            out: &mut out,
                        };
                        launch(&be, merge).unwrap();
                    }
                    let what = format!(
                        "{} {nh}/{nkv} x {hd} from {first} cap {cap}, {n_chunks} chunks",
                        T::NAME
                    );
                    assert_close(&download(&be, &out), &want, 1e-5, &what);
                }
            }
        }
    }

    #[test]
    fn bad_attention_shapes_are_errors() {
        let be = HostBackend::new();
        let (ck, cv, _, _) = fill::<u16>(&be, 2 * 64, 4, 4);
        let dq = upload(&be, &pseudo_random(4 * 64, 1));
        let mut out = be.zeros::<f32>(4 * 64).unwrap();
        let mut part = be.zeros::<f32>(0).unwrap();
        let mut att_from = |first, n_pos, n_heads, n_kv_heads, head_dim| {
            launch(
                &be,
                Launch::AttentionDecode {
                    q: &dq,
                    caches: u16::caches::<HostBackend>(&ck, &cv),
                    first,
                    n_pos,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    scale: 0.125,
                    softcap: 0.0,
                    chunk: 64,
                    part: &mut part,
                    out: &mut out,
                },
            )
        };
        assert!(is_shape(att_from(4, 4, 4, 2, 64)), "an empty window");
        att_from(3, 4, 4, 2, 64).unwrap();
        let mut att = |n_pos, n_heads, n_kv_heads, head_dim| {
            att_from(0, n_pos, n_heads, n_kv_heads, head_dim)
        };
        att(4, 4, 2, 64).unwrap();
        assert!(is_shape(att(5, 4, 2, 64)), "positions past the cache");
        assert!(is_shape(att(0, 4, 2, 64)), "no position");
        assert!(is_shape(att(4, 3, 2, 64)), "heads not a multiple");
        assert!(is_shape(att(4, 4, 0, 64)), "no kv head");
        assert!(is_shape(att(4, 5, 1, 64)), "q too short");
        assert!(is_shape(att(1, 1, 1, 257)), "head_dim past the kernel's");
    }
}
