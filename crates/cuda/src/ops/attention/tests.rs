//! The family's kernels on the host backend against their contracts.

use half::f16;
use powerinfer_core::testing::pseudo_random;

use super::kv::KvElem;
use super::launch::{AttentionDecode, AttentionMerge, KvStore};
use crate::backend::Backend;
use crate::host::{HostBackend, HostBuf};
use crate::ops::testutil::*;

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
            KvStore {
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
            KvStore {
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
        // All positions, the last 3 (a window), and soft-capped scores; without sinks, and
        // with sinks below, near and above each head's scores.
        let cases = [(0, 0.0f32), (n_pos.saturating_sub(3), 0.0), (0, 0.5)];
        for ((first, cap), place) in cases.into_iter().flat_map(|c| SINKS.map(|p| (c, p))) {
            let capped = (cap > 0.0).then_some(cap as f64);
            let (kf, vf) = (|i: usize| kr[i] as f64, |i: usize| vr[i] as f64);
            let shape = (nkv, hd);
            let span = (first, n_pos, scale as f64, capped);
            let sinks = place.map(|p| sinks_at(p, &head_scores(&q, &kr, shape, span)));
            let want: Vec<f32> = attention_ref(
                &q,
                kf,
                vf,
                shape,
                first,
                n_pos,
                scale as f64,
                capped,
                sinks.as_deref(),
            )
            .iter()
            .map(|&w| w as f32)
            .collect();
            let d_sinks = sinks.as_deref().map(|s| upload(&be, s));
            let dq = upload(&be, &q);
            // One chunk (the output directly), and chunks of 4 positions merged.
            for chunk in [n_pos, 4] {
                let n_chunks = (n_pos - first).div_ceil(chunk);
                let mut out = be.zeros::<f32>(nh * hd).unwrap();
                let mut part = be.zeros::<f32>(nh * n_chunks * (hd + 2)).unwrap();
                launch(
                    &be,
                    AttentionDecode {
                        q: &dq,
                        caches: T::caches::<HostBackend>(&ck, &cv),
                        first,
                        n_pos,
                        n_heads: nh,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        scale,
                        softcap: cap,
                        sinks: d_sinks.as_ref(),
                        chunk,
                        part: &mut part,
                        out: &mut out,
                    },
                )
                .unwrap();
                if n_chunks > 1 {
                    let merge = AttentionMerge {
                        part: &part,
                        n_heads: nh,
                        head_dim: hd,
                        n_chunks,
                        sinks: d_sinks.as_ref(),
                        out: &mut out,
                    };
                    launch(&be, merge).unwrap();
                }
                let what = format!(
                    "{} {nh}/{nkv} x {hd} from {first} cap {cap}, sinks {place:?}, {n_chunks} \
                     chunks",
                    T::NAME
                );
                assert_close(&download(&be, &out), &want, 1e-5, &what);
            }
        }
    }
}

/// Where a test puts each head's sink logit against its scores.
#[derive(Clone, Copy, Debug)]
enum Sink {
    /// 20 below the head's lowest score (it weighs e^-20 of a score).
    Below,
    /// Within half a unit of the head's highest score.
    Near,
    /// 12 above the head's highest score (it takes nearly all the weight).
    Above,
}

/// No sinks, then each placement.
const SINKS: [Option<Sink>; 4] = [None, Some(Sink::Below), Some(Sink::Near), Some(Sink::Above)];

/// Each query head's (lowest, highest) score `(q·k)·scale` (capped as the span says) over
/// positions `first..n_pos` of the keys `k` (rows of `n_kv · hd`), in f64.
fn head_scores(
    q: &[f32],
    k: &[f32],
    (n_kv, hd): (usize, usize),
    (first, n_pos, scale, cap): (usize, usize, f64, Option<f64>),
) -> Vec<(f64, f64)> {
    let nh = q.len() / hd;
    (0..nh)
        .map(|h| {
            let g = h / (nh / n_kv);
            let s = (first..n_pos).map(|p| {
                let kp = &k[p * n_kv * hd + g * hd..][..hd];
                let s: f64 = q[h * hd..][..hd]
                    .iter()
                    .zip(kp)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * scale;
                cap.map_or(s, |c| c * (s / c).tanh())
            });
            s.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
        })
        .collect()
}

/// One sink logit per head placed against its score range as `place` says.
fn sinks_at(place: Sink, scores: &[(f64, f64)]) -> Vec<f32> {
    scores
        .iter()
        .enumerate()
        .map(|(h, &(lo, hi))| match place {
            Sink::Below => (lo - 20.0) as f32,
            Sink::Near => (hi + 0.25 * (h % 3) as f64 - 0.25) as f32,
            Sink::Above => (hi + 12.0) as f32,
        })
        .collect()
}

#[test]
fn sinks_change_the_softmax_where_they_weigh() {
    // The reference with sinks near or above the scores differs from the one without: the
    // attention test above checks a term that matters.
    let (nh, nkv, hd, n_pos) = (4, 2, 32, 9);
    let (k, v) = (
        pseudo_random(n_pos * nkv * hd, 3),
        pseudo_random(n_pos * nkv * hd, 4),
    );
    let q: Vec<f32> = pseudo_random(nh * hd, 5).iter().map(|x| 8.0 * x).collect();
    let (kf, vf) = (|i: usize| k[i] as f64, |i: usize| v[i] as f64);
    let scale = 1.0 / (hd as f64).sqrt();
    let plain = attention_ref(&q, kf, vf, (nkv, hd), 0, n_pos, scale, None, None);
    let scores = head_scores(&q, &k, (nkv, hd), (0, n_pos, scale, None));
    for (place, least) in [(Sink::Near, 0.05), (Sink::Above, 0.5)] {
        let s = sinks_at(place, &scores);
        let with = attention_ref(&q, kf, vf, (nkv, hd), 0, n_pos, scale, None, Some(&s));
        let diff = plain
            .iter()
            .zip(&with)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let top = plain.iter().map(|a| a.abs()).fold(0.0, f64::max);
        assert!(diff > least * top, "{place:?}: {diff} of {top}");
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
            AttentionDecode {
                q: &dq,
                caches: u16::caches::<HostBackend>(&ck, &cv),
                first,
                n_pos,
                n_heads,
                n_kv_heads,
                head_dim,
                scale: 0.125,
                softcap: 0.0,
                sinks: None,
                chunk: 64,
                part: &mut part,
                out: &mut out,
            },
        )
    };
    assert!(is_shape(att_from(4, 4, 4, 2, 64)), "an empty window");
    att_from(3, 4, 4, 2, 64).unwrap();
    let mut att =
        |n_pos, n_heads, n_kv_heads, head_dim| att_from(0, n_pos, n_heads, n_kv_heads, head_dim);
    att(4, 4, 2, 64).unwrap();
    assert!(is_shape(att(5, 4, 2, 64)), "positions past the cache");
    assert!(is_shape(att(0, 4, 2, 64)), "no position");
    assert!(is_shape(att(4, 3, 2, 64)), "heads not a multiple");
    assert!(is_shape(att(4, 4, 0, 64)), "no kv head");
    assert!(is_shape(att(4, 5, 1, 64)), "q too short");
    assert!(is_shape(att(1, 1, 1, 257)), "head_dim past the kernel's");
}
