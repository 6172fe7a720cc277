//! The family's kernels on the host backend against their contracts.

use powerinfer_core::testing::pseudo_random;
use powerinfer_core::RopeFreqs;

use super::launch::{push_rope_angles, Norm, Rope, MAX_ROPE_PAIRS};
use crate::backend::Backend;
use crate::host::{HostBackend, HostBuf};
use crate::ops::testutil::*;

#[test]
fn rms_norm_normalises_each_row() {
    let be = HostBackend::new();
    let (rows, n, eps) = (3, 333, 1e-5f32);
    let (x, w) = (pseudo_random(rows * n, 1), pseudo_random(n, 2));
    let mut want = vec![0f32; rows * n];
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let ss: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
        let s = 1.0 / (ss / n as f64 + eps as f64).sqrt();
        for i in 0..n {
            want[r * n + i] = (row[i] as f64 * s * w[i] as f64) as f32;
        }
    }
    let (dx, dw) = (upload(&be, &x), upload(&be, &w));
    let mut out = be.zeros::<f32>(rows * n).unwrap();
    let rms = |x: &HostBuf<f32>, out: &mut HostBuf<f32>| {
        launch(
            &be,
            Norm {
                x,
                w: &dw,
                bias: None,
                rows,
                n,
                eps,
                out,
                xq: None,
            },
        )
    };
    rms(&dx, &mut out).unwrap();
    assert_close(&download(&be, &out), &want, 1e-6, "rms_norm");
    let short = upload(&be, &x[..rows * n - 1]);
    assert!(is_shape(rms(&short, &mut out)));
    let mut short = be.zeros::<f32>(n).unwrap();
    assert!(is_shape(rms(&dx, &mut short)));
}

#[test]
fn layer_norm_centres_and_scales_each_row() {
    let be = HostBackend::new();
    let (rows, n, eps) = (3, 301, 1e-5f32);
    // An offset row mean: a missing centring would show.
    let x: Vec<f32> = pseudo_random(rows * n, 3).iter().map(|v| v + 0.7).collect();
    let (w, b) = (pseudo_random(n, 4), pseudo_random(n, 5));
    let mut want = vec![0f32; rows * n];
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let m = row.iter().map(|v| *v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let v = (row[i] as f64 - m) / (var + eps as f64).sqrt();
            want[r * n + i] = (v * w[i] as f64 + b[i] as f64) as f32;
        }
    }
    let (dx, dw, db) = (upload(&be, &x), upload(&be, &w), upload(&be, &b));
    let mut out = be.zeros::<f32>(rows * n).unwrap();
    let ln = |x: &HostBuf<f32>, b: &HostBuf<f32>, out: &mut HostBuf<f32>| {
        launch(
            &be,
            Norm {
                x,
                w: &dw,
                bias: Some(b),
                rows,
                n,
                eps,
                out,
                xq: None,
            },
        )
    };
    ln(&dx, &db, &mut out).unwrap();
    assert_close(&download(&be, &out), &want, 1e-6, "layer_norm");
    let short = upload(&be, &b[..n - 1]);
    assert!(is_shape(ln(&dx, &short, &mut out)));
    let short = upload(&be, &x[..rows * n - 1]);
    assert!(is_shape(ln(&short, &db, &mut out)));
}

