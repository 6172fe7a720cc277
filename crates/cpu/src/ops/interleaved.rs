//! The dense matvec of weights whose rows are interleaved by eight
//! ([`Interleaved`](crate::operands::interleaved::Interleaved)): each weight's groups split
//! into one rayon task per thread, all the weights' tasks in one region, each group's eight rows
//! computed together by the dispatched kernel, the row-major tail rows by the matvec's own.

use crate::check;
use crate::dispatch::{Activations, Tokens};
use crate::operands::interleaved::{Interleaved, BATCH_GROUPS, GROUP_ROWS};
use crate::simd::{self, Level};
use powerinfer_core::Result;
use rayon::prelude::*;

/// Groups per rayon task, at least (a group of 2048 columns is 9 KiB of Q4_0): one batch of
/// the store's layout, and tasks cut at whole batches, so each task reads one run of the store.
const MIN_TASK_GROUPS: usize = BATCH_GROUPS;

/// Groups per task of a weight of `groups` groups on `threads` threads: one task per thread,
/// whole batches, at least [`MIN_TASK_GROUPS`].
fn task_groups(groups: usize, threads: usize) -> usize {
    groups
        .div_ceil(threads)
        .next_multiple_of(BATCH_GROUPS)
        .max(MIN_TASK_GROUPS)
}

/// y[r] = Σ_c W[r,c]·x[c] for every row of the interleaved `w`, on the current rayon pool.
pub fn matvec_interleaved(w: &Interleaved, x: &[f32], y: &mut [f32]) -> Result<()> {
    matvec_interleaved_at(simd::level(), w, x, y)
}

/// Several interleaved matvecs over the same `x` (q/k/v, gate/up) in one parallel region:
/// `ys[i] = ws[i]·x`, each the bits [`matvec_interleaved`] gives it; x is quantized once and the
/// products share one fork-join (at 2 threads a fork-join per 6 MB product cost a third of the
/// read rate: `examples/interleaved_matvec`).
pub fn matvec_interleaved_many(
    ws: &[&Interleaved],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    matvec_interleaved_many_at(simd::level(), ws, x, ys)
}

/// [`matvec_interleaved`] on a given SIMD level.
pub(crate) fn matvec_interleaved_at(
    level: Level,
    w: &Interleaved,
    x: &[f32],
    y: &mut [f32],
) -> Result<()> {
    matvec_interleaved_many_at(level, &[w], x, &mut [y])
}

/// [`matvec_interleaved_many`] on a given SIMD level.
pub(crate) fn matvec_interleaved_many_at(
    level: Level,
    ws: &[&Interleaved],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    let what = "matvec_interleaved";
    check::len(what, "ys", ys.len(), ws.len(), "one per weight")?;
    let Some(cols) = ws.first().map(|w| w.cols) else {
        return Ok(());
    };
    for (w, y) in ws.iter().zip(ys.iter()) {
        check::len(what, "cols", w.cols, cols, "the first weight's cols")?;
        check::len(what, "y", y.len(), w.rows, "the weight's rows")?;
    }
    check::len(what, "x", x.len(), cols, "the weights' cols")?;
    let act = Activations::new(level, x, true);
    let threads = rayon::current_num_threads().max(1);
    // (weight, first group, its outputs): each weight's groups cut as it alone would be.
    let mut tasks: Vec<(&Interleaved, usize, &mut [f32])> = Vec::new();
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let (grouped, tail_out) = y.split_at_mut(w.groups() * GROUP_ROWS);
        let (tail, rb) = w.tail();
        act.rows_dot(w.dtype, tail, rb, tail_out);
        // One task per thread and weight: long runs of groups keep each thread's reads one
        // stream (eight 6 MB products in one region on 2 threads: 26–32 GB/s, against 17–25
        // with four tasks per thread and weight; `examples/interleaved_matvec`).
        let per = task_groups(w.groups(), threads) * GROUP_ROWS;
        for (i, out) in grouped.chunks_mut(per).enumerate() {
            tasks.push((w, i * per / GROUP_ROWS, out));
        }
    }
    tasks
        .into_par_iter()
        .for_each(|(w, g0, out)| act.interleaved_groups(w, g0, out));
    Ok(())
}

/// `y[t·rows + r]` = dot(row r, token t) for the `n` tokens of `x` (n rows of the weight's
/// columns): speculative verification and parallel slots. Each block is unpacked once for up to
/// four tokens, and each token's values are the bits [`matvec_interleaved`] gives it alone.
pub fn matvec_interleaved_tokens(
    w: &Interleaved,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    matvec_interleaved_tokens_at(simd::level(), w, x, n, y)
}

