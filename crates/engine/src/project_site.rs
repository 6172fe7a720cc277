//! One input site's projections (the attention's q/k/v and output, the output head) in any
//! mode, the kept/masked/dense choice written once: outside the input mode, or at a threshold
//! of 0, the dense product; in it, one token past the context's dense start reads only the
//! input entries the site keeps ([`project_kept`]), and other rows are masked and multiplied
//! densely (the same function).

use powerinfer_core::Result;
use powerinfer_cpu::MatrixRef;

use crate::ffn::{project_many, Arith};
use crate::input_sparse::{mask_rows, project_kept, InputScratch, InputSparsity, Site, SiteMatrix};
use crate::sparsity::Sparsity;

/// How the input mode reads one site's projections for `n` tokens at `start..`.
pub(crate) enum SiteRead<'a> {
    /// Another mode, or a threshold of 0: the dense product.
    Dense,
    /// The input-sparse decode product of one token past the dense start.
    Kept(&'a InputSparsity, f32),
    /// The dense product of the inputs masked from row `.2` on.
    Masked(&'a InputSparsity, f32, usize),
}

impl<'a> SiteRead<'a> {
    /// How `mode` reads a site of threshold `t` (None outside the input mode).
    pub(crate) fn new(mode: &'a Sparsity, t: Option<f32>, start: usize, n: usize) -> Self {
        match (mode, t) {
            (Sparsity::Input(p), Some(t)) if t > 0.0 => match mode.dense_rows(start, n) {
                0 if n == 1 => SiteRead::Kept(p, t),
                dense => SiteRead::Masked(p, t, dense),
            },
            _ => SiteRead::Dense,
        }
    }

    /// How `mode` reads layer `l`'s `site`.
    pub(crate) fn at(mode: &'a Sparsity, l: usize, site: Site, start: usize, n: usize) -> Self {
        SiteRead::new(mode, site_threshold(mode, l, site), start, n)
    }
}

/// Layer `l`'s threshold of `site` in the input mode.
pub(crate) fn site_threshold(mode: &Sparsity, l: usize, site: Site) -> Option<f32> {
    match mode {
        Sparsity::Input(p) => Some(p.thresholds[l][site as usize]),
        _ => None,
    }
}

/// A site's matrices as the input mode reads them: each with its input-major copy, and the
/// column norms its score weighs the inputs by.
pub(crate) struct SiteCopies<'a, const K: usize> {
    pub mats: [SiteMatrix<'a>; K],
    pub norms: &'a [f32],
}

/// `ys[k] = dense[k] · x` for the `n` rows of `x`, as `read` says: `copies` is asked for only
/// in the input mode, and a masked read zeroes the dropped entries of `x` in place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_site<'a, const K: usize>(
    read: SiteRead<'_>,
    dense: [MatrixRef<'a>; K],
    copies: impl FnOnce() -> Result<SiteCopies<'a, K>>,
    x: &mut [f32],
    n: usize,
    input: &mut InputScratch,
    ys: [&mut Vec<f32>; K],
    arith: Arith,
) -> Result<()> {
    match read {
        SiteRead::Kept(p, t) => {
            let c = copies()?;
            let mut outs: Vec<&mut [f32]> = Vec::with_capacity(K);
            for (y, w) in ys.into_iter().zip(&dense) {
                y.resize(w.rows(), 0.0);
                outs.push(y.as_mut_slice());
            }
            project_kept(&c.mats, x, p.score, c.norms, t, input, &mut outs)?;
            Ok(())
        }
        SiteRead::Masked(p, t, from) => {
            mask_rows(p.score, copies()?.norms, t, x, from);
            project_many(dense, x, n, ys, arith)
        }
        SiteRead::Dense => project_many(dense, x, n, ys, arith),
    }
}
