//! The sparse kernels against their f64 references on every SIMD level, dtype and odd shape,
//! with unsorted, empty and full active sets, on pools of several sizes.

use super::*;
use crate::reference::{abs_dot_row, dequantize_row};
use crate::simd::available;
use crate::testutil::{random_weight, Rng, DOT_ABS_TOL, DOT_REL_TOL};
use powerinfer_core::{Buffer, Error};

const ACTS: [Activation; 3] = [Activation::Relu, Activation::Silu, Activation::Gelu];

/// A duplicate-free random subset of 0..rows (each row kept with probability `p`), shuffled.
fn subset(rng: &mut Rng, rows: usize, p: f32) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..rows as u32)
        .filter(|_| rng.uniform(0.0, 1.0) < p)
        .collect();
    for i in (1..idx.len()).rev() {
        idx.swap(i, rng.next_u64() as usize % (i + 1));
    }
    idx
}

/// Row `i` of `w` decoded to f64.
fn row_f64(w: &Weight, i: u32) -> Vec<f64> {
    let rb = w.dtype.row_bytes(w.cols).unwrap();
    let mut out = vec![0f32; w.cols];
    dequantize_row(w.dtype, &w.bytes()[i as usize * rb..][..rb], &mut out).unwrap();
    out.into_iter().map(f64::from).collect()
}

/// Σ|x·W[i]|: the scale of one row's dot product error.
fn abs_dot(w: &Weight, i: u32, x: &[f32]) -> f64 {
    let rb = w.dtype.row_bytes(w.cols).unwrap();
    abs_dot_row(w.dtype, &w.bytes()[i as usize * rb..][..rb], x)
}

/// Panic unless |got − want| <= DOT_REL_TOL · scale + DOT_ABS_TOL in every element.
fn assert_close(got: &[f32], want: &[f32], scale: &[f64], what: &str) {
    assert_close_plus(got, want, scale, &vec![0.0; got.len()], what);
}

