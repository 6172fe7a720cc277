//! One decode token's sparse FFN in a single parallel region ([`sparse_ffn`]): each task takes
//! a contiguous share of the gate rows (all of them, or a listed subset), computes their gate
//! values, keeps the neurons that fire, reads those neurons' up rows, and adds their down_t rows
//! into its own partial sum; the partials are added in task order at the end.
//!
//! The separate ops ([`super::sparse::matvec_rows`] over up, then
//! [`super::sparse::axpy_rows`] over down_t) cost a fork-join each, and each pass is short: at
//! 10% of ffn 5504 an up pass reads 0.6 MB of Q4_0 rows, 30 µs on 2 threads, of which the
//! fork-join and the ramp at the start of every task are a large part. Fused, a token's FFN is
//! one fork-join per layer, and each thread goes from its gate rows straight on to its own
//! neurons' scattered rows while the other thread may still stream gate rows, so the memory
//! system stays busy through the whole FFN. Within a task the passes stay separate (gate rows,
//! then up rows, then down_t rows), each streaming one matrix's rows with the next ones in
//! flight, as the separate ops do.
//!
//! The result depends only on the inputs and the thread count (the tasks are cut by position
//! in the gate row list, and the partials are added in a fixed order).

use super::sparse::{listed_axpy, listed_dot};
use super::split::accumulate_many;
use crate::check::{self, Rows};
use crate::dispatch::{Activations, GROUP};
use crate::simd::{self, Level};
use powerinfer_core::{ensure, Result, Weight};
use std::cell::Cell;

/// Which gate rows a [`sparse_ffn`] computes.
#[derive(Clone, Copy, Debug)]
pub enum GateRows<'a> {
    /// Every row (exact-relu: the gate values alone decide which neurons fire).
    All,
    /// These rows, in this order (predictor mode: the neurons predicted active).
    Listed(&'a [u32]),
}

/// The matrices of a gated FFN as the sparse decode reads them: `gate` and `up` as
/// [ffn rows, dim cols], and the down projection transposed, `down_t` [ffn rows, dim cols].
#[derive(Clone, Copy, Debug)]
pub struct SparseFfn<'a> {
    pub gate: &'a Weight,
    /// None for a gate-less FFN (OPT, Falcon), where a neuron's coefficient is its activation.
    pub up: Option<&'a Weight>,
    pub down_t: &'a Weight,
}

/// Buffers of one task, reused across calls on a thread.
#[derive(Default)]
struct TaskScratch {
    gate: Vec<f32>,
    idx: Vec<u32>,
    vals: Vec<f32>,
    up: Vec<f32>,
}

thread_local! {
    static SCRATCH: Cell<TaskScratch> = Cell::new(TaskScratch::default());
}

/// y = Σ_i c_i · down_t[i] over the gate rows i of `rows` whose activation
/// a_i = `fire(i, dot(gate[i], x))` is not 0, where c_i = `combine(a_i, dot(up[i], x))` (or
/// c_i = a_i without an up matrix). `y` (dim) is overwritten; returns how many neurons fired.
///
/// `fire` applies the activation (and any bias or threshold) and must return exactly 0.0 for a
/// neuron that does not fire: its up and down_t rows are then never read. Quantized rows are
/// dotted against x quantized once; the caller's activation decides.
pub fn sparse_ffn<F, C>(
    ffn: &SparseFfn<'_>,
    x: &[f32],
    rows: GateRows<'_>,
    fire: F,
    combine: C,
    y: &mut [f32],
) -> Result<usize>
where
    F: Fn(u32, f32) -> f32 + Sync,
    C: Fn(f32, f32) -> f32 + Sync,
{
    let part = SparsePart { ffn: *ffn, rows };
    let fire = |_: usize, i: u32, g: f32| fire(i, g);
    sparse_ffn_many_at(simd::level(), &[part], x, fire, combine, &mut [y])
}

/// One FFN of a [`sparse_ffn_many`] call (a routed expert): its matrices and gate rows.
#[derive(Clone, Copy, Debug)]
pub struct SparsePart<'a> {
    pub ffn: SparseFfn<'a>,
    pub rows: GateRows<'a>,
}

