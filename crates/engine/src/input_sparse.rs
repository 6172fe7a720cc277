//! The `input` sparsity mode (TEAL/WINA style): per layer and projection input ("site"), the
//! entries whose score falls below a calibrated threshold are zero, and a decode step reads only
//! the input-major columns of the rest ([`powerinfer_cpu::matvec_input`]).
//!
//! Sites, one threshold each per layer ([`SITES`]):
//! - `attn_in`: the attention's normed input, read by q, k and v;
//! - `attn_out`: the attention's output, read by the output projection;
//! - `ffn_in`: the FFN's normed input, read by gate and up;
//! - `down_in`: the FFN's values `act(gate)·up`, read by down (threshold mode's site; on a
//!   ReLU model threshold 0 skips exactly the neurons that do not fire);
//!
//! and optionally the output head's input (one threshold for the model; 0 reads it densely).
//! Scores: `teal` is |x_i|; `wina` is |x_i|·‖W[:, i]‖ (the column norm over the site's
//! matrices together), which keeps the inputs that move the output most. The context's first
//! position (the attention sink) stays dense, as in threshold mode. Several tokens at once
//! (prefill, scoring) run the dense products on the masked inputs: the same function.

use std::str::FromStr;

use std::collections::HashMap;

use powerinfer_core::{bail, ensure, DType, Error, Result};
use powerinfer_cpu::{matvec_input, ActiveInput, InputMajor, Matrix, MatrixRef};
use rayon::prelude::*;

use crate::env::share_from_env;
use crate::layer::ModelProgram;
use crate::layer_weights::LayerWeights;

/// The sites' names, in the order of a layer's thresholds.
pub const SITES: [&str; 4] = ["attn_in", "attn_out", "ffn_in", "down_in"];

/// A projection input of a layer (index into [`SITES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    AttnIn = 0,
    AttnOut = 1,
    FfnIn = 2,
    DownIn = 3,
}

/// How an input entry is scored against its threshold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InputScore {
    /// |x_i| (TEAL).
    #[default]
    Teal,
    /// |x_i|·‖W[:, i]‖ (WINA).
    Wina,
}

impl InputScore {
    /// Both scores, as the CLIs list them.
    pub const ALL: [InputScore; 2] = [InputScore::Teal, InputScore::Wina];

    /// The name the Python API and the threshold files use.
    pub fn name(self) -> &'static str {
        match self {
            InputScore::Teal => "teal",
            InputScore::Wina => "wina",
        }
    }
}

impl FromStr for InputScore {
    type Err = Error;

    fn from_str(s: &str) -> Result<InputScore> {
        match InputScore::ALL.into_iter().find(|m| m.name() == s) {
            Some(m) => Ok(m),
            None => bail!(Unsupported, "input score {s:?} (choose teal or wina)"),
        }
    }
}

/// The `input` mode's parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSparsity {
    /// Per layer, one threshold per site ([`SITES`] order).
    pub thresholds: Vec<[f32; 4]>,
    /// The output head's input threshold (0: dense).
    pub output: f32,
    pub score: InputScore,
}

impl InputSparsity {
    /// Check it fits a model of `n_layers` layers.
    pub fn validate(&self, n_layers: usize) -> Result<()> {
        ensure!(
            self.thresholds.len() == n_layers,
            Plan,
            "input thresholds for {} layers, the model has {n_layers}",
            self.thresholds.len()
        );
        let all = self.thresholds.iter().flatten().chain([&self.output]);
        ensure!(
            all.into_iter().all(|v| v.is_finite() && *v >= 0.0),
            Plan,
            "input thresholds must be finite and >= 0"
        );
        Ok(())
    }
}

/// One layer's input-major copies.
#[derive(Clone, Debug)]
pub struct LayerCopies {
    pub q: InputMajor,
    pub k: InputMajor,
    pub v: InputMajor,
    pub o: InputMajor,
    pub gate: InputMajor,
    pub up: Option<InputMajor>,
    pub down: InputMajor,
    /// WINA's column norms per site.
    pub norms: [Vec<f32>; 4],
}

