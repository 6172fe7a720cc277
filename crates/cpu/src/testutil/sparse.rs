//! Test helpers of the sparse ops: random active sets, one FFN's worth of random weights
//! ([`Case`]), and the error bounds the ops must meet against their f64 references.

use super::{random_weight, Rng, DOT_ABS_TOL, DOT_REL_TOL};
use crate::ops::sparse::{axpy_rows_at, matvec_rows_at};
use crate::reference::{self, abs_dot_row, dequantize_row};
use crate::simd::Level;
use powerinfer_core::{Activation, DType, Weight};

/// The activations the FFN checks run through.
pub(crate) const ACTS: [Activation; 3] = [Activation::Relu, Activation::Silu, Activation::Gelu];

/// A duplicate-free random subset of 0..rows (each row kept with probability `p`), shuffled.
pub(crate) fn subset(rng: &mut Rng, rows: usize, p: f32) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..rows as u32)
        .filter(|_| rng.uniform(0.0, 1.0) < p)
        .collect();
    for i in (1..idx.len()).rev() {
        idx.swap(i, rng.next_u64() as usize % (i + 1));
    }
    idx
}

/// Row `i` of `w` decoded to f64.
pub(crate) fn row_f64(w: &Weight, i: u32) -> Vec<f64> {
    let rb = w.dtype.row_bytes(w.cols).unwrap();
    let mut out = vec![0f32; w.cols];
    dequantize_row(w.dtype, &w.bytes()[i as usize * rb..][..rb], &mut out).unwrap();
    out.into_iter().map(f64::from).collect()
}

/// Σ|x·W[i]|: the scale of one row's dot product error.
pub(crate) fn abs_dot(w: &Weight, i: u32, x: &[f32]) -> f64 {
    let rb = w.dtype.row_bytes(w.cols).unwrap();
    abs_dot_row(w.dtype, &w.bytes()[i as usize * rb..][..rb], x)
}

/// Panic unless |got − want| <= DOT_REL_TOL · scale + DOT_ABS_TOL in every element.
pub(crate) fn assert_close(got: &[f32], want: &[f32], scale: &[f64], what: &str) {
    assert_close_plus(got, want, scale, &vec![0.0; got.len()], what);
}

/// [`assert_close`] with a further `slack` per element (a kernel's own rounding bound).
pub(crate) fn assert_close_plus(
    got: &[f32],
    want: &[f32],
    scale: &[f64],
    slack: &[f64],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}");
    let items = got.iter().zip(want).zip(scale).zip(slack).enumerate();
    for (c, (((&g, &w), &s), &extra)) in items {
        let err = (g as f64 - w as f64).abs();
        let tol = DOT_REL_TOL * s + DOT_ABS_TOL + extra;
        assert!(
            err <= tol,
            "{what} [{c}]: got {g}, want {w}, err {err:e} > {tol:e}"
        );
    }
}

/// Per column, Σ_k coef[k] · |down[idx[k], c]|.
pub(crate) fn down_scale(down: &Weight, idx: &[u32], coef: &[f64]) -> Vec<f64> {
    let mut scale = vec![0f64; down.cols];
    for (&i, &ck) in idx.iter().zip(coef) {
        for (s, v) in scale.iter_mut().zip(row_f64(down, i)) {
            *s += ck * v.abs();
        }
    }
    scale
}