/// [`matvec_interleaved_tokens`] on a given SIMD level.
pub(crate) fn matvec_interleaved_tokens_at(
    level: Level,
    w: &Interleaved,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<()> {
    let what = "matvec_interleaved_tokens";
    check::len(what, "x", x.len(), n * w.cols, "tokens x cols")?;
    check::len(what, "y", y.len(), n * w.rows, "tokens x rows")?;
    if n == 0 {
        return Ok(());
    }
    let tokens = Tokens::new(level, x, w.cols, true);
    let grouped = w.groups() * GROUP_ROWS;
    let mut per_token: Vec<(&mut [f32], &mut [f32])> = y
        .chunks_mut(w.rows.max(1))
        .map(|t| t.split_at_mut(grouped))
        .collect();
    let (tail, rb) = w.tail();
    let mut tails: Vec<&mut [f32]> = per_token.iter_mut().map(|(_, t)| &mut **t).collect();
    tokens.rows_dot(w.dtype, tail, rb, &mut tails);
    let threads = rayon::current_num_threads().max(1);
    let per = task_groups(w.groups(), threads) * GROUP_ROWS;
    let mut chunks: Vec<_> = per_token
        .into_iter()
        .map(|(g, _)| g.chunks_mut(per))
        .collect();
    let mut tasks: Vec<(usize, Vec<&mut [f32]>)> = Vec::new();
    for i in 0..grouped.div_ceil(per) {
        tasks.push((
            i * per / GROUP_ROWS,
            chunks.iter_mut().filter_map(|c| c.next()).collect(),
        ));
    }
    tasks
        .into_par_iter()
        .for_each(|(g0, mut outs)| tokens.interleaved_groups(w, g0, &mut outs));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::Numerics;
    use crate::reference::{abs_dot_row, dot_row_f64};
    use crate::simd::available;
    use crate::testutil::{random_weight, Rng, DOT_ABS_TOL, DOT_REL_TOL};
    use powerinfer_core::DType;

    /// The formats with an interleaved layout.
    const FORMATS: [DType; 8] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// Interleaving moves bytes only: every row gathers back to its GGUF bytes.
    #[test]
    fn rows_gather_back_to_their_bytes() {
        let mut rng = Rng::new(91);
        for dtype in FORMATS {
            // Past a batch of groups and a column tile too (139 rows: 17 groups and a tail;
            // 2240 or 2304 columns: two tiles, the second partial).
            let wide = 2304 / dtype.block_size() * dtype.block_size();
            for (rows, cols) in [(1, 3), (8, 3), (13, 3), (24, 3), (31, 3), (139, 0)] {
                let cols = match cols {
                    0 if dtype.block_size() == 32 => 2240,
                    0 => wide,
                    n => n * dtype.block_size(),
                };
                let w = random_weight(&mut rng, dtype, rows, cols);
                let il = Interleaved::new(&w).unwrap();
                assert_eq!(il.data.len(), w.bytes().len());
                for r in 0..rows {
                    assert_eq!(il.row(r), w.row(r), "{dtype} rows {rows} row {r}");
                }
            }
        }
        let f = random_weight(&mut rng, DType::Q3_K, 8, 256);
        assert!(matches!(
            Interleaved::new(&f),
            Err(powerinfer_core::Error::Unsupported(_))
        ));
    }

    /// Every level and both numerics, odd shapes (tails of rows, 1..=9 blocks, an outlier): each
    /// row within the f32 roundings of the float64 dot with the x the kernel computes with (x̂ of
    /// the numerics' quantization on the x86 levels, x itself on the scalar one).
    #[test]
    fn matches_float64_on_the_same_x_at_every_level() {
        let mut rng = Rng::new(92);
        for (level, dtype) in available()
            .into_iter()
            .flat_map(|l| FORMATS.map(|d| (l, d)))
        {
            for numerics in [Numerics::Int16, Numerics::Int8] {
                // The last: 17 groups (past a batch), two column tiles (the second partial).
                for (rows, blocks) in [(8, 1), (16, 3), (21, 9), (43, 5), (5, 2), (139, 70)] {
                    let blocks = if dtype.block_size() == 256 {
                        blocks.min(9)
                    } else {
                        blocks
                    };
                    let cols = dtype.block_size() * blocks;
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let il = Interleaved::new(&w).unwrap();
                    let mut x = rng.vec(cols);
                    x[cols / 2] = 70.0;
                    let act = Activations::with_numerics(level, numerics, &x, true);
                    let mut y = vec![f32::NAN; rows];
                    let g = il.groups() * GROUP_ROWS;
                    act.interleaved_groups(&il, 0, &mut y[..g]);
                    let (tail, rb) = il.tail();
                    act.rows_dot(il.dtype, tail, rb, &mut y[g..]);
                    let seen = seen_x(level, numerics, &x);
                    for (r, &got) in y.iter().enumerate() {
                        let want = dot_row_f64(dtype, w.row(r), &seen);
                        let scale = abs_dot_row(dtype, w.row(r), &seen);
                        let mut tol = match level.is_x86_simd() {
                            true => crate::testutil::x8_tol(cols) * scale,
                            false => DOT_REL_TOL * scale + DOT_ABS_TOL,
                        };
                        if numerics == Numerics::Int16 && level.is_x86_simd() {
                            // The int16 x's mins take the sums of x itself, as its row kernels:
                            // Σ_b m_b·(Σx_b − Σx̂_b) on top.
                            tol += min_gap(dtype, w.row(r), &x, &seen);
                        }
                        assert!(
                            (got as f64 - want).abs() <= tol + 1e-30,
                            "{level:?} {dtype} {numerics:?} rows {rows} blocks {blocks} row {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Σ_b |m_b|·|Σx_b − Σx̂_b| over a row's 32-weight blocks, m_b the block's weight at zero
    /// quants (Q4_1's and Q5_1's min, Q4_K's and Q5_K's −dmin·m; zero for the formats without mins), plus the f32
    /// rounding of the sums.
    fn min_gap(dtype: DType, row: &[u8], x: &[f32], seen: &[f32]) -> f64 {
        let quants = match dtype {
            DType::Q4_1 => 4..20,
            DType::Q5_1 => 4..24,
            DType::Q4_K => 16..144,
            DType::Q5_K => 16..176,
            _ => return 0.0,
        };
        let mut zeroed = row.to_vec();
        for blk in zeroed.chunks_exact_mut(dtype.block_bytes()) {
            blk[quants.clone()].fill(0);
        }
        let mut at_zero = vec![0f32; x.len()];
        powerinfer_core::dequantize_row(dtype, &zeroed, &mut at_zero).unwrap();
        at_zero
            .chunks_exact(32)
            .zip(x.chunks_exact(32).zip(seen.chunks_exact(32)))
            .map(|(m, (a, b))| {
                let m = m[0].abs() as f64;
                let d: f64 = a.iter().zip(b).map(|(&u, &v)| u as f64 - v as f64).sum();
                m * d.abs() + 1e-7 * m * a.iter().map(|v| v.abs() as f64).sum::<f64>()
            })
            .sum()
    }

    /// The x the kernels compute with: x̂ of the numerics' quantization on the x86 levels (the
    /// int16 one as `kernels::avx2::int16` defines it: a scale max|x| / 32639 per 32-block,
    /// ties to even), x itself on the scalar level.
    fn seen_x(level: Level, numerics: Numerics, x: &[f32]) -> Vec<f32> {
        match (level.is_x86_simd(), numerics) {
            (true, Numerics::Int8) => crate::reference::x8::x8_hat(x).unwrap(),
            (true, Numerics::Int16) => x
                .chunks_exact(32)
                .flat_map(|b| {
                    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let inv = if amax > 0.0 { 32639.0 / amax } else { 0.0 };
                    b.iter()
                        .map(move |&v| (v * inv).round_ties_even() * (amax / 32639.0))
                })
                .collect(),
            _ => x.to_vec(),
        }
    }

    /// Several tokens at once (runs of four and the rest, a token that is not finite among
    /// them), every level and both numerics: each token's values are its own call's bits.
    #[test]
    fn tokens_together_are_each_token_alone() {
        let mut rng = Rng::new(94);
        for level in available() {
            for numerics in [Numerics::Int16, Numerics::Int8] {
                for (dtype, rows, n, bad) in [
                    (DType::Q4_0, 43, 6, None),
                    (DType::Q4_1, 24, 5, None),
                    (DType::Q8_0, 35, 7, None),
                    (DType::Q4_K, 19, 6, None),
                    (DType::Q4_0, 16, 3, Some(1)),
                    (DType::Q8_0, 16, 2, Some(0)),
                    (DType::Q4_K, 8, 3, Some(2)),
                    (DType::Q6_K, 27, 5, None),
                    (DType::Q5_0, 21, 4, None),
                    (DType::Q5_1, 16, 3, Some(2)),
                    (DType::Q5_K, 17, 4, None),
                ] {
                    let cols = 3 * dtype.block_size();
                    let il = Interleaved::new(&random_weight(&mut rng, dtype, rows, cols)).unwrap();
                    let mut x = rng.vec(n * cols);
                    if let Some(t) = bad {
                        x[t * cols + 7] = f32::NAN;
                    }
                    let mut y = vec![0f32; n * rows];
                    let run = |x: &[f32], n, y: &mut [f32]| {
                        let tokens = Tokens::new_with(level, numerics, x, cols, true);
                        tokens_into(&tokens, &il, n, y)
                    };
                    run(&x, n, &mut y);
                    for t in 0..n {
                        let mut alone = vec![0f32; rows];
                        run(&x[t * cols..(t + 1) * cols], 1, &mut alone);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        let got = &y[t * rows..(t + 1) * rows];
                        assert_eq!(
                            bits(got),
                            bits(&alone),
                            "{level:?} {numerics:?} {dtype} t{t}"
                        );
                    }
                }
            }
        }
        let il = Interleaved::new(&random_weight(&mut rng, DType::Q4_0, 16, 64)).unwrap();
        assert!(crate::testutil::is_shape(matvec_interleaved_tokens(
            &il,
            &[0.0; 64],
            2,
            &mut [0.0; 32]
        )));
    }

    /// [`matvec_interleaved_tokens_at`]'s body on prepared tokens (so a test can pick the
    /// numerics).
    fn tokens_into(tokens: &Tokens<'_>, w: &Interleaved, n: usize, y: &mut [f32]) {
        let grouped = w.groups() * GROUP_ROWS;
        let mut parts: Vec<(&mut [f32], &mut [f32])> = y
            .chunks_mut(w.rows)
            .map(|t| t.split_at_mut(grouped))
            .take(n)
            .collect();
        let (tail, rb) = w.tail();
        let mut tails: Vec<&mut [f32]> = parts.iter_mut().map(|(_, t)| &mut **t).collect();
        tokens.rows_dot(w.dtype, tail, rb, &mut tails);
        let mut outs: Vec<&mut [f32]> = parts.into_iter().map(|(g, _)| g).collect();
        tokens.interleaved_groups(w, 0, &mut outs);
    }

    /// Every format with an interleaved layout has a kernel in each numerics' table at every x86
    /// level, and no other format has one (the scalar level reads rows gathered back).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_kernel_tables_cover_every_interleaved_format() {
        use crate::kernels::avx2::interleaved::{kernel_i16, kernel_i8};
        for dtype in DType::ALL {
            let fits = Interleaved::fits_shape(powerinfer_core::MatrixShape {
                dtype,
                rows: 8,
                cols: 256,
            });
            for wide in [false, true] {
                assert_eq!(
                    kernel_i16::<1>(dtype, wide).is_some(),
                    fits,
                    "{dtype} int16"
                );
                assert_eq!(kernel_i8::<3>(dtype, wide).is_some(), fits, "{dtype} int8");
            }
        }
    }

    /// The op on a pool of several threads gives the one-thread bits, and checks its sizes.
    #[test]
    fn the_same_bits_on_any_pool_and_shape_errors() {
        let mut rng = Rng::new(93);
        let w = random_weight(&mut rng, DType::Q4_0, 1029, 256);
        let il = Interleaved::new(&w).unwrap();
        let x = rng.vec(256);
        let run = |n| {
            let mut y = vec![0f32; 1029];
            crate::testutil::pool(n)
                .install(|| matvec_interleaved(&il, &x, &mut y))
                .unwrap();
            y
        };
        assert_eq!(run(1), run(3));
        // Several weights in one region: each the bits of its own call.
        let v = Interleaved::new(&random_weight(&mut rng, DType::Q4_1, 77, 256)).unwrap();
        let (mut a, mut b) = (vec![0f32; 1029], vec![0f32; 77]);
        crate::testutil::pool(3)
            .install(|| matvec_interleaved_many(&[&il, &v], &x, &mut [&mut a, &mut b]))
            .unwrap();
        let mut alone = vec![0f32; 77];
        matvec_interleaved(&v, &x, &mut alone).unwrap();
        assert_eq!((a, b), (run(1), alone));
        // Five tokens through the op on three threads: each its own call's bits.
        let xs = rng.vec(5 * 256);
        let mut y5 = vec![0f32; 5 * 1029];
        crate::testutil::pool(3)
            .install(|| matvec_interleaved_tokens(&il, &xs, 5, &mut y5))
            .unwrap();
        for (t, got) in y5.chunks(1029).enumerate() {
            let mut one = vec![0f32; 1029];
            matvec_interleaved(&il, &xs[t * 256..(t + 1) * 256], &mut one).unwrap();
            assert_eq!(got, &one[..], "token {t}");
        }
        assert!(crate::testutil::is_shape(matvec_interleaved(
            &il,
            &x[..32],
            &mut [0.0; 1029]
        )));
        assert!(crate::testutil::is_shape(matvec_interleaved(
            &il,
            &x,
            &mut [0.0; 3]
        )));
    }
}
