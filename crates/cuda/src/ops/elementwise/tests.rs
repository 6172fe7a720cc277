//! The family's kernels on the host backend against their contracts.

use powerinfer_core::testing::pseudo_random;

use super::launch::{Pair, PairKernel, ValueKernel, WithValue};
use crate::host::HostBackend;
use crate::layout::{Act, FfnAct};
use crate::ops::testutil::*;

#[test]
fn activations_follow_common_cuh() {
    for x in [-3.0f32, -0.5, 0.0, 0.25, 2.0, 9.0] {
        for act in ACTS {
            let (got, want) = (super::host::apply_act(act, x), act_ref(act, x));
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{act:?}({x})"
            );
        }
    }
    assert_eq!(super::host::apply_act(Act::Relu, -0.0), 0.0);
    assert_eq!(super::host::apply_act(Act::Relu, f32::NAN), 0.0); // fmaxf
    assert!((super::host::apply_act(Act::Gelu, 1.0) - 0.841_192).abs() < 1e-5);
}

#[test]
fn fat_relu_keeps_values_above_its_threshold_only() {
    let fat = |relu_threshold, act| FfnAct {
        act,
        relu_threshold,
        up_act: false,
        swiglu_limit: 0.0,
    };
    let f = |a, x| super::host::apply_ffn_act(a, x);
    assert_eq!(f(fat(0.5, Act::Relu), 0.5), 0.0);
    assert_eq!(f(fat(0.5, Act::Relu), 0.75), 0.75);
    assert_eq!(f(fat(0.5, Act::Relu), -2.0), 0.0);
    assert_eq!(f(fat(0.0, Act::Relu), 0.25), 0.25);
    assert_eq!(
        f(fat(0.0, Act::Silu), 1.0),
        super::host::apply_act(Act::Silu, 1.0)
    );
}

#[test]
fn add_threshold_mask_softcap_and_copy() {
    let be = HostBackend::new();
    let n = 1001;
    let (g, u) = (pseudo_random(n + 2, 19), pseudo_random(n, 20));
    let dx = upload(&be, &u);
    // add and copy over n values (the rest of y kept); n past x is an error.
    for (op, m) in [(Pair::Add, n), (Pair::Copy, n - 1)] {
        let mut dy = upload(&be, &g);
        let y = &mut dy;
        launch(
            &be,
            PairKernel {
                op,
                y,
                x: &dx,
                n: m,
            },
        )
        .unwrap();
        let mut want: Vec<f32> = match op {
            Pair::Add => (0..m).map(|i| g[i] + u[i]).collect(),
            Pair::Copy => u[..m].to_vec(),
        };
        want.extend(&g[m..]);
        assert_eq!(download(&be, &dy), want, "{op:?}");
        let y = &mut dy;
        let r = launch(
            &be,
            PairKernel {
                op,
                y,
                x: &dx,
                n: n + 1,
            },
        );
        assert!(is_shape(r), "{op:?}");
    }

    let h = [0.5f32, -0.5, 0.1, -0.2, 0.0, 0.3, f32::NAN, 0.05];
    let mut dh = upload(&be, &h);
    let op = WithValue::ThresholdMask;
    launch(
        &be,
        ValueKernel {
            op,
            y: &mut dh,
            n: 7,
            v: 0.3,
        },
    )
    .unwrap();
    let got = download(&be, &dh);
    assert_eq!(got[..6], [0.5, -0.5, 0.0, 0.0, 0.0, 0.3]);
    assert!(got[6].is_nan());
    assert_eq!(got[7], 0.05, "past n");
    let r = launch(
        &be,
        ValueKernel {
            op,
            y: &mut dh,
            n: 9,
            v: 0.3,
        },
    );
    assert!(is_shape(r));

    // softcap over the first n values (x 40 so the cap of 30 bends them), the rest kept.
    let y: Vec<f32> = g.iter().map(|v| 40.0 * v).collect();
    let mut dy = upload(&be, &y);
    let (op, cap) = (WithValue::Softcap, 30.0f32);
    launch(
        &be,
        ValueKernel {
            op,
            y: &mut dy,
            n,
            v: cap,
        },
    )
    .unwrap();
    let mut want: Vec<f32> = (0..n)
        .map(|i| (cap as f64 * (y[i] as f64 / cap as f64).tanh()) as f32)
        .collect();
    want.extend(&y[n..]);
    assert_close(&download(&be, &dy), &want, 1e-6, "softcap");
    let r = launch(
        &be,
        ValueKernel {
            op,
            y: &mut dy,
            n: n + 3,
            v: cap,
        },
    );
    assert!(is_shape(r));

    // fill: n values, the rest kept.
    let before = download(&be, &dy);
    let op = WithValue::Fill;
    launch(
        &be,
        ValueKernel {
            op,
            y: &mut dy,
            n: 3,
            v: 0.25,
        },
    )
    .unwrap();
    let got = download(&be, &dy);
    assert_eq!(got[..3], [0.25; 3]);
    assert_eq!(got[3..], before[3..]);
}
