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
        // All positions, the last 3 (a window), and soft-capped scores.
        for (first, cap) in [(0, 0.0f32), (n_pos.saturating_sub(3), 0.0), (0, 0.5)] {
            let capped = (cap > 0.0).then_some(cap as f64);
            let (kf, vf) = (|i: usize| kr[i] as f64, |i: usize| vr[i] as f64);
            let shape = (nkv, hd);
            let want: Vec<f32> =
                attention_ref(&q, kf, vf, shape, first, n_pos, scale as f64, capped)
                    .iter()
                    .map(|&w| w as f32)
                    .collect();
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