/// Per column j, the bound on the AVX2 4-bit accumulation's coefficient rounding (zero for
/// other levels and formats): each row's coefficient c_i = a_i·d_ib is rounded to s_b/2 with
/// s_b <= max_i |c_i| / 127 over the rows of its group, and multiplies q_ij − 8, so the error
/// is at most Σ_i (M_b / 254)·|q_ij − 8| with M_b the largest |coef[i]·d_ib| of all rows
/// (`coef[i]` bounds |a_i|); plus f32 rounding (relative 1e-5) of the per-block terms the
/// kernel adds and cancels, Σ_i |a_i|·(16·|d_ib| + |m_ib|).
pub(crate) fn rounding_slack(level: Level, down: &Weight, idx: &[u32], coef: &[f64]) -> Vec<f64> {
    let mut slack = vec![0f64; down.cols];
    let qs = match (level, down.dtype) {
        (Level::Avx2 | Level::Avx512, DType::Q4_0) => 2,
        (Level::Avx2 | Level::Avx512, DType::Q4_1) => 4,
        _ => return slack,
    };
    let bb = down.dtype.block_bytes();
    let block = |i: u32, b: usize| &down.row(i as usize)[b * bb..(b + 1) * bb];
    for b in 0..down.cols / 32 {
        let half_at = |i: u32, at: usize| {
            let raw = block(i, b);
            half::f16::from_le_bytes([raw[at], raw[at + 1]])
                .to_f64()
                .abs()
        };
        let d = |i: u32| half_at(i, 0);
        let min = |i: u32| if qs == 4 { half_at(i, 2) } else { 0.0 };
        let m = idx
            .iter()
            .zip(coef)
            .map(|(&i, &c)| c * d(i))
            .fold(0f64, f64::max);
        let terms: f64 = idx
            .iter()
            .zip(coef)
            .map(|(&i, &c)| c * (16.0 * d(i) + min(i)))
            .sum();
        for (r, sj) in slack[32 * b..32 * b + 32].iter_mut().enumerate() {
            *sj += 1e-5 * terms;
            for &i in idx {
                let byte = block(i, b)[qs + r % 16];
                let q = if r < 16 { byte & 0x0F } else { byte >> 4 };
                *sj += m / 254.0 * (q as f64 - 8.0).abs();
            }
        }
    }
    slack
}

/// One model-sized FFN's worth of random weights and inputs.
pub(crate) struct Case {
    pub(crate) gate: Weight,
    pub(crate) up: Weight,
    pub(crate) down: Weight,
    pub(crate) x: Vec<f32>,
    pub(crate) idx: Vec<u32>,
    pub(crate) g: Vec<f32>,
    pub(crate) y0: Vec<f32>,
}

impl Case {
    pub(crate) fn new(rng: &mut Rng, dtypes: [DType; 3], rows: usize, cols: usize, p: f32) -> Case {
        let idx = subset(rng, rows, p);
        let mut g = rng.vec(idx.len());
        if let Some(first) = g.first_mut() {
            *first = 0.0; // a zero coefficient is skipped
        }
        Case {
            gate: random_weight(rng, dtypes[0], rows, cols),
            up: random_weight(rng, dtypes[1], rows, cols),
            down: random_weight(rng, dtypes[2], rows, cols),
            x: rng.vec(cols),
            idx,
            g,
            y0: rng.vec(cols),
        }
    }

