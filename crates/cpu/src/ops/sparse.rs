//! Sparse FFN ops over an active neuron list: row-sparse matvec ([`matvec_rows`]) and
//! column-sparse accumulation over rows of a transposed matrix ([`axpy_rows`]).
//!
//! Parallel work is the active list cut into a few contiguous chunks per thread (by bytes
//! touched, see [`super::split`]). [`axpy_rows`] gives every chunk its own partial sum (the first
//! chunk adds straight into y, the others into zeroed thread-local scratch), then adds the
//! partials into y in chunk order: no two tasks write the same memory, and the result depends
//! only on the inputs and the thread count. Rows are read in list order, so a sorted list walks
//! memory forwards. Rows are handled eight at a time (float-format dots and every axpy read
//! eight rows side by side, sharing each x or y vector) while the rows read next are fetched
//! line by line in step; quantized rows are dotted on the dense matvec's int16-x kernel (up to
//! eight scattered rows at once), other formats are decoded to f32 on the fly. 4-bit rows
//! (Q4_0, Q4_1) are accumulated on integer multiplies, with the group's per-block coefficients
//! rounded to 8 bits on a shared scale (error bound and reasoning in `kernels::avx2::q4_axpy`);
//! every other accumulation is in f32.
//!
//! The engine's sparse decode runs a whole FFN in one parallel region
//! ([`super::sparse_ffn::sparse_ffn`], built on this file's per-thread loops), keeping the
//! passes separate inside each task (up rows, then down_t rows): per-neuron kernels that read
//! each active neuron's rows together measured slower on this design's CPUs (F16 201 µs vs
//! 169 µs, Q4_0 153 µs vs 129 µs for 10% of ffn 5504 on 2 threads) and were removed.
//!
//! A neuron whose coefficient a[k] is exactly zero contributes nothing and its row is not read;
//! the references in [`crate::reference::sparse`] follow the same rule.

use super::split::{accumulate_many, chunks};
use crate::check::{self, Rows};
use crate::dispatch::{self, Activations, GROUP};
use crate::simd::{self, Level};
use powerinfer_core::{DType, Result, Weight};

/// y[k] = dot(W[idx[k]], x) for every k (row-sparse matvec over an active index list; idx need
/// not be sorted; out-of-range index -> Error::Shape). Parallel on the current rayon pool;
/// quantized rows use the int16-x kernel like matvec when on AVX2.
pub fn matvec_rows(w: &Weight, x: &[f32], idx: &[u32], y: &mut [f32]) -> Result<()> {
    matvec_rows_at(simd::level(), w, x, idx, y)
}

/// y += Σ_k a[k] · W[idx[k]]  (column-sparse accumulation over rows of a transposed matrix such
/// as down_t [ffn rows, dim cols]); y.len() == w.cols; per-thread partial sums reduced without
/// data races (deterministic result for a given thread count). On AVX2, Q4_0/Q4_1 rows take
/// coefficients rounded to 8 bits per block and group of 8 rows (error per column at most
/// Σ_i (max_i |a_i·d_i| / 254)·|q_i − 8| over the block's scales d and nibbles q).
pub fn axpy_rows(w: &Weight, idx: &[u32], a: &[f32], y: &mut [f32]) -> Result<()> {
    axpy_rows_at(simd::level(), w, idx, a, y)
}

/// [`matvec_rows`] on a given SIMD level.
pub(crate) fn matvec_rows_at(
    level: Level,
    w: &Weight,
    x: &[f32],
    idx: &[u32],
    y: &mut [f32],
) -> Result<()> {
    check::len("matvec_rows", "x", x.len(), w.cols, "the weight's cols")?;
    check::len("matvec_rows", "y", y.len(), idx.len(), "one per index")?;
    let rows = Rows::new(w, idx, "matvec_rows")?;
    if idx.is_empty() {
        return Ok(());
    }
    let xs = Activations::new(level, x, w.dtype.is_quantized());
    chunks(idx, y, rows.bytes, |(ic, yc): (&[u32], &mut [f32])| {
        listed_dot(&xs, w.dtype, &rows, ic, yc)
    });
    Ok(())
}