/// [`sparse_ffn`] of several FFNs over the same `x` in one parallel region: `ys[p]` gets part
/// `p`'s output, bit for bit what a [`sparse_ffn`] call of its own gives (each part is cut into
/// tasks as it alone would be; the tasks of all parts share one fork-join and x is prepared
/// once). `fire(p, i, g)` sees the part. Returns how many neurons fired in all.
pub fn sparse_ffn_many<F, C>(
    parts: &[SparsePart<'_>],
    x: &[f32],
    fire: F,
    combine: C,
    ys: &mut [&mut [f32]],
) -> Result<usize>
where
    F: Fn(usize, u32, f32) -> f32 + Sync,
    C: Fn(f32, f32) -> f32 + Sync,
{
    sparse_ffn_many_at(simd::level(), parts, x, fire, combine, ys)
}

/// A part's rows, checked: its gate (listed rows), up and down_t.
struct PartRows<'a> {
    gate: Rows<'a>,
    up: Option<Rows<'a>>,
    down: Rows<'a>,
}

/// The checks of one part against `x` and its `y`.
fn check_part<'a>(part: &SparsePart<'a>, x: &[f32], y: &[f32]) -> Result<PartRows<'a>> {
    const OP: &str = "sparse_ffn";
    let SparseFfn { gate, up, down_t } = part.ffn;
    let neurons = gate.rows;
    check::len(OP, "x", x.len(), gate.cols, "the gate's cols")?;
    check::len(OP, "y", y.len(), down_t.cols, "down_t's cols")?;
    for (name, w) in [("up", up), ("down_t", Some(down_t))] {
        if let Some(w) = w {
            ensure!(
                w.rows == neurons && (name == "down_t" || w.cols == gate.cols),
                Shape,
                "{OP}: {name} is {} x {}, the gate {neurons} x {}",
                w.rows,
                w.cols,
                gate.cols
            );
        }
    }
    let listed: &[u32] = match part.rows {
        GateRows::All => &[],
        GateRows::Listed(ids) => ids,
    };
    Ok(PartRows {
        gate: Rows::new(gate, listed, OP)?,
        // Every neuron below `neurons` is in range of the other matrices (checked above).
        up: up.map(|w| Rows::new(w, &[], OP)).transpose()?,
        down: Rows::new(down_t, &[], OP)?,
    })
}