    /// Every kernel on `level` against its reference.
    pub(crate) fn check(&self, level: Level, what: &str) {
        let (idx, x, g) = (&self.idx, &self.x, &self.g);
        // matvec_rows on each of the three weights.
        for w in [&self.gate, &self.up, &self.down] {
            let mut got = vec![f32::NAN; idx.len()];
            matvec_rows_at(level, w, x, idx, &mut got).unwrap();
            // Against the x the level computes with (the int8 x̂ for quantized rows on x86).
            let seen = super::x_seen(level, w.dtype, x);
            let mut want = vec![0f32; idx.len()];
            reference::sparse::matvec_rows(w, &seen, idx, &mut want).unwrap();
            let scale: Vec<f64> = idx.iter().map(|&i| abs_dot(w, i, &seen)).collect();
            assert_close(
                &got,
                &want,
                &scale,
                &format!("{what} matvec_rows {}", w.dtype),
            );
        }
        // axpy_rows onto a non-zero y.
        let mut got = self.y0.clone();
        axpy_rows_at(level, &self.down, idx, g, &mut got).unwrap();
        let mut want = self.y0.clone();
        reference::sparse::axpy_rows(&self.down, idx, g, &mut want).unwrap();
        let coef: Vec<f64> = g.iter().map(|v| v.abs() as f64).collect();
        let mut scale = down_scale(&self.down, idx, &coef);
        scale
            .iter_mut()
            .zip(&self.y0)
            .for_each(|(s, y)| *s += y.abs() as f64);
        let slack = rounding_slack(level, &self.down, idx, &coef);
        assert_close_plus(&got, &want, &scale, &slack, &format!("{what} axpy_rows"));
        // A predictor-mode FFN from the ops (gate and up rows, h = act(gate)·up, the down_t
        // rows), every activation.
        for act in ACTS {
            let (gw, uw, dw) = (&self.gate, &self.up, &self.down);
            let got = sparse_ffn(level, [gw, uw, dw], act, x, idx);
            let (xg, xu) = (
                super::x_seen(level, gw.dtype, x),
                super::x_seen(level, uw.dtype, x),
            );
            let want = ffn_on_seen_x(level, [gw, uw, dw], act, x, idx);
            // An activation's slope is at most ~1.13 (GELU), so the gate's dot error reaches h
            // scaled by at most that; the up error by |act(gate)|.
            let coef: Vec<f64> = idx
                .iter()
                .map(|&i| {
                    let gd = crate::reference::dot_row_f64(gw.dtype, gw.row(i as usize), &xg);
                    let gk = act.apply(gd as f32).abs() as f64;
                    (gk + 1.2 * abs_dot(gw, i, &xg)) * abs_dot(uw, i, &xu)
                })
                .collect();
            let scale = down_scale(dw, idx, &coef);
            let slack = rounding_slack(level, dw, idx, &coef);
            let what = format!("{what} sparse ffn {act:?}");
            assert_close_plus(&got, &want, &scale, &slack, &what);
        }
    }
}

/// [`reference::sparse::ffn_gate_up_down_sparse`] with each of gate and up dotted with the x it
/// is computed with on `level` ([`super::x_seen`]): in f64.
fn ffn_on_seen_x(
    level: Level,
    [gate, up, down_t]: [&Weight; 3],
    act: Activation,
    x: &[f32],
    idx: &[u32],
) -> Vec<f32> {
    let (xg, xu) = (
        super::x_seen(level, gate.dtype, x),
        super::x_seen(level, up.dtype, x),
    );
    let mut acc = vec![0f64; down_t.cols];
    for &i in idx {
        let gk = act.apply(reference::dot_row_f64(gate.dtype, gate.row(i as usize), &xg) as f32);
        if gk == 0.0 {
            continue;
        }
        let h = gk as f64 * reference::dot_row_f64(up.dtype, up.row(i as usize), &xu);
        for (a, v) in acc.iter_mut().zip(row_f64(down_t, i)) {
            *a += h * v;
        }
    }
    acc.iter().map(|&v| v as f32).collect()
}

/// Columns valid for `dtype`: odd for the float formats, whole blocks for the quantized ones.
pub(crate) fn cols_for(dtype: DType, units: usize) -> usize {
    if dtype.is_quantized() {
        super::qcols(dtype, 32 * units)
    } else {
        3 * units + 2
    }
}

/// y = Σ_k act(dot(gate[i], x)) · dot(up[i], x) · down_t[i] over i = idx[k], from the ops on
/// `level` (as the engine's predictor mode runs it): what
/// [`reference::sparse::ffn_gate_up_down_sparse`] computes.
pub(crate) fn sparse_ffn(
    level: Level,
    [gate, up, down_t]: [&Weight; 3],
    act: Activation,
    x: &[f32],
    idx: &[u32],
) -> Vec<f32> {
    let mut g = vec![0f32; idx.len()];
    let mut u = vec![0f32; idx.len()];
    matvec_rows_at(level, gate, x, idx, &mut g).unwrap();
    matvec_rows_at(level, up, x, idx, &mut u).unwrap();
    let h: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&gk, &uk)| act.apply(gk) * uk)
        .collect();
    let mut y = vec![0f32; x.len()];
    axpy_rows_at(level, down_t, idx, &h, &mut y).unwrap();
    y
}
