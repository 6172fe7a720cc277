//! The elementwise kernels (elementwise.cu) and the activations of common.cuh (`apply_act`).

use crate::layout::Act;

/// `act(x)`, the formulas of common.cuh: ReLU `max(x, 0)`, SiLU `x / (1 + e^−x)`, GELU's tanh
/// approximation.
pub(super) fn apply_act(act: Act, x: f32) -> f32 {
    match act {
        Act::None => x,
        Act::Relu => x.max(0.0),
        Act::Silu => x / (1.0 + (-x).exp()),
        Act::Gelu => {
            const C: f32 = 0.797_884_6; // sqrt(2/pi)
            0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
        }
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
