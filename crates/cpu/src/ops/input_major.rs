//! Input-sparse matvec: `y = W x` reading only the columns of `W` whose input `x_i` is kept
//! (the `input` sparsity mode, TEAL/WINA style), over an input-major copy of `W` that is the
//! same numbers as `W` (no second quantization).
//!
//! The copy's layout and the kept inputs are in [`crate::operands::input_major`].
//!
//! ## The product ([`matvec_input`])
//! x is quantized per group of G to int16 over the kept entries (the dense matvec's scheme), and
//! each output row's group sum `Σ xq_i q_ri` is an exact integer, scaled once per group:
//! `y_r += s_r·xs·(Σ xq_i q_ri + off·Σ xq_i) + m_r·xs·Σ xq_i`. Work is cut into (matrix, row
//! range, range of active groups) units, each with its own partial sum, added in unit order:
//! the result depends only on the inputs and the thread count.

use powerinfer_core::{ensure, Result};
use rayon::prelude::*;

use crate::check;
use crate::dispatch;
use crate::operands::input_major::{ActiveInput, InputMajor, SUB};
use crate::simd::{self, Level};

/// Rows a unit of work covers at least (where a matrix has more, its rows are split).
const UNIT_ROWS: usize = 2048;

/// Units of work per matrix (its row ranges, each split by input groups), whatever the pool's
/// size: the split decides the order of the partial sums, so it must not follow the thread
/// count. Pools wider than this leave threads idle on small matrices.
const INPUT_UNITS: usize = 8;

/// `ys[k] = ms[k] · x` over the entries `acts[k]` keeps (acts[k] built for ms[k]'s group length
/// and columns), all in one parallel region. Overwrites `ys`.
pub fn matvec_input(
    ms: &[&InputMajor],
    acts: &[&ActiveInput],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    matvec_input_at(simd::level(), ms, acts, ys)
}

/// A unit of work: matrix, rows `r0..r1` (multiples of [`SUB`], r1 up to the padded rows),
/// range of the matrix's active groups, and where its partial sum sits.
#[derive(Clone, Copy)]
struct Unit {
    m: usize,
    rows: (usize, usize),
    groups: (usize, usize),
    at: usize,
}