/// The input-major copies of every layer's projections (and, built separately, of the output
/// head), with WINA's column norms.
#[derive(Clone, Debug)]
pub struct InputCopies {
    pub layers: Vec<LayerCopies>,
    /// Per matrix shape and format, the share of kept inputs above which one token's product is
    /// taken as the dense matvec over the masked input (see [`input_crossover_share`]).
    pub crossover: HashMap<ShapeKey, f32>,
}

/// A matrix's format, rows and cols.
pub type ShapeKey = (DType, usize, usize);

/// Environment variable pinning every crossover of the input mode (a share of kept inputs in
/// 0..=1: 0 always takes the dense product of the masked input, 1 always the input-major one),
/// instead of the formats' table.
pub const INPUT_CROSSOVER_ENV: &str = "POWERINFER_RS_INPUT_CROSSOVER";

/// The share of kept inputs above which one token's product with a `dtype` matrix is taken as
/// the dense matvec over the masked input rather than over the kept columns of the input-major
/// copy: where the two take the same time in `cargo bench -p powerinfer-cpu --bench input`
/// (5632 x 2048, 2 threads, out of cache) on a 2-core AVX-512 machine, rounded to 0.05. Q4_0,
/// Q4_1, Q8_0 and F16 were measured (the speed-up crosses 1 at 35-40% skipped); the other
/// formats take their neighbours' share.
///
/// A table, not a timing: the two products sum in different orders, so which one a token takes
/// decides its bits, and the choice must depend on the inputs alone for decoding to give the
/// same bits in every process (a crossover timed per process gave different greedy texts).
pub fn input_crossover_share(dtype: DType) -> f32 {
    match dtype {
        DType::Q4_1 | DType::F16 | DType::BF16 | DType::F32 => 0.65,
        _ => 0.6,
    }
}

/// The output head's copy and its column norms.
#[derive(Clone, Debug)]
pub struct OutputCopy {
    pub w: InputMajor,
    pub norms: Vec<f32>,
    /// See [`InputCopies::crossover`].
    pub crossover: f32,
}

/// ‖W[:, i]‖ over the rows of all of `ws` (same columns), in f64, as f32.
pub fn column_norms(ws: &[MatrixRef<'_>]) -> Result<Vec<f32>> {
    let cols = ws.first().map_or(0, |w| w.cols());
    let mut sum = vec![0.0f64; cols];
    for w in ws {
        ensure!(
            w.cols() == cols,
            Shape,
            "column norms of matrices of different widths"
        );
        let part = (0..w.rows())
            .into_par_iter()
            .fold(
                || (vec![0.0f64; cols], vec![0.0f32; cols]),
                |(mut acc, mut row), r| {
                    if powerinfer_cpu::dequantize_row(w.dtype(), &w.row(r), &mut row).is_ok() {
                        acc.iter_mut()
                            .zip(&row)
                            .for_each(|(a, &v)| *a += v as f64 * v as f64);
                    }
                    (acc, row)
                },
            )
            .map(|(acc, _)| acc)
            .reduce(
                || vec![0.0f64; cols],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                    a
                },
            );
        sum.iter_mut().zip(&part).for_each(|(s, p)| *s += p);
    }
    Ok(sum.into_iter().map(|s| s.sqrt() as f32).collect())
}

