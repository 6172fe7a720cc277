//! Dense matrix-vector product: rows split into a few rayon chunks per thread, each chunk handed
//! to the dispatched multi-row kernel.

use crate::check;
use crate::dispatch::Activations;
use crate::simd::{self, Level};
use powerinfer_core::{DType, Result, Weight};
use rayon::prelude::*;

/// Smallest chunk of weight bytes worth a rayon task (tasks cost about a microsecond).
const MIN_CHUNK_BYTES: usize = 32 * 1024;
/// At most this many chunks per thread (a little slack for load balancing, no more).
const CHUNKS_PER_THREAD: usize = 4;
/// Chunk boundaries fall on multiples of this many rows (the kernels' row-group width).
const ROW_ALIGN: usize = 8;

/// Several matvecs over the same `x` (q/k/v, gate/up) in one parallel region: `ys[i] = ws[i]·x`.
/// One fork-join instead of one per matrix, and x is prepared once.
pub fn matvec_many(ws: &[&Weight], x: &[f32], ys: &mut [&mut [f32]]) -> Result<()> {
    matvec_many_at(simd::level(), ws, x, ys)
}

/// [`matvec`] on a given SIMD level.
#[cfg(test)]
pub(crate) fn matvec_at(level: Level, w: &Weight, x: &[f32], y: &mut [f32]) -> Result<()> {
    matvec_many_at(level, &[w], x, &mut [y])
}

/// One unit of parallel work: some consecutive rows of one weight and the rows' outputs.
struct Task<'a> {
    dtype: DType,
    row_bytes: usize,
    rows: &'a [u8],
    out: &'a mut [f32],
}

/// [`matvec_many`] on a given SIMD level.
pub(crate) fn matvec_many_at(
    level: Level,
    ws: &[&Weight],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    check::len("matvec_many", "ys", ys.len(), ws.len(), "one per weight")?;
    for (w, y) in ws.iter().zip(ys.iter()) {
        check::matvec(w, x, y)?;
    }
    let split = RowSplit::new(ws);
    let mut tasks = Vec::new();
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let row_bytes = w.dtype.row_bytes(w.cols)?;
        let per = split.rows_per_task(w, row_bytes);
        for (i, out) in y.chunks_mut(per).enumerate() {
            let start = i * per * row_bytes;
            let rows = &w.bytes()[start..start + out.len() * row_bytes];
            tasks.push(Task {
                dtype: w.dtype,
                row_bytes,
                rows,
                out,
            });
        }
    }
    let quantized = ws.iter().any(|w| w.dtype.is_quantized());
    let prepared = Activations::new(level, x, quantized);
    let run = |t: Task<'_>| prepared.rows_dot(t.dtype, t.rows, t.row_bytes, t.out);
    if tasks.len() <= 1 {
        tasks.into_iter().for_each(run);
    } else {
        tasks.into_par_iter().for_each(run);
    }
    Ok(())
}

/// How the matvec splits the rows of the weights of one parallel region into tasks.
pub(crate) struct RowSplit {
    threads: usize,
    chunk_bytes: usize,
}

impl RowSplit {
    /// The split for `ws` on the current rayon pool.
    pub(crate) fn new(ws: &[&Weight]) -> RowSplit {
        let threads = rayon::current_num_threads();
        let total: usize = ws.iter().map(|w| w.n_bytes()).sum();
        RowSplit {
            threads,
            chunk_bytes: chunk_bytes(total, threads),
        }
    }

    /// Rows of `w` (rows of `row_bytes`) per task: all of them on one thread, else about
    /// [`chunk_bytes`], in whole row groups.
    pub(crate) fn rows_per_task(&self, w: &Weight, row_bytes: usize) -> usize {
        match self.threads {
            1 => w.rows.max(1),
            _ => self
                .chunk_bytes
                .div_ceil(row_bytes.max(1))
                .next_multiple_of(ROW_ALIGN),
        }
    }
}