/// [`sparse_ffn_many`] on a given SIMD level.
pub(crate) fn sparse_ffn_many_at<F, C>(
    level: Level,
    parts: &[SparsePart<'_>],
    x: &[f32],
    fire: F,
    combine: C,
    ys: &mut [&mut [f32]],
) -> Result<usize>
where
    F: Fn(usize, u32, f32) -> f32 + Sync,
    C: Fn(f32, f32) -> f32 + Sync,
{
    check::len("sparse_ffn", "ys", ys.len(), parts.len(), "one per part")?;
    let rows: Vec<PartRows<'_>> = parts
        .iter()
        .zip(ys.iter())
        .map(|(p, y)| check_part(p, x, y))
        .collect::<Result<_>>()?;
    ys.iter_mut().for_each(|y| y.fill(0.0));
    let n = |p: &SparsePart<'_>| match p.rows {
        GateRows::All => p.ffn.gate.rows,
        GateRows::Listed(ids) => ids.len(),
    };
    let probs: Vec<(usize, usize)> = parts
        .iter()
        .zip(&rows)
        .map(|(p, r)| (n(p), r.gate.bytes))
        .collect();
    let quantized = parts.iter().any(|p| {
        p.ffn.gate.dtype.is_quantized() || p.ffn.up.is_some_and(|w| w.dtype.is_quantized())
    });
    let xs = Activations::new(level, x, quantized);
    let fired = std::sync::atomic::AtomicUsize::new(0);
    accumulate_many(&probs, GROUP, ys, |p, range, part| {
        let SparsePart { ffn, rows: which } = parts[p];
        let (gate, r) = (ffn.gate, &rows[p]);
        let mut s = SCRATCH.take();
        let len = range.len();
        s.gate.resize(len, 0.0);
        // Gate values of this task's rows.
        let ids: &[u32] = match which {
            GateRows::All => {
                let bytes = &gate.bytes()[range.start * r.gate.bytes..][..len * r.gate.bytes];
                xs.rows_dot(gate.dtype, bytes, r.gate.bytes, &mut s.gate);
                &[]
            }
            GateRows::Listed(ids) => {
                let ids = &ids[range.clone()];
                listed_dot(&xs, gate.dtype, &r.gate, ids, &mut s.gate);
                ids
            }
        };
        // The neurons that fire, branch-free (which ones follow no predictable pattern).
        s.idx.resize(len, 0);
        s.vals.resize(len, 0.0);
        let mut k = 0;
        for (j, &g) in s.gate.iter().enumerate() {
            let i = match which {
                GateRows::All => (range.start + j) as u32,
                GateRows::Listed(_) => ids[j],
            };
            let a = fire(p, i, g);
            s.idx[k] = i;
            s.vals[k] = a;
            k += usize::from(a != 0.0);
        }
        s.idx.truncate(k);
        s.vals.truncate(k);
        // Their up rows, then their down_t rows into this task's partial sum.
        if let (Some(w), Some(up_rows)) = (ffn.up, &r.up) {
            s.up.resize(k, 0.0);
            listed_dot(&xs, w.dtype, up_rows, &s.idx, &mut s.up);
            s.vals
                .iter_mut()
                .zip(&s.up)
                .for_each(|(a, &u)| *a = combine(*a, u));
        }
        listed_axpy(level, ffn.down_t.dtype, &r.down, &s.idx, &s.vals, part);
        fired.fetch_add(k, std::sync::atomic::Ordering::Relaxed);
        SCRATCH.set(s);
    });
    Ok(fired.into_inner())
}

#[cfg(test)]
mod tests {
    //! The fused FFN against the f64 reference and against the separate ops, on every SIMD
    //! level and format, with all and listed gate rows, gate-less FFNs and bad shapes.

    use super::*;
    use crate::reference;
    use crate::simd::available;
    use crate::testutil::sparse::{
        abs_dot, assert_close_plus, cols_for, down_scale, rounding_slack, subset, ACTS,
    };
    use crate::testutil::{is_shape, qcols, random_weight, x_seen, Rng};
    use powerinfer_core::{Activation, DType};

    /// The f64 reference of what `sparse_ffn` computes with ReLU-style `fire` (activation
    /// `act`, firing when not 0) and combine = a·u, over the gate rows `ids`; with the
    /// per-column error scale and the kernels' rounding slack.
    fn reference_ffn(
        level: Level,
        ffn: &SparseFfn<'_>,
        act: Activation,
        x: &[f32],
        ids: &[u32],
    ) -> (Vec<f32>, Vec<f64>, Vec<f64>) {
        let (gate, down) = (ffn.gate, ffn.down_t);
        let mut fired = vec![];
        let mut coef = vec![];
        let mut want = vec![0f32; down.cols];
        let mut h = vec![];
        // Each product against the x it is computed with (x̂ for quantized rows on x86).
        let xg = x_seen(level, gate.dtype, x);
        for &i in ids {
            let g = reference::dot_row_f64(gate.dtype, gate.row(i as usize), &xg);
            let a = act.apply(g as f32);
            if a == 0.0 {
                continue;
            }
            // The f64 up value and its error scale (1 without an up matrix).
            let (u, su) = match ffn.up {
                Some(w) => {
                    let xu = x_seen(level, w.dtype, x);
                    (
                        reference::dot_row_f64(w.dtype, w.row(i as usize), &xu),
                        abs_dot(w, i, &xu),
                    )
                }
                None => (1.0, 1.0),
            };
            fired.push(i);
            h.push((a as f64 * u) as f32);
            // An activation's slope is at most ~1.13 (GELU): the gate's dot error reaches h
            // scaled by at most that, times |u|; the up error by |a|.
            coef.push((a.abs() as f64 + 1.2 * abs_dot(gate, i, &xg)) * su);
        }
        reference::sparse::axpy_rows(down, &fired, &h, &mut want).unwrap();
        let scale = down_scale(down, &fired, &coef);
        let slack = rounding_slack(level, down, &fired, &coef);
        (want, scale, slack)
    }