/// y[k] = dot(row idx[k], x) on this thread: [`GROUP`] rows at a time, the next group's rows
/// fetched in step (indices checked by `rows`).
pub(super) fn listed_dot(
    xs: &Activations<'_>,
    dtype: DType,
    rows: &Rows<'_>,
    idx: &[u32],
    y: &mut [f32],
) {
    let mut batch = [&[][..]; GROUP];
    let mut next = [&[][..]; GROUP];
    let groups = idx.chunks(GROUP).zip(y.chunks_mut(GROUP));
    for (g, (ig, yg)) in groups.enumerate() {
        let upcoming = idx.iter().skip((g + 1) * GROUP).take(GROUP);
        let mut nn = 0;
        for (b, &i) in next.iter_mut().zip(upcoming) {
            *b = rows.get(i);
            nn += 1;
        }
        for (b, &i) in batch.iter_mut().zip(ig) {
            *b = rows.get(i);
        }
        xs.group_dot(dtype, &batch[..ig.len()], &next[..nn], yg);
    }
}

/// y += Σ_k a[k] · row idx[k] on this thread, skipping zero coefficients (indices checked by
/// `rows`).
pub(super) fn listed_axpy(
    level: Level,
    dtype: DType,
    rows: &Rows<'_>,
    idx: &[u32],
    a: &[f32],
    y: &mut [f32],
) {
    let mut group = Group::new(level, dtype);
    for (&i, &ak) in idx.iter().zip(a) {
        if ak != 0.0 {
            group.push(rows.get(i), ak, y);
        }
    }
    group.flush(y);
}

/// [`axpy_rows`] on a given SIMD level.
pub(crate) fn axpy_rows_at(
    level: Level,
    w: &Weight,
    idx: &[u32],
    a: &[f32],
    y: &mut [f32],
) -> Result<()> {
    axpy_rows_many_at(level, &[(w, idx, a)], &mut [y])
}

/// [`axpy_rows`] of several weights in one parallel region: `ys[p] += Σ_k a·w[idx[k]]` for
/// each `(w, idx, a)` of `parts`, each `ys[p]` bit for bit what its own call gives (the
/// transposed down rows of a mixture-of-experts layer's routed experts).
pub fn axpy_rows_many(parts: &[(&Weight, &[u32], &[f32])], ys: &mut [&mut [f32]]) -> Result<()> {
    axpy_rows_many_at(simd::level(), parts, ys)
}

/// [`axpy_rows_many`] on a given SIMD level.
pub(crate) fn axpy_rows_many_at(
    level: Level,
    parts: &[(&Weight, &[u32], &[f32])],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    check::len("axpy_rows", "ys", ys.len(), parts.len(), "one per part")?;
    let mut rows = Vec::with_capacity(parts.len());
    for (&(w, idx, a), y) in parts.iter().zip(ys.iter()) {
        check::len("axpy_rows", "y", y.len(), w.cols, "the weight's cols")?;
        check::len("axpy_rows", "a", a.len(), idx.len(), "one per index")?;
        rows.push(Rows::new(w, idx, "axpy_rows")?);
    }
    let probs: Vec<(usize, usize)> = parts
        .iter()
        .zip(&rows)
        .map(|(p, r)| (p.1.len(), r.bytes))
        .collect();
    accumulate_many(&probs, 1, ys, |p, range, part| {
        let (w, idx, a) = parts[p];
        listed_axpy(
            level,
            w.dtype,
            &rows[p],
            &idx[range.clone()],
            &a[range],
            part,
        )
    });
    Ok(())
}

/// Rows waiting to be added into a partial sum, [`GROUP`] at a time (y read and written
/// once per group). Up to two groups are held: the first is added while the second's rows are
/// fetched into the cache alongside, so the rows after the current group are always in flight.
struct Group<'a> {
    level: Level,
    dtype: DType,
    rows: [&'a [u8]; 2 * GROUP],
    a: [f32; 2 * GROUP],
    n: usize,
}