#[test]
fn rope_rotates_pairs_of_both_styles_with_f64_angles() {
    let be = HostBackend::new();
    // (head_dim, heads, pos, theta, rotated dims, step, magnitude): pair i's frequency divided
    // by 1 + step · i (Llama 3.1's factors grow along the pairs), cos and sin times the
    // magnitude (YaRN's and LongRoPE's attention factor).
    let cases = [
        (64, 5, 12_345, 10000.0f64, 64, 0.0, 1.0),
        (128, 3, 7, 500000.0, 128, 0.0, 1.0),
        (64, 2, 3_000, 10000.0, 64, 1.0, 1.3),
        (32, 3, 901, 10000.0, 16, 0.5, 0.8),
    ];
    for (hd, heads, pos, theta, rot, step, mscale) in cases {
        let inv: Vec<f64> = (0..rot / 2)
            .map(|i| theta.powf(-2.0 * i as f64 / rot as f64) / (1.0 + step * i as f64))
            .collect();
        let freqs = RopeFreqs {
            inv: inv.clone(),
            mscale,
        };
        for neox in [false, true] {
            let q = pseudo_random(hd * heads + 3, hd as u64);
            let mut want = q.clone();
            for head in want[..hd * heads].chunks_exact_mut(hd) {
                for (i, f) in inv.iter().enumerate() {
                    let a = pos as f64 * f;
                    let (s, c) = ((a.sin() * mscale) as f32, (a.cos() * mscale) as f32);
                    let (ia, ib) = if neox {
                        (i, i + rot / 2)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (head[ia], head[ib]);
                    head[ia] = x0 * c - x1 * s;
                    head[ib] = x0 * s + x1 * c;
                }
            }
            let mut dq = upload(&be, &q);
            launch(
                &be,
                Rope {
                    x: &mut dq,
                    n_heads: heads,
                    k: None,
                    k_heads: 0,
                    head_dim: hd,
                    pos,
                    freqs: &freqs,
                    neox,
                    x_norm: None,
                    k_norm: None,
                    eps: 0.0,
                },
            )
            .unwrap();
            let got = download(&be, &dq);
            assert_close(&got, &want, 1e-6, &format!("hd {hd} rot {rot} neox {neox}"));
            assert_eq!(got[hd * heads..], q[hd * heads..], "past the heads");
            if rot < hd {
                assert_eq!(got[rot..hd], q[rot..hd], "the unrotated part of a head");
            }
        }
    }
    // Position 0 is the identity; x too short, or more pairs than a head holds, is an error.
    let q = pseudo_random(64, 3);
    let mut dq = upload(&be, &q);
    let inv: Vec<f64> = (0..16).map(|i| 10000f64.powf(-(i as f64) / 16.0)).collect();
    let long = vec![1.0; 17];
    let mut rope = |n_heads, pos, freqs: &RopeFreqs| {
        launch(
            &be,
            Rope {
                x: &mut dq,
                n_heads,
                k: None,
                k_heads: 0,
                head_dim: 32,
                pos,
                freqs,
                neox: true,
                x_norm: None,
                k_norm: None,
                eps: 0.0,
            },
        )
    };
    let (inv, long) = (RopeFreqs::plain(inv), RopeFreqs::plain(long));
    rope(2, 0, &inv).unwrap();
    assert!(is_shape(rope(3, 1, &inv)));
    assert!(is_shape(rope(2, 1, &long)));
    assert_eq!(download(&be, &dq), q);
}

#[test]
fn the_kernel_takes_max_rope_pairs() {
    let define = format!("#define MAX_ROPE_PAIRS {MAX_ROPE_PAIRS}\n");
    assert!(super::launch::SOURCE.source.contains(&define));
}

#[test]
fn rope_angles_pack_cosines_then_sines_in_f64() {
    let mut a = crate::launch_spec::KernelArgs::default();
    push_rope_angles(&mut a, 3, &RopeFreqs::plain(vec![0.5, 2.0])).unwrap();
    assert_eq!(a.sizes(), [8 * MAX_ROPE_PAIRS]);
    let rb = a.bytes(0);
    let f = |at: usize| f32::from_le_bytes(rb[at..at + 4].try_into().unwrap());
    let sin_at = 4 * MAX_ROPE_PAIRS;
    assert_eq!(
        (f(4), f(sin_at + 4)),
        ((6.0f64).cos() as f32, (6.0f64).sin() as f32)
    );
    assert!(rb[8..sin_at].iter().all(|&b| b == 0));
    let over = RopeFreqs::plain(vec![0.0; MAX_ROPE_PAIRS + 1]);
    assert!(push_rope_angles(&mut a, 0, &over).is_err());
}