    /// Gate, up and down_t of `rows` neurons over `cols`.
    fn case(rng: &mut Rng, dtypes: [DType; 3], rows: usize, cols: usize) -> [Weight; 3] {
        dtypes.map(|d| random_weight(rng, d, rows, cols))
    }

    /// `sparse_ffn` on `level` with ReLU-style firing for every activation against
    /// [`reference_ffn`], over the gate rows `rows` of `ws` (up read when `gated`).
    fn check_one(level: Level, ws: &[Weight; 3], gated: bool, rows: GateRows<'_>, x: &[f32]) {
        let ffn = SparseFfn {
            gate: &ws[0],
            up: gated.then_some(&ws[1]),
            down_t: &ws[2],
        };
        let all: Vec<u32> = (0..ws[0].rows as u32).collect();
        let ids = match rows {
            GateRows::All => &all[..],
            GateRows::Listed(ids) => ids,
        };
        let xg = x_seen(level, ws[0].dtype, x);
        for act in ACTS {
            // Fire where the f64 gate value is clear of zero by its own rounding bound, so the
            // kernel's and the reference's decisions agree.
            let margin = |i: u32| 2e-4 * abs_dot(&ws[0], i, &xg) + 1e-6;
            let g64 = |i: u32| reference::dot_row_f64(ws[0].dtype, ws[0].row(i as usize), &xg);
            let clear: Vec<u32> = ids
                .iter()
                .copied()
                .filter(|&i| g64(i).abs() > margin(i))
                .collect();
            let keep: Vec<bool> = {
                let mut k = vec![false; ws[0].rows];
                clear.iter().for_each(|&i| k[i as usize] = true);
                k
            };
            let fire = |i: u32, g: f32| if keep[i as usize] { act.apply(g) } else { 0.0 };
            let mut got = vec![f32::NAN; x.len()];
            let part = SparsePart { ffn, rows };
            let fire = |_: usize, i: u32, g: f32| fire(i, g);
            let n = sparse_ffn_many_at(level, &[part], x, fire, |a, u| a * u, &mut [&mut got]);
            let n = n.unwrap();
            let firing = clear.iter().filter(|&&i| act.apply(g64(i) as f32) != 0.0);
            assert_eq!(n, firing.count(), "{level:?} {act:?} fired");
            let (want, scale, slack) = reference_ffn(level, &ffn, act, x, &clear);
            let what = format!("{level:?} {:?} {act:?} gated={gated}", ws[0].dtype);
            assert_close_plus(&got, &want, &scale, &slack, &what);
        }
    }

    #[test]
    fn matches_reference_on_every_level_and_format() {
        let mut rng = Rng::new(21);
        for level in available() {
            for dtype in DType::ALL {
                for &(rows, units) in &[(1, 1), (13, 3), (77, 5)] {
                    let cols = cols_for(dtype, units);
                    let ws = case(&mut rng, [dtype; 3], rows, cols);
                    let x = rng.vec(cols);
                    let listed = subset(&mut rng, rows, 0.4);
                    for gated in [true, false] {
                        check_one(level, &ws, gated, GateRows::All, &x);
                        check_one(level, &ws, gated, GateRows::Listed(&listed), &x);
                    }
                }
            }
        }
    }

