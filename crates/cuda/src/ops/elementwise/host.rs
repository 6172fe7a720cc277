//! The contracts of the elementwise kernels (elementwise.cu) on host memory, the activations of
//! common.cuh (`apply_act`) and the FFN's activation with FATReLU's threshold (`ffn_act` in
//! sparse_matvec.cu; the row kernels' host contracts use both).

use crate::layout::{Act, FfnAct};

/// `act(x)`, the formulas of common.cuh: ReLU `max(x, 0)`, SiLU `x / (1 + e^−x)`, GELU's tanh
/// approximation, the exact GELU `x (1 + erf(x / √2)) / 2`.
pub(crate) fn apply_act(act: Act, x: f32) -> f32 {
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
pub(crate) fn apply_ffn_act(a: FfnAct, x: f32) -> f32 {
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
