//! The elementwise kernels (elementwise.cu) and the activations of common.cuh (`apply_act`).

use crate::layout::Act;

/// `act(x)`, the formulas of common.cuh: ReLU `max(x, 0)`, SiLU `x / (1 + e^−x)`, GELU's tanh
/// approximation, the exact GELU `x (1 + erf(x / √2)) / 2`.
pub(super) fn apply_act(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => x.max(0.0),
        Act::Silu => x / (1.0 + (-x).exp()),
        Act::Gelu => {
            const C: f32 = 0.797_884_6; // sqrt(2/pi)
            0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
        }
        Act::GeluErf => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
    }
}

/// `g[i] = act(g[i]) · u[i]`.
pub(super) fn act_mul(g: &mut [f32], u: &[f32], act: Act) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = apply_act(act, *g) * u;
    }
}

/// `y[i] += x[i]`.
pub(super) fn add(y: &mut [f32], x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += x;
    }
}

/// `h[i] = 0` where `|h[i]| < t`.
pub(super) fn threshold_mask(h: &mut [f32], t: f32) {
    for v in h {
        if v.abs() < t {
            *v = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use powerinfer_core::testing::pseudo_random;

    use super::super::testutil::*;
    use crate::backend::Launch;
    use crate::layout::Act;
    use crate::HostBackend;

    #[test]
    fn activations_follow_common_cuh() {
        for x in [-3.0f32, -0.5, 0.0, 0.25, 2.0, 9.0] {
            for act in ACTS {
                let (got, want) = (super::apply_act(act, x), act_ref(act, x));
                assert!(
                    (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{act:?}({x})"
                );
            }
        }
        assert_eq!(super::apply_act(Act::Relu, -0.0), 0.0);
        assert_eq!(super::apply_act(Act::Relu, f32::NAN), 0.0); // fmaxf
        assert!((super::apply_act(Act::Gelu, 1.0) - 0.841_192).abs() < 1e-5);
    }

    #[test]
    fn act_mul_add_and_threshold_mask() {
        let be = HostBackend::new();
        let n = 1001;
        let (g, u) = (pseudo_random(n + 2, 19), pseudo_random(n, 20));
        for act in ACTS {
            let mut dg = upload(&be, &g);
            let du = upload(&be, &u);
            launch(
                &be,
                Launch::ActMul {
                    g: &mut dg,
                    u: &du,
                    n,
                    act,
                },
            )
            .unwrap();
            let mut want: Vec<f32> = (0..n).map(|i| act_ref(act, g[i]) * u[i]).collect();
            want.extend(&g[n..]);
            assert_close(&download(&be, &dg), &want, 1e-6, &format!("{act:?}"));
            let r = launch(
                &be,
                Launch::ActMul {
                    g: &mut dg,
                    u: &du,
                    n: n + 1,
                    act,
                },
            );
            assert!(is_shape(r));
        }

        let mut dy = upload(&be, &g);
        let dx = upload(&be, &u);
        launch(
            &be,
            Launch::Add {
                y: &mut dy,
                x: &dx,
                n,
            },
        )
        .unwrap();
        let mut want: Vec<f32> = (0..n).map(|i| g[i] + u[i]).collect();
        want.extend(&g[n..]);
        assert_eq!(download(&be, &dy), want);
        let r = launch(
            &be,
            Launch::Add {
                y: &mut dy,
                x: &dx,
                n: n + 1,
            },
        );
        assert!(is_shape(r));

        let h = [0.5f32, -0.5, 0.1, -0.2, 0.0, 0.3, f32::NAN, 0.05];
        let mut dh = upload(&be, &h);
        launch(
            &be,
            Launch::ThresholdMask {
                h: &mut dh,
                n: 7,
                t: 0.3,
            },
        )
        .unwrap();
        let got = download(&be, &dh);
        assert_eq!(got[..6], [0.5, -0.5, 0.0, 0.0, 0.0, 0.3]);
        assert!(got[6].is_nan());
        assert_eq!(got[7], 0.05, "past n");
        let r = launch(
            &be,
            Launch::ThresholdMask {
                h: &mut dh,
                n: 9,
                t: 0.3,
            },
        );
        assert!(is_shape(r));
    }
}