    #[test]
    fn mixed_formats_on_many_threads_match_the_separate_ops() {
        let seven = crate::testutil::pool(7);
        let mut rng = Rng::new(22);
        let dtypes = [DType::Q4_0, DType::F16, DType::Q8_0];
        let (rows, cols) = (3001, qcols(DType::Q4_0, 512));
        let ws = case(&mut rng, dtypes, rows, cols);
        let x = rng.vec(cols);
        seven.install(|| {
            check_one(simd::level(), &ws, true, GateRows::All, &x);
            let listed = subset(&mut rng, rows, 0.3);
            check_one(simd::level(), &ws, true, GateRows::Listed(&listed), &x);
        });
        // Same pool, same bits; the ops give the same values up to the partials' order.
        let ffn = SparseFfn {
            gate: &ws[0],
            up: Some(&ws[1]),
            down_t: &ws[2],
        };
        let relu = |_: u32, g: f32| g.max(0.0);
        let run_on = |pool: &rayon::ThreadPool| {
            let mut y = vec![0f32; cols];
            pool.install(|| sparse_ffn(&ffn, &x, GateRows::All, relu, |a, u| a * u, &mut y))
                .unwrap();
            y
        };
        let run = || run_on(&seven);
        assert_eq!(run(), run());
        // The same bits on any pool: the work is cut by bytes, not by the thread count.
        for n in [1, 2, 3] {
            assert_eq!(run_on(&crate::testutil::pool(n)), run(), "{n} threads");
        }
        let mut g = vec![0f32; rows];
        crate::matvec(&ws[0], &x, &mut g).unwrap();
        let idx: Vec<u32> = (0..rows as u32).filter(|&i| g[i as usize] > 0.0).collect();
        let mut u = vec![0f32; idx.len()];
        crate::matvec_rows(&ws[1], &x, &idx, &mut u).unwrap();
        let h: Vec<f32> = idx
            .iter()
            .zip(&u)
            .map(|(&i, &u)| g[i as usize] * u)
            .collect();
        let mut sep = vec![0f32; cols];
        crate::axpy_rows(&ws[2], &idx, &h, &mut sep).unwrap();
        let fused = run();
        let size = sep.iter().map(|v| v.abs()).fold(0f32, f32::max);
        for (a, b) in fused.iter().zip(&sep) {
            assert!((a - b).abs() <= 1e-4 * size, "{a} vs {b}");
        }
    }

    #[test]
    fn many_parts_give_each_part_its_own_bits() {
        // Three "experts" of odd sizes, one of them listed, one too small to split, and an
        // empty list: one region gives each the bits of its own call, on any pool.
        let mut rng = Rng::new(24);
        let cols = qcols(DType::Q4_0, 320);
        let experts: Vec<[Weight; 3]> = [1537, 37, 901]
            .iter()
            .map(|&r| case(&mut rng, [DType::Q4_0, DType::Q8_0, DType::F16], r, cols))
            .collect();
        let x = rng.vec(cols);
        let listed = subset(&mut rng, 901, 0.4);
        let rows = [GateRows::All, GateRows::All, GateRows::Listed(&listed)];
        let parts: Vec<SparsePart<'_>> = experts
            .iter()
            .zip(rows)
            .map(|(ws, rows)| SparsePart {
                ffn: SparseFfn {
                    gate: &ws[0],
                    up: Some(&ws[1]),
                    down_t: &ws[2],
                },
                rows,
            })
            .collect();
        let relu = |g: f32| g.max(0.0);
        for n in [1, 2, 5] {
            let pool = crate::testutil::pool(n);
            let mut outs = vec![vec![f32::NAN; cols]; parts.len()];
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            let fired = pool
                .install(|| sparse_ffn_many(&parts, &x, |_, _, g| relu(g), |a, u| a * u, &mut ys))
                .unwrap();
            let mut want_fired = 0;
            for (p, got) in parts.iter().zip(&outs) {
                let mut y = vec![0f32; cols];
                want_fired += pool
                    .install(|| {
                        sparse_ffn(&p.ffn, &x, p.rows, |_, g| relu(g), |a, u| a * u, &mut y)
                    })
                    .unwrap();
                assert_eq!(&y, got, "{n} threads");
            }
            assert_eq!(fired, want_fired);
            // The transposed down rows alone, several weights in one region.
            let idx: Vec<Vec<u32>> = experts
                .iter()
                .map(|ws| subset(&mut rng, ws[2].rows, 0.5))
                .collect();
            let a: Vec<Vec<f32>> = idx.iter().map(|i| rng.vec(i.len())).collect();
            let list: Vec<(&Weight, &[u32], &[f32])> = experts
                .iter()
                .zip(&idx)
                .zip(&a)
                .map(|((ws, i), a)| (&ws[2], &i[..], &a[..]))
                .collect();
            let mut outs = vec![vec![0.5f32; cols]; list.len()];
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            pool.install(|| crate::axpy_rows_many(&list, &mut ys))
                .unwrap();
            for (&(w, i, a), got) in list.iter().zip(&outs) {
                let mut y = vec![0.5f32; cols];
                pool.install(|| crate::axpy_rows(w, i, a, &mut y)).unwrap();
                assert_eq!(&y, got, "{n} threads");
            }
        }
        // One output per part, and each part's shapes checked.
        let mut one = vec![0f32; cols];
        let err = sparse_ffn_many(&parts, &x, |_, _, g| g, |a, u| a * u, &mut [&mut one[..]]);
        assert!(is_shape(err.map(|_| ())));
        let mut short = vec![vec![0f32; cols - 1]; parts.len()];
        let mut ys: Vec<&mut [f32]> = short.iter_mut().map(|v| v.as_mut_slice()).collect();
        let err = sparse_ffn_many(&parts, &x, |_, _, g| g, |a, u| a * u, &mut ys);
        assert!(is_shape(err.map(|_| ())));
    }

