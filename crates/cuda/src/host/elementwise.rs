//! The elementwise kernels (elementwise.cu), the activations of common.cuh (`apply_act`) and
//! the FFN's activation with FATReLU's threshold (`ffn_act` in sparse_matvec.cu).

use crate::layout::{Act, FfnAct};

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

/// `a.act(x)`, with FATReLU's threshold `t > 0` under ReLU: `x` where `x > t`, else 0 (the CPU
/// engine's `FfnKind::apply`).
pub(super) fn apply_ffn_act(a: FfnAct, x: f32) -> f32 {
    match a.act {
        Act::Relu if a.relu_threshold > 0.0 => {
            if x > a.relu_threshold {
                x
            } else {
                0.0
            }
        }
        act => apply_act(act, x),
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

/// `y[i] = cap · tanh(y[i] / cap)`.
pub(super) fn softcap(y: &mut [f32], cap: f32) {
    for v in y {
        *v = cap * (*v / cap).tanh();
    }
}

/// A mixture of experts' routing weights over its flattened neurons (`expert_flags`,
/// `expert_scale`): neuron `id < routed` belongs to expert `id / expert_ffn`, the rest to the
/// shared expert (`n_expert`), whose weight is `w[n_expert]`.
pub(super) struct Experts<'a> {
    w: &'a [f32],
    expert_ffn: usize,
    routed: usize,
    n_expert: usize,
}

impl<'a> Experts<'a> {
    pub(super) fn new(
        w: &'a [f32],
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
    ) -> powerinfer_core::Result<Experts<'a>> {
        powerinfer_core::ensure!(
            expert_ffn > 0 && w.len() > n_expert && routed <= n_expert * expert_ffn,
            Shape,
            "experts: {} weights for {n_expert} experts of {expert_ffn} ({routed} routed neurons)",
            w.len()
        );
        Ok(Experts {
            w,
            expert_ffn,
            routed,
            n_expert,
        })
    }

    /// The weight of neuron `id`'s expert.
    pub(super) fn weight(&self, id: i32) -> powerinfer_core::Result<f32> {
        let id = usize::try_from(id).map_err(|_| {
            powerinfer_core::Error::Shape(format!("experts: neuron id {id} is negative"))
        })?;
        let e = match id < self.routed {
            true => id / self.expert_ffn,
            false => self.n_expert,
        };
        Ok(self.w[e])
    }
}

#[cfg(test)]
mod tests {
    use powerinfer_core::testing::pseudo_random;

    use super::super::testutil::*;
    use crate::backend::Launch;
    use crate::layout::{Act, FfnAct};
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
    fn fat_relu_keeps_values_above_its_threshold_only() {
        let fat = |relu_threshold, act| FfnAct {
            act,
            relu_threshold,
            up_act: false,
        };
        let f = |a, x| super::apply_ffn_act(a, x);
        assert_eq!(f(fat(0.5, Act::Relu), 0.5), 0.0);
        assert_eq!(f(fat(0.5, Act::Relu), 0.75), 0.75);
        assert_eq!(f(fat(0.5, Act::Relu), -2.0), 0.0);
        assert_eq!(f(fat(0.0, Act::Relu), 0.25), 0.25);
        assert_eq!(
            f(fat(0.0, Act::Silu), 1.0),
            super::apply_act(Act::Silu, 1.0)
        );
    }

    #[test]
    fn add_threshold_mask_softcap_and_copy() {
        let be = HostBackend::new();
        let n = 1001;
        let (g, u) = (pseudo_random(n + 2, 19), pseudo_random(n, 20));
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

        // softcap over the first n values (x 40 so the cap of 30 bends them), the rest kept.
        let y: Vec<f32> = g.iter().map(|v| 40.0 * v).collect();
        let mut dy = upload(&be, &y);
        let (y_ref, cap) = (&y, 30.0f32);
        launch(&be, Launch::Softcap { y: &mut dy, n, cap }).unwrap();
        let mut want: Vec<f32> = (0..n)
            .map(|i| (cap as f64 * (y_ref[i] as f64 / cap as f64).tanh()) as f32)
            .collect();
        want.extend(&y[n..]);
        assert_close(&download(&be, &dy), &want, 1e-6, "softcap");
        let r = launch(
            &be,
            Launch::Softcap {
                y: &mut dy,
                n: n + 3,
                cap,
            },
        );
        assert!(is_shape(r));

        // copy: n values, the rest of dst kept; a short src is an error.
        let mut dst = upload(&be, &g);
        launch(
            &be,
            Launch::Copy {
                dst: &mut dst,
                src: &dx,
                n: n - 1,
            },
        )
        .unwrap();
        let mut want = u[..n - 1].to_vec();
        want.extend(&g[n - 1..]);
        assert_eq!(download(&be, &dst), want);
        let r = launch(
            &be,
            Launch::Copy {
                dst: &mut dst,
                src: &dx,
                n: n + 1,
            },
        );
        assert!(is_shape(r));
    }
}
