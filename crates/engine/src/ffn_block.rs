//! A layer's FFN block on the CPU, as its program's steps say (norm, the FFN or the experts in
//! each row's mode, down bias, post-norm, residual); decode rows of a sparse mode run one token
//! at a time, so each reads its own rows.

use powerinfer_core::Result;

use crate::ffn::{Arith, FfnCall};
use crate::input_ffn::ffn_in_mode;
use crate::layer::{FfnInput, FfnStep};
use crate::moe_step::moe_rows;
use crate::pass_rows::Rows;
use crate::pass_scratch::{add_rows, norm_bias, norm_rows, norm_rows_with, Scratch};
use crate::phases::{mark, Phase};
use crate::profiler::Profiler;
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// Layer `l`'s FFN block (its program's steps) for the `n` tokens in `s.x` (each in its row's
/// mode and at its position, `rows`), added to the residual.
pub(crate) fn ffn_block(
    model: &ModelWeights,
    l: usize,
    rows: &Rows<'_>,
    s: &mut Scratch,
    mut profiler: Option<&mut Profiler>,
    n: usize,
) -> Result<()> {
    let c = &model.config;
    let lw = &model.layers[l];
    let mut phase = Phase::Other;
    let uniform = rows.uniform();
    let per_token =
        s.arith == Arith::Steps && n > 1 && !matches!(uniform, Some((Sparsity::Dense, _)));
    for step in &model.program.layers[l].ffn {
        let x_in = match model.program.layers[l].ffn_input() {
            FfnInput::Saved => &s.par_in,
            FfnInput::Residual => &s.x,
        };
        match step {
            FfnStep::Norm(kind, _) => {
                let b = norm_bias(lw, *kind, 1)?;
                norm_rows_with(x_in, &lw.ffn_norm, b, c.rms_eps, &mut s.xn);
                mark(Phase::Other);
            }
            // Decode steps of a sparse mode read each token's own rows: one call per token.
            FfnStep::Ffn(_) if per_token => {
                let dim = c.dim;
                s.down.resize(n * dim, 0.0);
                let mut row = Vec::with_capacity(dim);
                for t in 0..n {
                    let (mode, start) = rows.at(t);
                    let call = FfnCall {
                        model,
                        layer: l,
                        mode,
                        x_res: &x_in[t * dim..(t + 1) * dim],
                        xn: &s.xn[t * dim..(t + 1) * dim],
                        n: 1,
                        start,
                        arith: Arith::Batch,
                    };
                    phase = ffn_in_mode(&call, &mut s.ffn, None, &mut row)?;
                    s.down[t * dim..(t + 1) * dim].copy_from_slice(&row);
                }
            }
            FfnStep::Ffn(_) => {
                let Some((mode, start)) = uniform else {
                    powerinfer_core::bail!(Other, "layer {l}: rows of several modes in one pass");
                };
                let call = FfnCall {
                    model,
                    layer: l,
                    mode,
                    x_res: x_in,
                    xn: &s.xn,
                    n,
                    start,
                    arith: s.arith,
                };
                phase = ffn_in_mode(&call, &mut s.ffn, profiler.as_deref_mut(), &mut s.down)?;
            }
            FfnStep::Moe(kind) => {
                moe_rows(model, l, *kind, rows, s, profiler.as_deref_mut(), n)?;
                phase = Phase::Ffn;
            }
            FfnStep::DownBias => {
                if let Some([_, b]) = &lw.ffn_bias {
                    add_rows(&mut s.down, b);
                }
            }
            FfnStep::PostNorm => {
                if let Some([_, post]) = &lw.post_norms {
                    norm_rows(&s.down, post, c.rms_eps, &mut s.o);
                    std::mem::swap(&mut s.o, &mut s.down);
                }
            }
            FfnStep::Residual => {
                s.x.iter_mut().zip(&s.down).for_each(|(x, d)| *x += d);
                mark(phase);
            }
        }
    }
    Ok(())
}