impl<'a> Group<'a> {
    fn new(level: Level, dtype: DType) -> Group<'a> {
        Group {
            level,
            dtype,
            rows: [&[]; 2 * GROUP],
            a: [0.0; 2 * GROUP],
            n: 0,
        }
    }

    /// Queue `a · row`, adding the first group into `y` once a second one is full behind it.
    #[inline]
    fn push(&mut self, row: &'a [u8], a: f32, y: &mut [f32]) {
        self.rows[self.n] = row;
        self.a[self.n] = a;
        self.n += 1;
        if self.n == 2 * GROUP {
            self.add_first(y);
        }
    }

    /// Add the first queued group (up to [`GROUP`] rows) into `y`, fetching the rest, and
    /// move the rest to the front.
    fn add_first(&mut self, y: &mut [f32]) {
        let g = self.n.min(GROUP);
        let (rows, next) = self.rows[..self.n].split_at(g);
        dispatch::axpy_group(self.level, self.dtype, rows, next, &self.a[..g], y);
        self.rows.copy_within(g..self.n, 0);
        self.a.copy_within(g..self.n, 0);
        self.n -= g;
    }

    /// Add every queued row into `y`.
    fn flush(&mut self, y: &mut [f32]) {
        while self.n > 0 {
            self.add_first(y);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The sparse ops against their f64 references on every SIMD level, dtype and odd shape,
    //! with unsorted, empty and full active sets, on pools of several sizes.

    use super::*;
    use crate::reference;
    use crate::simd::available;
    use crate::testutil::sparse::{cols_for, sparse_ffn, Case};
    use crate::testutil::{is_shape, qcols, Rng};
    use powerinfer_core::{Activation, Buffer};

    #[test]
    fn every_dtype_matches_reference_on_odd_shapes() {
        let mut rng = Rng::new(11);
        for level in available() {
            for dtype in DType::ALL {
                for &(rows, units, p) in &[(1, 1, 1.0), (13, 3, 0.5), (37, 7, 0.3), (101, 16, 0.1)]
                {
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
        // An empty set leaves axpy's y alone, and gives an FFN of zeros.
        let case = Case::new(&mut rng, dtypes, 5, 32, 0.0);
        let mut y = vec![3.0f32; 32];
        axpy_rows(&case.down, &[], &[], &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 3.0));
        let ws = [&case.gate, &case.up, &case.down];
        let y = sparse_ffn(simd::level(), ws, Activation::Silu, &case.x, &[]);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn many_threads_match_reference_and_are_deterministic() {
        let (seven, one) = (crate::testutil::pool(7), crate::testutil::pool(1));
        let mut rng = Rng::new(13);
        for dtype in DType::ALL {
            // Enough active bytes (> 14 · MIN_TASK_BYTES per matrix) for many tasks and partials.
            let (rows, cols) = (
                4001,
                if dtype.is_quantized() {
                    qcols(dtype, 1024)
                } else {
                    515
                },
            );
            let case = Case::new(&mut rng, [dtype; 3], rows, cols, 0.6);
            seven.install(|| case.check(simd::level(), &format!("7 threads {dtype}")));
            let run = |pool: &rayon::ThreadPool| {
                let mut y = case.y0.clone();
                let (up, down) = (&case.up, &case.down);
                let ws = [&case.gate, up, down];
                pool.install(|| {
                    axpy_rows(down, &case.idx, &case.g, &mut y).unwrap();
                    let f = sparse_ffn(simd::level(), ws, Activation::Silu, &case.x, &case.idx);
                    let mut m = vec![0f32; case.idx.len()];
                    matvec_rows(up, &case.x, &case.idx, &mut m).unwrap();
                    (y, f, m)
                })
            };
            let first = run(&seven);
            assert_eq!(first, run(&seven), "{dtype}: same pool, same bits");
            // Nor does any op change its arithmetic with the thread count: the accumulating
            // ones cut their work by bytes, not by the pool (decoding gives the same bits at
            // 1 thread and at 7).
            assert_eq!(first, run(&one), "{dtype}: 1 thread and 7, same bits");
        }
    }

    #[test]
    fn non_finite_inputs_propagate() {
        let mut rng = Rng::new(14);
        for dtype in DType::ALL {
            let case = Case::new(&mut rng, [dtype; 3], 9, qcols(dtype, 64), 1.0);
            let mut x = case.x.clone();
            x[5] = f32::NAN;
            let mut y = vec![0f32; case.idx.len()];
            matvec_rows(&case.up, &x, &case.idx, &mut y).unwrap();
            assert!(y.iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
            let ws = [&case.gate, &case.up, &case.down];
            let f = sparse_ffn(simd::level(), ws, Activation::Silu, &x, &case.idx);
            assert!(f.iter().all(|v| v.is_nan()), "{dtype}: {f:?}");
        }
    }

    #[test]
    fn shape_and_index_errors_are_errors() {
        let w = Weight::from_f32(3, 4, &[0.5; 12]).unwrap();
        let x = [1.0f32; 4];
        // matvec_rows
        assert!(is_shape(matvec_rows(&w, &x, &[3], &mut [0.0])));
        assert!(is_shape(matvec_rows(&w, &x, &[u32::MAX], &mut [0.0])));
        assert!(is_shape(matvec_rows(&w, &x[..3], &[0], &mut [0.0])));
        assert!(is_shape(matvec_rows(&w, &x, &[0, 1], &mut [0.0])));
        // axpy_rows
        assert!(is_shape(axpy_rows(&w, &[3], &[1.0], &mut [0.0; 4])));
        assert!(is_shape(axpy_rows(&w, &[0], &[1.0, 2.0], &mut [0.0; 4])));
        assert!(is_shape(axpy_rows(&w, &[0], &[1.0], &mut [0.0; 3])));
        // The FFN reference: indices in range, one ffn for every weight, x and y of their cols.
        let mut y = [0.0f32; 4];
        let short = Weight::from_f32(2, 4, &[0.5; 8]).unwrap();
        let narrow = Weight::from_f32(3, 2, &[0.5; 6]).unwrap();
        let relu = Activation::Relu;
        let ffn = |ws: [&Weight; 3], x: &[f32], idx: &[u32], y: &mut [f32]| {
            is_shape(reference::sparse::ffn_gate_up_down_sparse(
                ws[0], ws[1], ws[2], relu, x, idx, y,
            ))
        };
        assert!(ffn([&w, &w, &w], &x, &[3], &mut y));
        assert!(ffn([&w, &w, &w], &x, &[7], &mut y));
        assert!(ffn([&short, &w, &w], &x, &[0], &mut y));
        assert!(ffn([&w, &short, &w], &x, &[0], &mut y));
        assert!(ffn([&w, &narrow, &w], &x, &[0], &mut y));
        assert!(ffn([&w, &w, &w], &x[..2], &[0], &mut y));
        assert!(ffn([&w, &w, &w], &x, &[0], &mut y[..3]));
        // A weight whose fields lie about its size.
        let mut bad = w.clone();
        bad.data = Buffer::from_bytes(&[0u8; 8]);
        assert!(is_shape(matvec_rows(&bad, &x, &[0], &mut [0.0])));
        assert!(is_shape(axpy_rows(&bad, &[0], &[1.0], &mut [0.0; 4])));
        // The references reject the same inputs.
        assert!(is_shape(reference::sparse::matvec_rows(
            &w,
            &x,
            &[3],
            &mut [0.0]
        )));
        assert!(is_shape(reference::sparse::axpy_rows(
            &w,
            &[9],
            &[1.0],
            &mut [0.0; 4]
        )));
        // Zero-sized shapes are fine.
        let empty = Weight::from_f32(0, 4, &[]).unwrap();
        matvec_rows(&empty, &x, &[], &mut []).unwrap();
        let no_cols = Weight::from_f32(3, 0, &[]).unwrap();
        axpy_rows(&no_cols, &[0, 2], &[1.0, 2.0], &mut []).unwrap();
        let no_cols = [&no_cols; 3];
        reference::sparse::ffn_gate_up_down_sparse(
            no_cols[0],
            no_cols[1],
            no_cols[2],
            relu,
            &[],
            &[1],
            &mut [],
        )
        .unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Any dtypes, shape, density and seed: every level's kernels meet the bound.
        #[test]
        fn prop_sparse_kernels_match_reference(
            dtype_index in [0usize..13, 0usize..13, 0usize..13],
            rows in 1usize..80,
            units in 1usize..24,
            p in 0.0f32..1.0,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let dtypes = dtype_index.map(|i| DType::ALL[i]);
            // Quantized anywhere: whole blocks; otherwise odd column counts too.
            let cols = match dtypes.iter().map(|d| d.block_size()).max() {
                Some(256) => 256 * (1 + units % 4),
                Some(32) => 32 * units,
                _ => 3 * units + 2,
            };
            let mut rng = Rng::new(seed);
            let case = Case::new(&mut rng, dtypes, rows, cols, p);
            for level in available() {
                case.check(level, &format!("prop {level:?} {dtypes:?} {rows}x{cols}"));
            }
        }
    }
}