impl InputCopies {
    /// Build every layer's copies (on the calling thread pool) from the model's `layers` and
    /// its `program`.
    pub fn build(weights: &[LayerWeights], program: &ModelProgram) -> Result<InputCopies> {
        let layers = weights
            .iter()
            .zip(&program.layers)
            .map(|(l, p)| {
                let up = match p.ffn_kind().gated {
                    true => Some(InputMajor::new(&*l.w_up.to_rows()?)?),
                    false => None,
                };
                let mut ffn_in = vec![l.w_gate.view()];
                if up.is_some() {
                    ffn_in.push(l.w_up.view());
                }
                // The attention's rows in the file's layout (gathered back where interleaved).
                let [wq, wk, wv, wo] = [&l.wq, &l.wk, &l.wv, &l.wo].map(|m| m.to_rows());
                let (wq, wk, wv, wo) = (wq?, wk?, wv?, wo?);
                Ok(LayerCopies {
                    q: InputMajor::new(&wq)?,
                    k: InputMajor::new(&wk)?,
                    v: InputMajor::new(&wv)?,
                    o: InputMajor::new(&wo)?,
                    gate: InputMajor::new(&*l.w_gate.to_rows()?)?,
                    up,
                    down: InputMajor::new(&*l.w_down.to_rows()?)?,
                    norms: [
                        column_norms(&[(&*wq).into(), (&*wk).into(), (&*wv).into()])?,
                        column_norms(&[(&*wo).into()])?,
                        column_norms(&ffn_in)?,
                        column_norms(&[l.w_down.view()])?,
                    ],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let crossover = crossovers(weights, &layers)?;
        Ok(InputCopies { layers, crossover })
    }

    /// The crossover of a matrix (see [`InputCopies::crossover`]); 1 for a shape not listed.
    pub fn crossover_of(&self, m: &InputMajor) -> f32 {
        self.crossover
            .get(&(m.dtype, m.rows, m.cols))
            .copied()
            .unwrap_or(1.0)
    }

    /// Bytes of every copy (the extra memory of the mode, beside the original weights).
    pub fn n_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|c| {
                let up = c.up.as_ref().map_or(0, InputMajor::n_bytes);
                [&c.q, &c.k, &c.v, &c.o, &c.gate, &c.down]
                    .iter()
                    .map(|m| m.n_bytes())
                    .sum::<usize>()
                    + up
            })
            .sum()
    }
}

/// Every (format, rows, cols) of the copies' matrices and its crossover: pinned by
/// [`INPUT_CROSSOVER_ENV`], else the format's [`input_crossover_share`].
fn crossovers(weights: &[LayerWeights], layers: &[LayerCopies]) -> Result<HashMap<ShapeKey, f32>> {
    let pinned = share_from_env(INPUT_CROSSOVER_ENV)?;
    let mut out = HashMap::new();
    for (lw, cp) in weights.iter().zip(layers) {
        let up = cp.up.as_ref().map(|_| lw.w_up.view());
        let attn = [&lw.wq, &lw.wk, &lw.wv, &lw.wo].map(|m| m.view());
        let ffn = [&lw.w_gate, &lw.w_down].map(|m| m.view());
        for w in attn.into_iter().chain(ffn).chain(up) {
            let c = pinned.unwrap_or_else(|| input_crossover_share(w.dtype()));
            out.insert((w.dtype(), w.rows(), w.cols()), c);
        }
    }
    Ok(out)
}

impl OutputCopy {
    /// The copy of the output head `output`.
    pub fn build(output: &Matrix) -> Result<OutputCopy> {
        let rows = output.to_rows()?;
        let w = InputMajor::new(&rows)?;
        let crossover = share_from_env(INPUT_CROSSOVER_ENV)?
            .unwrap_or_else(|| input_crossover_share(output.dtype()));
        Ok(OutputCopy {
            w,
            norms: column_norms(&[(&*rows).into()])?,
            crossover,
        })
    }
}

/// Whether entry `i` of value `x` passes `t` under `score` (column norms `norms`).
#[inline]
pub fn keeps(score: InputScore, norms: &[f32], t: f32, i: usize, x: f32) -> bool {
    match score {
        InputScore::Teal => x.abs() >= t,
        InputScore::Wina => x.abs() * norms[i] >= t,
    }
}

/// Zero the entries of `x` (rows of `norms.len()`) a site drops, from row `from` on (the
/// batched passes' mask; rows before `from` are the context's first position, kept dense).
pub fn mask_rows(score: InputScore, norms: &[f32], t: f32, x: &mut [f32], from: usize) {
    let width = norms.len();
    if t <= 0.0 || width == 0 {
        return;
    }
    for row in x.chunks_exact_mut(width).skip(from) {
        for (i, v) in row.iter_mut().enumerate() {
            if !keeps(score, norms, t, i, *v) {
                *v = 0.0;
            }
        }
    }
}

/// Reusable [`ActiveInput`]s of one decode step (one per group length in use).
#[derive(Clone, Debug, Default)]
pub struct InputScratch {
    acts: Vec<ActiveInput>,
    groups: Vec<usize>,
    /// The masked input of the dense fallback.
    xm: Vec<f32>,
}

/// One matrix of a site for [`project_kept`]: the weight, its input-major copy and crossover.
pub struct SiteMatrix<'a> {
    pub w: MatrixRef<'a>,
    pub m: &'a InputMajor,
    pub crossover: f32,
}

/// `w` with its copy `m` and the copies' crossover for it.
pub fn site_matrix<'a>(
    ic: &InputCopies,
    w: impl Into<MatrixRef<'a>>,
    m: &'a InputMajor,
) -> SiteMatrix<'a> {
    SiteMatrix {
        w: w.into(),
        m,
        crossover: ic.crossover_of(m),
    }
}