/// [`matvec_input`] on a given SIMD level.
pub(crate) fn matvec_input_at(
    level: Level,
    ms: &[&InputMajor],
    acts: &[&ActiveInput],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    ensure!(
        ms.len() == acts.len() && ms.len() == ys.len(),
        Shape,
        "matvec_input: {} matrices, {} inputs, {} outputs",
        ms.len(),
        acts.len(),
        ys.len()
    );
    for ((m, a), y) in ms.iter().zip(acts).zip(ys.iter()) {
        check::len("matvec_input", "x", a.len, m.cols, "the weight's cols")?;
        check::len("matvec_input", "y", y.len(), m.rows, "the weight's rows")?;
        ensure!(
            a.group == m.group,
            Shape,
            "matvec_input: inputs grouped by {} for a matrix of groups of {}",
            a.group,
            m.group
        );
    }
    let mut units = Vec::new();
    let mut total = 0;
    for (k, (m, a)) in ms.iter().zip(acts).enumerate() {
        let n = a.groups.len();
        // Row ranges of at least UNIT_ROWS rows; then groups split so that there are
        // INPUT_UNITS units (by this matrix alone, so that its result does not depend on the
        // matrices beside it, and never by the thread count, which would change the order of
        // the partial sums and so the bits). Few long units: each fetches its groups ahead of
        // use, which the first groups of a unit cannot hide.
        let subs = m.rows_pad / SUB;
        let row_split = (m.rows_pad / UNIT_ROWS).max(1);
        let split = INPUT_UNITS.div_ceil(row_split).clamp(1, n.max(1));
        for rs in 0..row_split {
            let rows = (
                SUB * (rs * subs / row_split),
                SUB * ((rs + 1) * subs / row_split),
            );
            for s in 0..split {
                units.push(Unit {
                    m: k,
                    rows,
                    groups: (s * n / split, (s + 1) * n / split),
                    at: total,
                });
                total += rows.1 - rows.0;
            }
        }
    }
    let mut partial = vec![0.0f32; total];
    let mut parts: Vec<(Unit, &mut [f32])> = Vec::with_capacity(units.len());
    let mut rest = partial.as_mut_slice();
    for u in &units {
        let (p, r) = rest.split_at_mut(u.rows.1 - u.rows.0);
        parts.push((*u, p));
        rest = r;
    }
    let run = |(u, out): &mut (Unit, &mut [f32])| {
        let (m, a) = (ms[u.m], acts[u.m]);
        let groups = &a.groups[u.groups.0..u.groups.1];
        dispatch::cols_tile(level, m, u.rows, a, groups, out);
    };
    if parts.len() == 1 {
        parts.iter_mut().for_each(run);
    } else {
        parts.par_iter_mut().for_each(run);
    }
    for y in ys.iter_mut() {
        y.fill(0.0);
    }
    for u in &units {
        let y = &mut ys[u.m];
        let r1 = u.rows.1.min(y.len());
        if u.rows.0 >= r1 {
            continue;
        }
        let p = &partial[u.at..u.at + (r1 - u.rows.0)];
        y[u.rows.0..r1].iter_mut().zip(p).for_each(|(y, p)| *y += p);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cols::{float_at, quant_at, table_at};
    use crate::operands::input_major::{Lines, ScaleType};
    use crate::testutil::sparse::row_f64;
    use crate::testutil::{is_shape, pool, random_weight, Rng, DOT_ABS_TOL, DOT_REL_TOL};
    use powerinfer_core::{DType, Weight};

    /// Row counts around the sub-tile (one row, a partial sub-tile, whole ones, a tail) and one
    /// split into row ranges.
    const ROWS: [usize; 5] = [1, 33, 128, 261, 2 * UNIT_ROWS + 40];

    fn cols_of(dtype: DType) -> [usize; 2] {
        match (dtype.is_super_block(), dtype.is_quantized()) {
            (true, _) => [256, 768],
            (false, true) if dtype.is_lowbit() => [128, 640],
            (false, true) => [32, 160],
            _ => [7, 77],
        }
    }

    /// The value the copy holds for (row r, input c), decoded with the portable helpers.
    fn stored(m: &InputMajor, r: usize, c: usize) -> f32 {
        let chunk = m.chunk(c / m.group);
        let body = &chunk[m.table_bytes()..];
        let line = &body[(c % m.group) * m.line_bytes..][..m.line_bytes];
        if m.lines.is_float() {
            return float_at(m, line, r);
        }
        let s = table_at(m, chunk, r);
        let mins = &chunk[m.scale_table_bytes()..];
        let q = quant_at(m, line, r) as f32;
        match m.has_min {
            true => s * q + table_at(m, mins, r),
            false => s * q + 0.0,
        }
    }

    #[test]
    fn the_copy_holds_the_dequantized_values_bit_for_bit() {
        let mut rng = Rng::new(7);
        for dtype in DType::ALL {
            for cols in cols_of(dtype) {
                let w = random_weight(&mut rng, dtype, 197, cols);
                let m = InputMajor::new(&w).unwrap();
                for r in 0..w.rows {
                    let want = row_f64(&w, r as u32);
                    for (c, &v) in want.iter().enumerate() {
                        let got = stored(&m, r, c);
                        assert!(
                            got.to_bits() == (v as f32).to_bits() || (got == 0.0 && v == 0.0),
                            "{dtype} [{r}, {c}]: {got} != {v}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bytes_are_those_of_the_layout() {
        let mut rng = Rng::new(8);
        let w = random_weight(&mut rng, DType::Q4_1, 256, 64);
        let m = InputMajor::new(&w).unwrap();
        // Two groups; per chunk f16 scales and mins of 256 rows and 32 lines of 128 B.
        assert_eq!(m.n_bytes(), 2 * (2 * 512 + 32 * 128));
        assert_eq!(
            (m.lines, m.scales, m.has_min),
            (Lines::Nibble, ScaleType::F16, true)
        );
        // 33 rows pad to 64.
        let m = InputMajor::new(&random_weight(&mut rng, DType::Q4_0, 33, 32)).unwrap();
        assert_eq!(m.n_bytes(), 128 + 32 * 32);
        let m = InputMajor::new(&random_weight(&mut rng, DType::Q6_K, 128, 256)).unwrap();
        assert_eq!((m.lines, m.group), (Lines::Byte, 16));
    }

    /// f64 reference of y = W x over the kept entries, with each row's error scale:
    /// Σ|w·x| and the int16 rounding of x (half a step of its group's scale per entry).
    fn reference(w: &Weight, x: &[f32], keep: &[bool], group: usize) -> (Vec<f32>, Vec<f64>) {
        let mut amax = vec![0.0f32; x.len().div_ceil(group)];
        for (i, (&v, &k)) in x.iter().zip(keep).enumerate() {
            if k {
                amax[i / group] = amax[i / group].max(v.abs());
            }
        }
        let quantized = w.dtype.is_quantized();
        (0..w.rows)
            .map(|r| {
                let row = row_f64(w, r as u32);
                let (mut y, mut scale, mut step) = (0.0f64, 0.0f64, 0.0f64);
                for (i, (&wv, (&xv, &k))) in row.iter().zip(x.iter().zip(keep)).enumerate() {
                    if k {
                        y += wv * xv as f64;
                        scale += (wv * xv as f64).abs();
                        if quantized {
                            step += wv.abs() * amax[i / group] as f64 / 32767.0 * 0.5;
                        }
                    }
                }
                (y as f32, DOT_REL_TOL * scale + DOT_ABS_TOL + 1.01 * step)
            })
            .unzip()
    }

    #[test]
    fn every_format_level_and_share_matches_the_f64_reference() {
        let mut rng = Rng::new(9);
        for dtype in DType::ALL {
            for rows in ROWS {
                if rows > UNIT_ROWS && ![DType::Q4_1, DType::Q6_K, DType::F16].contains(&dtype) {
                    continue;
                }
                for cols in cols_of(dtype) {
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let m = InputMajor::new(&w).unwrap();
                    let x = rng.vec(cols);
                    for share in [0.0f32, 0.4, 1.0] {
                        let keep: Vec<bool> =
                            (0..cols).map(|_| rng.uniform(0.0, 1.0) < share).collect();
                        let a = ActiveInput::new(&x, m.group, |i, _| keep[i]);
                        let (want, tol) = reference(&w, &x, &keep, m.group);
                        for level in simd::available() {
                            for threads in [1, 3] {
                                let mut y = vec![f32::NAN; rows];
                                pool(threads).install(|| {
                                    matvec_input_at(level, &[&m], &[&a], &mut [&mut y]).unwrap()
                                });
                                for r in 0..rows {
                                    let err = (y[r] as f64 - want[r] as f64).abs();
                                    assert!(
                                        err <= tol[r],
                                        "{dtype} {rows}x{cols} keep {share} {level:?} {threads}t \
                                         [{r}]: got {} want {} err {err:e} > {:e}",
                                        y[r],
                                        want[r],
                                        tol[r]
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn keeping_every_input_is_the_dense_matvec() {
        let mut rng = Rng::new(10);
        for dtype in [DType::Q4_1, DType::Q8_0, DType::F16, DType::Q4_K] {
            let cols = cols_of(dtype)[1];
            let w = random_weight(&mut rng, dtype, 300, cols);
            let m = InputMajor::new(&w).unwrap();
            let x = rng.vec(cols);
            let a = ActiveInput::new(&x, m.group, |_, _| true);
            assert_eq!(a.kept(), cols);
            let (mut y, mut dense) = (vec![0.0; 300], vec![0.0; 300]);
            matvec_input(&[&m], &[&a], &mut [&mut y]).unwrap();
            crate::matvec(&w, &x, &mut dense).unwrap();
            let (_, tol) = reference(&w, &x, &vec![true; cols], m.group);
            for r in 0..300 {
                // The dense matvec computes with the int8 x̂ on x86: it may sit that far off.
                let gap = crate::testutil::x8_gap(crate::simd::level(), dtype, w.row(r), &x);
                assert!(
                    (y[r] - dense[r]).abs() as f64 <= 2.0 * tol[r] + gap,
                    "{dtype} [{r}]"
                );
            }
        }
    }

    #[test]
    fn the_same_bits_on_every_pool() {
        // Units cut by the matrix, never by the thread count: the partial sums add in one
        // order whatever the pool (a row split too: more rows than UNIT_ROWS).
        let mut rng = Rng::new(15);
        for (rows, cols) in [(97, 320), (UNIT_ROWS + 70, 256)] {
            let w = random_weight(&mut rng, DType::Q8_0, rows, cols);
            let m = InputMajor::new(&w).unwrap();
            let x = rng.vec(cols);
            let a = ActiveInput::new(&x, 32, |_, v| v.abs() > 0.3);
            let run = |threads: usize| {
                let mut y = vec![0.0; rows];
                pool(threads).install(|| matvec_input(&[&m], &[&a], &mut [&mut y]).unwrap());
                y
            };
            let one = run(1);
            for t in [2, 3, 8] {
                assert_eq!(run(t), one, "{rows} rows on {t} threads");
            }
        }
    }

    #[test]
    fn several_matrices_in_one_call_and_repeatable() {
        let mut rng = Rng::new(11);
        let ws: Vec<Weight> = [(130, 96), (64, 96), (64, 96)]
            .iter()
            .map(|&(r, c)| random_weight(&mut rng, DType::Q4_0, r, c))
            .collect();
        let ms: Vec<InputMajor> = ws.iter().map(|w| InputMajor::new(w).unwrap()).collect();
        let x = rng.vec(96);
        let a = ActiveInput::new(&x, 32, |_, v| v.abs() > 0.8);
        let run = || {
            let mut ys = [vec![0.0; 130], vec![0.0; 64], vec![0.0; 64]];
            let [y0, y1, y2] = &mut ys;
            matvec_input(&[&ms[0], &ms[1], &ms[2]], &[&a, &a, &a], &mut [y0, y1, y2]).unwrap();
            ys
        };
        let first = run();
        for (k, w) in ws.iter().enumerate() {
            let mut one = vec![0.0; w.rows];
            matvec_input(&[&ms[k]], &[&a], &mut [&mut one]).unwrap();
            assert_eq!(one, first[k]);
        }
        assert_eq!(run(), first);
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let mut rng = Rng::new(12);
        let w = random_weight(&mut rng, DType::Q8_0, 40, 64);
        let m = InputMajor::new(&w).unwrap();
        let x = rng.vec(64);
        let a = ActiveInput::new(&x, 32, |_, _| true);
        let mut y = vec![0.0; 39];
        assert!(is_shape(matvec_input(&[&m], &[&a], &mut [&mut y])));
        let short = ActiveInput::new(&x[..32], 32, |_, _| true);
        let mut y = vec![0.0; 40];
        assert!(is_shape(matvec_input(&[&m], &[&short], &mut [&mut y])));
        let regrouped = ActiveInput::new(&x, 16, |_, _| true);
        assert!(is_shape(matvec_input(&[&m], &[&regrouped], &mut [&mut y])));
        assert!(is_shape(matvec_input(&[&m, &m], &[&a], &mut [&mut y])));
    }
}
