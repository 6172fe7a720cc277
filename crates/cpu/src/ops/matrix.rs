//! The dense products of matrices in either layout ([`MatrixRef`]): row-major weights go to
//! the row kernels' matvec, interleaved ones to [`super::interleaved`]'s, each product's bits
//! those of its layout's own op (so the same values alone or beside other matrices).

use crate::check;
use crate::operands::interleaved::Interleaved;
use crate::operands::matrix::MatrixRef;
use crate::simd::{self, Level};
use powerinfer_core::{Result, Weight};

use super::interleaved::{matvec_interleaved_many_at, matvec_interleaved_tokens_at};
use super::matvec::matvec_many_at;
use super::matvec_tokens::matvec_tokens_at;

/// y[r] = Σ_c W[r,c]·x[c] for every row, in parallel on the current rayon pool; `w` in either
/// layout (a [`Weight`] or a [`Matrix`](crate::Matrix)).
pub fn matvec<'a>(w: impl Into<MatrixRef<'a>>, x: &[f32], y: &mut [f32]) -> Result<()> {
    matvec_matrices_at(simd::level(), &[w.into()], x, &mut [y])
}

/// `ys[i] = ms[i]·x`: the row-major matrices in one parallel region, the interleaved ones in
/// another (each region preparing x once).
pub fn matvec_matrices(ms: &[MatrixRef<'_>], x: &[f32], ys: &mut [&mut [f32]]) -> Result<()> {
    matvec_matrices_at(simd::level(), ms, x, ys)
}

/// `ys[i][t·rows_i + r]` = dot(ms[i] row r, token t) for the `n` tokens of `x`, each token's
/// values the bits [`matvec_matrices`] gives it alone (speculative verification, slots).
pub fn matvec_matrices_tokens(
    ms: &[MatrixRef<'_>],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    check::len(
        "matvec_matrices_tokens",
        "ys",
        ys.len(),
        ms.len(),
        "one per matrix",
    )?;
    let level = simd::level();
    let (rows, mut ys_rows, il, ys_il) = split(ms, ys);
    if !rows.is_empty() {
        matvec_tokens_at(level, &rows, x, n, &mut ys_rows)?;
    }
    for (w, y) in il.into_iter().zip(ys_il) {
        matvec_interleaved_tokens_at(level, w, x, n, y)?;
    }
    Ok(())
}

/// [`matvec_matrices`] on a given SIMD level.
pub(crate) fn matvec_matrices_at(
    level: Level,
    ms: &[MatrixRef<'_>],
    x: &[f32],
    ys: &mut [&mut [f32]],
) -> Result<()> {
    check::len(
        "matvec_matrices",
        "ys",
        ys.len(),
        ms.len(),
        "one per matrix",
    )?;
    let (rows, mut ys_rows, il, mut ys_il) = split(ms, ys);
    if !rows.is_empty() {
        matvec_many_at(level, &rows, x, &mut ys_rows)?;
    }
    if !il.is_empty() {
        matvec_interleaved_many_at(level, &il, x, &mut ys_il)?;
    }
    Ok(())
}

/// The row-major matrices with their outputs, and the interleaved ones with theirs.
type Split<'w, 'y> = (
    Vec<&'w Weight>,
    Vec<&'y mut [f32]>,
    Vec<&'w Interleaved>,
    Vec<&'y mut [f32]>,
);

/// `ms` and `ys` parted by layout, each part in its order.
fn split<'w, 'y>(ms: &[MatrixRef<'w>], ys: &'y mut [&mut [f32]]) -> Split<'w, 'y> {
    let (mut rows, mut ys_rows, mut il, mut ys_il) = (vec![], vec![], vec![], vec![]);
    for (m, y) in ms.iter().zip(ys.iter_mut()) {
        match *m {
            MatrixRef::Rows(w) => {
                rows.push(w);
                ys_rows.push(&mut **y);
            }
            MatrixRef::Interleaved(w) => {
                il.push(w);
                ys_il.push(&mut **y);
            }
        }
    }
    (rows, ys_rows, il, ys_il)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operands::matrix::Matrix;
    use crate::ops::interleaved::matvec_interleaved_at;
    use crate::ops::matmul::matmul_at;
    use crate::simd::available;
    use crate::testutil::{random_weight, Rng};
    use powerinfer_core::DType;

    /// Each format's choice of layout, and the round trip back to the file's bytes.
    #[test]
    fn layouts_are_chosen_by_format_and_gather_back() {
        let mut rng = Rng::new(101);
        for (dtype, rows, cols, interleaved) in [
            (DType::Q4_0, 21, 64, true),
            (DType::Q4_1, 8, 64, true),
            (DType::Q4_0, 7, 64, false),
            (DType::Q8_0, 16, 64, true),
            (DType::Q4_K, 9, 512, true),
            (DType::Q6_K, 17, 256, false),
            (DType::Q5_0, 16, 64, true),
            (DType::Q5_1, 11, 96, true),
            (DType::Q5_K, 16, 256, true),
            (DType::Q3_K, 16, 256, false),
            (DType::F16, 16, 64, false),
        ] {
            let w = random_weight(&mut rng, dtype, rows, cols);
            let m = Matrix::for_products(w.clone()).unwrap();
            assert_eq!(m.is_interleaved(), interleaved, "{dtype} x {rows}");
            assert_eq!((m.rows(), m.cols(), m.dtype()), (rows, cols, dtype));
            assert_eq!((m.n_bytes(), m.row_bytes()), (w.n_bytes(), w.row_bytes()));
            assert_eq!(m.to_rows().unwrap().bytes(), w.bytes());
            assert!((0..rows).all(|r| *m.row(r) == *w.row(r)));
            // Rows by index: the weight itself, or a copy gathered once and kept.
            assert_eq!(m.indexed().unwrap().bytes(), w.bytes());
            assert_eq!(m.has_indexed_copy(), interleaved);
            let again = m.indexed().unwrap().data.as_ptr();
            assert_eq!(again, m.indexed().unwrap().data.as_ptr());
        }
    }

    /// A batched product reads an interleaved matrix as the row-major weight it came from: the
    /// same bits on every level, for a count of tokens on either tile.
    #[test]
    fn matmul_of_interleaved_rows_is_the_row_major_bits() {
        let mut rng = Rng::new(102);
        let pool = crate::testutil::pool(2);
        for level in available() {
            for dtype in [DType::Q4_0, DType::Q4_1] {
                for (rows, n) in [(37, 2), (16, 5), (300, 3)] {
                    let cols = 96;
                    let w = random_weight(&mut rng, dtype, rows, cols);
                    let m = Matrix::for_products(w.clone()).unwrap();
                    let x = rng.vec(n * cols);
                    let run = |m: MatrixRef<'_>| {
                        let mut y = vec![0f32; n * rows];
                        pool.install(|| matmul_at(level, m, &x, n, &mut y)).unwrap();
                        y
                    };
                    let (a, b) = (run((&w).into()), run(m.view()));
                    assert!(
                        a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{level:?} {dtype} {rows} x {n}"
                    );
                }
            }
        }
    }

    /// Mixed layouts in one call: each matrix gets its own layout's op's bits, alone and for
    /// several tokens (each token's values those of the one-token call).
    #[test]
    fn each_matrix_takes_its_layouts_bits() {
        let mut rng = Rng::new(103);
        let cols = 160;
        let rows_w = random_weight(&mut rng, DType::Q8_0, 19, cols);
        let il = Matrix::for_products(random_weight(&mut rng, DType::Q4_1, 27, cols)).unwrap();
        let Matrix::Interleaved(ilw, _) = &il else {
            panic!("Q4_1 x 27 is interleaved")
        };
        let ms = [MatrixRef::from(&rows_w), il.view()];
        let n = 3;
        let x = rng.vec(n * cols);
        let level = simd::level();
        let mut ya = vec![0f32; n * 19];
        let mut yb = vec![0f32; n * 27];
        matvec_matrices_tokens(&ms, &x, n, &mut [&mut ya, &mut yb]).unwrap();
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            let (mut a, mut b) = (vec![0f32; 19], vec![0f32; 27]);
            matvec_matrices_at(level, &ms, xt, &mut [&mut a, &mut b]).unwrap();
            let (mut a1, mut b1) = (vec![0f32; 19], vec![0f32; 27]);
            matvec_many_at(level, &[&rows_w], xt, &mut [&mut a1]).unwrap();
            matvec_interleaved_at(level, ilw, xt, &mut b1).unwrap();
            assert_eq!((&a, &b), (&a1, &b1), "token {t} in one call");
            assert_eq!(
                &ya[t * 19..(t + 1) * 19],
                &a[..],
                "token {t} of the batch, rows"
            );
            assert_eq!(
                &yb[t * 27..(t + 1) * 27],
                &b[..],
                "token {t} of the batch, groups"
            );
        }
        let short = matvec_matrices_at(level, &ms, &x[..cols], &mut [&mut ya]);
        assert!(crate::testutil::is_shape(short));
    }
}