    #[test]
    fn nothing_fires_gives_zeros_and_nan_propagates() {
        let mut rng = Rng::new(23);
        let cols = 64;
        let ws = case(&mut rng, [DType::Q4_1, DType::F16, DType::F32], 40, cols);
        let ffn = SparseFfn {
            gate: &ws[0],
            up: Some(&ws[1]),
            down_t: &ws[2],
        };
        let x = rng.vec(cols);
        let mut y = vec![5.0f32; cols];
        let n = sparse_ffn(&ffn, &x, GateRows::All, |_, _| 0.0, |a, u| a * u, &mut y).unwrap();
        assert_eq!(n, 0);
        assert!(y.iter().all(|&v| v == 0.0));
        let n = sparse_ffn(
            &ffn,
            &x,
            GateRows::Listed(&[]),
            |_, g| g,
            |a, u| a * u,
            &mut y,
        );
        assert_eq!(n.unwrap(), 0);
        let mut xn = x.clone();
        xn[3] = f32::NAN;
        sparse_ffn(&ffn, &xn, GateRows::All, |_, g| g, |a, u| a * u, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn shape_and_index_errors_are_errors() {
        let w = Weight::from_f32(3, 4, &[0.5; 12]).unwrap();
        let short = Weight::from_f32(2, 4, &[0.5; 8]).unwrap();
        let narrow = Weight::from_f32(3, 2, &[0.5; 6]).unwrap();
        let x = [1.0f32; 4];
        fn run(
            gate: &Weight,
            up: Option<&Weight>,
            down_t: &Weight,
            x: &[f32],
            rows: GateRows<'_>,
            y: &mut [f32],
        ) -> bool {
            let ffn = SparseFfn { gate, up, down_t };
            is_shape(sparse_ffn(&ffn, x, rows, |_, g| g, |a, u| a * u, y).map(|_| ()))
        }
        let mut y = [0.0f32; 4];
        assert!(run(&w, Some(&w), &w, &x, GateRows::Listed(&[3]), &mut y));
        assert!(run(&w, Some(&short), &w, &x, GateRows::All, &mut y));
        assert!(run(&w, Some(&narrow), &w, &x, GateRows::All, &mut y));
        assert!(run(&w, None, &short, &x, GateRows::All, &mut y));
        assert!(run(&w, None, &w, &x[..3], GateRows::All, &mut y));
        assert!(run(&w, None, &w, &x, GateRows::All, &mut y[..3]));
        // down_t may have its own width: y follows it.
        let wide = Weight::from_f32(3, 6, &[0.5; 18]).unwrap();
        let mut y6 = [0.0f32; 6];
        assert!(!run(&w, Some(&w), &wide, &x, GateRows::All, &mut y6));
        assert_eq!(y6, [3.0 * 2.0 * 2.0 * 0.5; 6]);
    }
}