/// `ys[k] = W_k · x` over the entries of one token's `x` that the site keeps (`t`, `score`,
/// `norms`): through the input-major copy where the share kept is at most the matrix's
/// crossover, else as the dense matvec over the masked input (the same function). Returns the
/// share of entries kept.
#[allow(clippy::too_many_arguments)]
pub fn project_kept(
    mats: &[SiteMatrix<'_>],
    x: &[f32],
    score: InputScore,
    norms: &[f32],
    t: f32,
    s: &mut InputScratch,
    ys: &mut [&mut [f32]],
) -> Result<f32> {
    // The share kept first (one cheap pass): the matrices past their crossover need no
    // active list.
    let n_kept = match score {
        InputScore::Teal => x.iter().filter(|v| v.abs() >= t).count(),
        InputScore::Wina => x
            .iter()
            .zip(norms)
            .filter(|(v, n)| v.abs() * **n >= t)
            .count(),
    };
    let kept = n_kept as f32 / x.len().max(1) as f32;
    s.groups.clear();
    for sm in mats.iter().filter(|sm| kept <= sm.crossover) {
        if !s.groups.contains(&sm.m.group_len()) {
            s.groups.push(sm.m.group_len());
        }
    }
    s.acts.resize_with(s.groups.len(), ActiveInput::default);
    for (a, &g) in s.acts.iter_mut().zip(&s.groups) {
        a.fill(x, g, |i, v| keeps(score, norms, t, i, v));
    }
    let (mut sparse_m, mut sparse_a, mut sparse_y) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dense_w, mut dense_y) = (Vec::new(), Vec::new());
    for (sm, y) in mats.iter().zip(ys.iter_mut()) {
        if kept <= sm.crossover {
            let k = s
                .groups
                .iter()
                .position(|&g| g == sm.m.group_len())
                .unwrap_or(0);
            sparse_m.push(sm.m);
            sparse_a.push(&s.acts[k]);
            sparse_y.push(&mut **y);
        } else {
            dense_w.push(sm.w);
            dense_y.push(&mut **y);
        }
    }
    if !sparse_m.is_empty() {
        matvec_input(&sparse_m, &sparse_a, &mut sparse_y)?;
    }
    if !dense_w.is_empty() {
        s.xm.clear();
        s.xm.extend_from_slice(x);
        mask_rows(score, norms, t, &mut s.xm, 0);
        powerinfer_cpu::matvec_matrices(&dense_w, &s.xm, &mut dense_y)?;
    }
    Ok(kept)
}