/// Bytes of weights per parallel task when `total` bytes are shared by `threads` threads: a
/// few tasks per thread for balance, none smaller than [`MIN_CHUNK_BYTES`].
fn chunk_bytes(total: usize, threads: usize) -> usize {
    (total / (threads * CHUNKS_PER_THREAD).max(1)).max(MIN_CHUNK_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::simd::available;
    use crate::testutil::{assert_dot_seen, is_shape, qcols, random_weight, Rng};
    use powerinfer_core::Buffer;

    #[test]
    fn chunking_is_coarse_for_small_matrices() {
        // 576 x 576 Q4_1 is ~200 KB: a few tasks per thread, never one per row.
        let total = 576 * (576 / 32 * 20);
        let per = chunk_bytes(total, 2);
        assert!(per >= MIN_CHUNK_BYTES && total / per <= 2 * CHUNKS_PER_THREAD);
        assert_eq!(chunk_bytes(100, 8), MIN_CHUNK_BYTES);
    }

    /// Deterministic bytes that decode to finite weights in every format (f16/bf16 exponent
    /// bytes kept small).
    fn weight(dtype: DType, rows: usize, cols: usize, seed: u32) -> Weight {
        let n = dtype.row_bytes(cols).unwrap() * rows;
        let bytes: Vec<u8> = (0..n as u32)
            .map(|i| {
                let v = i.wrapping_mul(2654435761).wrapping_add(seed) >> 24;
                // Keep every byte pattern a modest number: clear the high exponent bits.
                (v as u8) & 0x3b
            })
            .collect();
        Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
    }

    #[test]
    fn many_equals_one_by_one_on_many_threads() {
        let pool = crate::testutil::pool(7);
        let cols = 32 * 9;
        let ws = [
            weight(DType::Q4_1, 301, cols, 1),
            weight(DType::F16, 77, cols, 2),
            weight(DType::Q8_0, 1030, cols, 3),
        ];
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut many: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; w.rows]).collect();
        let mut ys: Vec<&mut [f32]> = many.iter_mut().map(|v| v.as_mut_slice()).collect();
        let refs: Vec<&Weight> = ws.iter().collect();
        pool.install(|| matvec_many(&refs, &x, &mut ys)).unwrap();
        for (w, got) in ws.iter().zip(&many) {
            let mut one = vec![0.0; w.rows];
            pool.install(|| matvec_at(simd::level(), w, &x, &mut one))
                .unwrap();
            assert_eq!(&one, got);
        }
        let mut short = [0.0; 3];
        let err = matvec_many(&refs[..1], &x, &mut [&mut short[..]]).unwrap_err();
        assert!(matches!(err, powerinfer_core::Error::Shape(_)));
        assert!(matvec_many(&refs, &x, &mut []).is_err());
    }

    #[test]
    fn matvec_matches_reference_on_odd_shapes() {
        let mut rng = Rng::new(4);
        for level in available() {
            for dtype in DType::ALL {
                for &(rows, cols) in &[(1, 64), (3, 32), (13, 96), (37, 32 * 37), (259, 64)] {
                    let cols = if dtype.is_quantized() {
                        qcols(dtype, cols)
                    } else {
                        cols - 1
                    };
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let x = rng.vec(cols);
                    let mut y = vec![f32::NAN; rows];
                    matvec_at(level, &w, &x, &mut y).unwrap();
                    for (r, &got) in y.iter().enumerate() {
                        assert_dot_seen(got, level, dtype, w.row(r), &x, level.name());
                    }
                }
            }
        }
    }

    #[test]
    fn matvec_meets_the_bound_with_activation_outliers() {
        // LLM activations have a few channels 100x larger than the rest; the int8 x is scaled
        // per 32-block, so an outlier costs only its own block's precision.
        let mut rng = Rng::new(7);
        for level in available() {
            for dtype in DType::ALL {
                let (rows, cols) = (67, qcols(dtype, 32 * 24));
                let w = random_weight(&mut rng, dtype, rows, cols);
                let mut x = rng.vec(cols);
                for c in (5..cols).step_by(97) {
                    x[c] *= 100.0;
                }
                x[cols - 1] = 0.0;
                let mut y = vec![0f32; rows];
                matvec_at(level, &w, &x, &mut y).unwrap();
                for (r, &got) in y.iter().enumerate() {
                    assert_dot_seen(got, level, dtype, w.row(r), &x, "outliers");
                }
            }
        }
    }

    #[test]
    fn non_finite_activations_propagate() {
        let mut rng = Rng::new(8);
        for dtype in DType::ALL {
            let cols = qcols(dtype, 64);
            let w = random_weight(&mut rng, dtype, 9, cols);
            let mut x = rng.vec(cols);
            x[3] = f32::INFINITY;
            x[40] = f32::NAN;
            let mut y = vec![0f32; 9];
            matvec_at(simd::level(), &w, &x, &mut y).unwrap();
            assert!(y.iter().all(|v| v.is_nan()), "{dtype}: {y:?}");
        }
    }

    #[test]
    fn matvec_on_many_threads_matches_reference() {
        let pool = crate::testutil::pool(7);
        let mut rng = Rng::new(5);
        for dtype in DType::ALL {
            // Big enough to be split into many chunks.
            let cols = qcols(dtype, 512);
            let w = random_weight(&mut rng, dtype, 1001, cols);
            let x = rng.vec(cols);
            let mut y = vec![0f32; 1001];
            pool.install(|| matvec_at(simd::level(), &w, &x, &mut y))
                .unwrap();
            for (r, &got) in y.iter().enumerate() {
                assert_dot_seen(
                    got,
                    crate::simd::level(),
                    dtype,
                    w.row(r),
                    &x,
                    "7-thread matvec",
                );
            }
            // Chunking never changes a row's arithmetic: one thread gives identical bits.
            let mut single = vec![0f32; 1001];
            let one = crate::testutil::pool(1);
            one.install(|| matvec_at(simd::level(), &w, &x, &mut single))
                .unwrap();
            assert_eq!(y, single, "{dtype}");
        }
    }

    #[test]
    fn shape_errors_are_errors_not_panics() {
        let w = Weight::from_f32(3, 4, &[0.0; 12]).unwrap();
        assert!(is_shape(matvec_at(
            simd::level(),
            &w,
            &[0.0; 3],
            &mut [0.0; 3]
        )));
        assert!(is_shape(matvec_at(
            simd::level(),
            &w,
            &[0.0; 4],
            &mut [0.0; 2]
        )));
        assert!(is_shape(reference::matvec(&w, &[0.0; 5], &mut [0.0; 3])));
        // A weight whose public fields were edited to lie about its size.
        let mut bad = w.clone();
        bad.rows = 4;
        assert!(is_shape(matvec_at(
            simd::level(),
            &bad,
            &[0.0; 4],
            &mut [0.0; 4]
        )));
        // Empty shapes are fine.
        let empty = Weight::from_f32(0, 4, &[]).unwrap();
        matvec_at(simd::level(), &empty, &[0.0; 4], &mut []).unwrap();
        let mut y = [1.0f32; 3];
        matvec_at(
            simd::level(),
            &Weight::from_f32(3, 0, &[]).unwrap(),
            &[],
            &mut y,
        )
        .unwrap();
        assert_eq!(y, [0.0; 3]);
    }
}