/// [`assert_close`] with a further `slack` per element (a kernel's own rounding bound).
fn assert_close_plus(got: &[f32], want: &[f32], scale: &[f64], slack: &[f64], what: &str) {
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
fn down_scale(down: &Weight, idx: &[u32], coef: &[f64]) -> Vec<f64> {
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
fn rounding_slack(level: Level, down: &Weight, idx: &[u32], coef: &[f64]) -> Vec<f64> {
    let mut slack = vec![0f64; down.cols];
    let qs = match (level, down.dtype) {
        (Level::Avx2, DType::Q4_0) => 2,
        (Level::Avx2, DType::Q4_1) => 4,
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
struct Case {
    gate: Weight,
    up: Weight,
    down: Weight,
    x: Vec<f32>,
    idx: Vec<u32>,
    g: Vec<f32>,
    y0: Vec<f32>,
}

impl Case {
    fn new(rng: &mut Rng, dtypes: [DType; 3], rows: usize, cols: usize, p: f32) -> Case {
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
    fn check(&self, level: Level, what: &str) {
        let (idx, x, g) = (&self.idx, &self.x, &self.g);
        // matvec_rows on each of the three weights.
        for w in [&self.gate, &self.up, &self.down] {
            let mut got = vec![f32::NAN; idx.len()];
            matvec_rows_at(level, w, x, idx, &mut got).unwrap();
            let mut want = vec![0f32; idx.len()];
            reference::matvec_rows(w, x, idx, &mut want).unwrap();
            let scale: Vec<f64> = idx.iter().map(|&i| abs_dot(w, i, x)).collect();
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
        reference::axpy_rows(&self.down, idx, g, &mut want).unwrap();
        let coef: Vec<f64> = g.iter().map(|v| v.abs() as f64).collect();
        let mut scale = down_scale(&self.down, idx, &coef);
        scale
            .iter_mut()
            .zip(&self.y0)
            .for_each(|(s, y)| *s += y.abs() as f64);
        let slack = rounding_slack(level, &self.down, idx, &coef);
        assert_close_plus(&got, &want, &scale, &slack, &format!("{what} axpy_rows"));
        // Fused up/down with given gate values (y overwritten).
        let mut got = self.y0.clone();
        ffn_up_down_at(level, &self.up, &self.down, x, idx, g, &mut got).unwrap();
        let mut want = vec![0f32; x.len()];
        reference::ffn_up_down_sparse(&self.up, &self.down, x, idx, g, &mut want).unwrap();
        let coef: Vec<f64> = (idx.iter().zip(g))
            .map(|(&i, &gk)| gk.abs() as f64 * abs_dot(&self.up, i, x))
            .collect();
        let scale = down_scale(&self.down, idx, &coef);
        let slack = rounding_slack(level, &self.down, idx, &coef);
        assert_close_plus(&got, &want, &scale, &slack, &format!("{what} ffn_up_down"));
        // Fused gate/up/down, every activation.
        for act in ACTS {
            let mut got = self.y0.clone();
            let (gw, uw, dw) = (&self.gate, &self.up, &self.down);
            ffn_gate_up_down_at(level, gw, uw, dw, act, x, idx, &mut got).unwrap();
            let mut want = vec![0f32; x.len()];
            reference::ffn_gate_up_down_sparse(gw, uw, dw, act, x, idx, &mut want).unwrap();
            // An activation's slope is at most ~1.13 (GELU), so the gate's dot error reaches h
            // scaled by at most that; the up error by |act(gate)|.
            let coef: Vec<f64> = idx
                .iter()
                .map(|&i| {
                    let gd = crate::reference::dot_row_f64(gw.dtype, gw.row(i as usize), x);
                    let gk = act.apply(gd as f32).abs() as f64;
                    (gk + 1.2 * abs_dot(gw, i, x)) * abs_dot(uw, i, x)
                })
                .collect();
            let scale = down_scale(dw, idx, &coef);
            let slack = rounding_slack(level, dw, idx, &coef);
            let what = format!("{what} ffn_gate_up_down {act:?}");
            assert_close_plus(&got, &want, &scale, &slack, &what);
        }
    }
}

/// Columns valid for `dtype`: odd for the float formats, whole blocks for the quantized ones.
fn cols_for(dtype: DType, units: usize) -> usize {
    if dtype.is_quantized() {
        32 * units
    } else {
        3 * units + 2
    }
}

#[test]
fn every_dtype_matches_reference_on_odd_shapes() {
    let mut rng = Rng::new(11);
    for level in available() {
        for dtype in DType::ALL {
            for &(rows, units, p) in &[(1, 1, 1.0), (13, 3, 0.5), (37, 7, 0.3), (101, 16, 0.1)] {
                let cols = cols_for(dtype, units);
                let case = Case::new(&mut rng, [dtype; 3], rows, cols, p);
                case.check(level, &format!("{level:?} {dtype} {rows}x{cols}"));
            }
        }
    }
}

#[test]
fn mixed_formats_empty_and_full_sets() {
    let mut rng = Rng::new(12);
    let dtypes = [DType::Q4_1, DType::Q8_0, DType::F16];
    for level in available() {
        for p in [0.0, 1.0] {
            let case = Case::new(&mut rng, dtypes, 70, 96, p);
            assert_eq!(case.idx.len(), if p == 0.0 { 0 } else { 70 });
            case.check(level, &format!("{level:?} p={p}"));
        }
    }
    // An empty set leaves axpy's y alone and zeroes the fused kernels' y.
    let case = Case::new(&mut rng, dtypes, 5, 32, 0.0);
    let mut y = vec![3.0f32; 32];
    axpy_rows(&case.down, &[], &[], &mut y).unwrap();
    assert!(y.iter().all(|&v| v == 3.0));
    ffn_up_down_sparse(&case.up, &case.down, &case.x, &[], &[], &mut y).unwrap();
    assert!(y.iter().all(|&v| v == 0.0));
}

#[test]
fn many_threads_match_reference_and_are_deterministic() {
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .unwrap()
    };
    let (seven, one) = (pool(7), pool(1));
    let mut rng = Rng::new(13);
    for dtype in DType::ALL {
        // Enough active bytes (> 14 · MIN_TASK_BYTES per matrix) for many tasks and partials.
        let (rows, cols) = (4001, if dtype.is_quantized() { 1024 } else { 515 });
        let case = Case::new(&mut rng, [dtype; 3], rows, cols, 0.6);
        seven.install(|| case.check(simd::level(), &format!("7 threads {dtype}")));
        let run = |pool: &rayon::ThreadPool| {
            let mut y = case.y0.clone();
            let (up, down) = (&case.up, &case.down);
            pool.install(|| {
                axpy_rows(down, &case.idx, &case.g, &mut y).unwrap();
                let mut f = vec![0f32; cols];
                ffn_up_down_sparse(up, down, &case.x, &case.idx, &case.g, &mut f).unwrap();
                let mut m = vec![0f32; case.idx.len()];
                matvec_rows(up, &case.x, &case.idx, &mut m).unwrap();
                (y, f, m)
            })
        };
        let first = run(&seven);
        assert_eq!(first, run(&seven), "{dtype}: same pool, same bits");
        // matvec_rows never changes a row's arithmetic with the thread count.
        assert_eq!(first.2, run(&one).2, "{dtype}");
    }
}

#[test]
fn non_finite_inputs_propagate() {
    let mut rng = Rng::new(14);
    for dtype in DType::ALL {
        let case = Case::new(&mut rng, [dtype; 3], 9, 64, 1.0);
        let mut x = case.x.clone();
        x[5] = f32::NAN;
        let mut y = vec![0f32; case.idx.len()];
        matvec_rows(&case.up, &x, &case.idx, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
        let mut f = vec![0f32; 64];
        ffn_up_down_sparse(&case.up, &case.down, &x, &case.idx, &case.g, &mut f).unwrap();
        assert!(f.iter().all(|v| v.is_nan()), "{dtype}: {f:?}");
    }
}

#[test]
fn shape_and_index_errors_are_errors() {
    let w = Weight::from_f32(3, 4, &[0.5; 12]).unwrap();
    let x = [1.0f32; 4];
    let is_shape = |r: Result<()>| matches!(r, Err(Error::Shape(_)));
    // matvec_rows
    assert!(is_shape(matvec_rows(&w, &x, &[3], &mut [0.0])));
    assert!(is_shape(matvec_rows(&w, &x, &[u32::MAX], &mut [0.0])));
    assert!(is_shape(matvec_rows(&w, &x[..3], &[0], &mut [0.0])));
    assert!(is_shape(matvec_rows(&w, &x, &[0, 1], &mut [0.0])));
    // axpy_rows
    assert!(is_shape(axpy_rows(&w, &[3], &[1.0], &mut [0.0; 4])));
    assert!(is_shape(axpy_rows(&w, &[0], &[1.0, 2.0], &mut [0.0; 4])));
    assert!(is_shape(axpy_rows(&w, &[0], &[1.0], &mut [0.0; 3])));
    // fused
    let mut y = [0.0f32; 4];
    let short = Weight::from_f32(2, 4, &[0.5; 8]).unwrap();
    let narrow = Weight::from_f32(3, 2, &[0.5; 6]).unwrap();
    assert!(is_shape(ffn_up_down_sparse(
        &w,
        &w,
        &x,
        &[3],
        &[1.0],
        &mut y
    )));
    assert!(is_shape(ffn_up_down_sparse(&w, &w, &x, &[0], &[], &mut y)));
    assert!(is_shape(ffn_up_down_sparse(
        &w,
        &short,
        &x,
        &[0],
        &[1.0],
        &mut y
    )));
    assert!(is_shape(ffn_up_down_sparse(
        &w,
        &narrow,
        &x,
        &[0],
        &[1.0],
        &mut y
    )));
    assert!(is_shape(ffn_up_down_sparse(
        &w,
        &w,
        &x,
        &[0],
        &[1.0],
        &mut y[..3]
    )));
    let relu = Activation::Relu;
    assert!(is_shape(ffn_gate_up_down_sparse(
        &w,
        &w,
        &w,
        relu,
        &x,
        &[7],
        &mut y
    )));
    assert!(is_shape(ffn_gate_up_down_sparse(
        &short,
        &w,
        &w,
        relu,
        &x,
        &[0],
        &mut y
    )));
    assert!(is_shape(ffn_gate_up_down_sparse(
        &w,
        &w,
        &w,
        relu,
        &x[..2],
        &[0],
        &mut y
    )));
    // A weight whose fields lie about its size.
    let mut bad = w.clone();
    bad.data = Buffer::from_bytes(&[0u8; 8]);
    assert!(is_shape(matvec_rows(&bad, &x, &[0], &mut [0.0])));
    assert!(is_shape(axpy_rows(&bad, &[0], &[1.0], &mut [0.0; 4])));
    // The references reject the same inputs.
    assert!(is_shape(reference::matvec_rows(&w, &x, &[3], &mut [0.0])));
    assert!(is_shape(reference::axpy_rows(
        &w,
        &[9],
        &[1.0],
        &mut [0.0; 4]
    )));
    assert!(is_shape(reference::ffn_up_down_sparse(
        &w,
        &w,
        &x,
        &[3],
        &[1.0],
        &mut y
    )));
    assert!(is_shape(reference::ffn_gate_up_down_sparse(
        &w,
        &w,
        &w,
        relu,
        &x,
        &[3],
        &mut y
    )));
    // Zero-sized shapes are fine.
    let empty = Weight::from_f32(0, 4, &[]).unwrap();
    matvec_rows(&empty, &x, &[], &mut []).unwrap();
    let no_cols = Weight::from_f32(3, 0, &[]).unwrap();
    axpy_rows(&no_cols, &[0, 2], &[1.0, 2.0], &mut []).unwrap();
    ffn_gate_up_down_sparse(&no_cols, &no_cols, &no_cols, relu, &[], &[1], &mut []).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

    /// Any dtypes, shape, density and seed: every level's kernels meet the bound.
    #[test]
    fn prop_sparse_kernels_match_reference(
        dtype_index in [0usize..6, 0usize..6, 0usize..6],
        rows in 1usize..80,
        units in 1usize..24,
        p in 0.0f32..1.0,
        seed in proptest::prelude::any::<u64>(),
    ) {
        let dtypes = dtype_index.map(|i| DType::ALL[i]);
        // Quantized anywhere: whole blocks; otherwise odd column counts too.
        let cols = match dtypes.iter().any(|d| d.is_quantized()) {
            true => 32 * units,
            false => 3 * units + 2,
        };
        let mut rng = Rng::new(seed);
        let case = Case::new(&mut rng, dtypes, rows, cols, p);
        for level in available() {
            case.check(level, &format!("prop {level:?} {dtypes:?} {rows}x{cols}"));
        }
    }
}
