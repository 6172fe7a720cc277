//! How the FFN chooses its active neurons: dense, exact-relu, calibrated thresholds, or
//! PowerInfer-style predictors (logits = fc2 · ReLU(fc1 · x), active when logit >= threshold).

use std::str::FromStr;

use powerinfer_core::{bail, ensure, Activation, Error, ModelConfig, Result, Weight};

use crate::input_sparse::InputSparsity;

pub use crate::modes::SparsityMode;

/// What the predictor reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredictorInput {
    /// The FFN input after RMSNorm (our trained predictors).
    FfnNorm,
    /// The residual stream before the FFN norm (PowerInfer's predictors).
    FfnInp,
}

impl FromStr for PredictorInput {
    type Err = Error;

    /// `"ffn_norm"` or `"ffn_inp"`, as predictor files record it.
    fn from_str(s: &str) -> Result<PredictorInput> {
        match s {
            "ffn_norm" => Ok(PredictorInput::FfnNorm),
            "ffn_inp" => Ok(PredictorInput::FfnInp),
            other => bail!(
                Unsupported,
                "predictor input {other:?} (choose ffn_norm or ffn_inp)"
            ),
        }
    }
}

/// One layer's predictor.
#[derive(Clone, Debug)]
pub struct LayerPredictor {
    /// [rank, dim]
    pub fc1: Weight,
    /// fc2 transposed, [rank, ffn]: one contiguous row per hidden unit, so only the units that
    /// ReLU leaves nonzero are read.
    pub fc2_t: Weight,
    pub threshold: f32,
}

impl LayerPredictor {
    /// From fc1 ([rank, dim]) and fc2 as trained and stored ([ffn, rank]); fc2 is transposed
    /// here, once.
    pub fn new(fc1: Weight, fc2: Weight, threshold: f32) -> Result<LayerPredictor> {
        ensure!(
            fc1.rows > 0 && fc1.cols > 0 && fc2.rows > 0,
            Plan,
            "empty predictor: fc1 {}x{}, fc2 {}x{}",
            fc1.rows,
            fc1.cols,
            fc2.rows,
            fc2.cols
        );
        ensure!(
            fc2.cols == fc1.rows,
            Plan,
            "fc1 has rank {} but fc2 has {} columns",
            fc1.rows,
            fc2.cols
        );
        ensure!(
            threshold.is_finite(),
            Plan,
            "threshold {threshold} is not finite"
        );
        let fc2_t = crate::transpose::transpose(&fc2)?;
        Ok(LayerPredictor {
            fc1,
            fc2_t,
            threshold,
        })
    }
}

/// Predictors per (layer, expert) of a mixture of experts: `experts[l][e]` predicts which of
/// expert `e`'s neurons fire in layer `l` from the FFN input (after the norm); None where the
/// expert has none (it did not pay, or saw too few tokens): that expert then runs exact-relu
/// (every gate, then the up and down rows of the neurons that fire), which for a SiLU expert is
/// its dense function.
pub type ExpertPredictors = Vec<Vec<Option<LayerPredictor>>>;

/// Every layer's predictor and what they read: the typed object the bindings hand over.
#[derive(Clone, Debug)]
pub struct Predictors {
    /// One per layer (dense FFN models); empty for a mixture of experts.
    pub layers: Vec<LayerPredictor>,
    pub input: PredictorInput,
    /// Per layer and expert (a mixture of experts); empty for a dense FFN model.
    pub experts: ExpertPredictors,
}

/// The FFN's sparsity mode.
#[derive(Clone, Debug, Default)]
pub enum Sparsity {
    /// Every neuron, the exact reference.
    #[default]
    Dense,
    /// Compute the gate fully, skip up/down rows whose ReLU output is 0 (ReLU models only).
    ExactRelu,
    /// Compute gate and up fully, skip the down rows of neurons whose contribution
    /// |act(gate)·up| is below the layer's threshold. (Thresholding |act(gate)| alone, CATS
    /// style, cost SmolLM2-135M +26% perplexity at 50% sparsity against +2% for this rule.)
    /// The context's first token (position 0) keeps every neuron: it is the attention sink
    /// every later token reads, and sparsifying it costs SmolLM2-135M up to a quarter of the
    /// perplexity increase at 50% sparsity (float64 reference, 2048 held-out tokens: +2.76%
    /// sparse, +2.11% dense; the engine on bench_sparse.py's held-out text: +2.45% -> +2.12%,
    /// on a later 8192 tokens +2.45% -> +2.43%), for one dense FFN per context.
    Threshold(Vec<f32>),
    /// A predictor per layer picks the active set before any FFN row is read (a mixture of
    /// experts: a predictor per routed expert, see [`ExpertPredictors`]).
    Predictor {
        layers: Vec<LayerPredictor>,
        input: PredictorInput,
        experts: ExpertPredictors,
    },
    /// Every projection's input loses its entries below the site's threshold, and a decode step
    /// reads only the input-major columns of the rest (see [`crate::input_sparse`]). The
    /// context's first token stays dense, as in threshold mode.
    Input(InputSparsity),
}

impl Sparsity {
    /// How many of `n` tokens starting at position `start` this mode computes densely: the
    /// first token of the context in threshold mode, none otherwise.
    pub fn dense_rows(&self, start: usize, n: usize) -> usize {
        match self {
            Sparsity::Threshold(_) | Sparsity::Input(_) if start == 0 => n.min(1),
            _ => 0,
        }
    }

    /// The mode `mode` with its parameters: `thresholds` for threshold mode, `predictors` for
    /// predictor mode ([`Error::Plan`] when the mode's parameter is missing).
    pub fn new(
        mode: SparsityMode,
        thresholds: Option<Vec<f32>>,
        predictors: Option<Predictors>,
    ) -> Result<Sparsity> {
        Ok(match mode {
            SparsityMode::Dense => Sparsity::Dense,
            SparsityMode::ExactRelu => Sparsity::ExactRelu,
            SparsityMode::Threshold => match thresholds {
                Some(t) => Sparsity::Threshold(t),
                None => bail!(Plan, "threshold mode needs thresholds"),
            },
            SparsityMode::Predictor => match predictors {
                Some(p) => Sparsity::Predictor {
                    layers: p.layers,
                    input: p.input,
                    experts: p.experts,
                },
                None => bail!(Plan, "predictor mode needs predictors"),
            },
            SparsityMode::Input => bail!(
                Plan,
                "input mode needs its per-site thresholds (Sparsity::Input)"
            ),
        })
    }

    /// The mode without its parameters.
    pub fn mode(&self) -> SparsityMode {
        match self {
            Sparsity::Dense => SparsityMode::Dense,
            Sparsity::ExactRelu => SparsityMode::ExactRelu,
            Sparsity::Threshold(_) => SparsityMode::Threshold,
            Sparsity::Predictor { .. } => SparsityMode::Predictor,
            Sparsity::Input(_) => SparsityMode::Input,
        }
    }

    /// The mode a dense FFN layer `l` runs: this one, but exact-relu in predictor mode where
    /// the layer has no predictor of its own (a mixture of experts' leading dense layers, as
    /// its experts without one: the dense function of a SiLU layer).
    pub fn for_dense_layer(&self, l: usize) -> &Sparsity {
        static EXACT_RELU: Sparsity = Sparsity::ExactRelu;
        match self {
            Sparsity::Predictor { layers, .. } if layers.get(l).is_none() => &EXACT_RELU,
            other => other,
        }
    }

    /// Name as the Python API spells it.
    pub fn name(&self) -> &'static str {
        self.mode().name()
    }

    /// Check the mode fits the model of config `c` (layers, widths, activation; a mixture of
    /// experts takes dense, exact-relu, threshold or per-expert predictor mode).
    pub fn validate(&self, c: &ModelConfig) -> Result<()> {
        let (n_layers, dim, ffn, act) = (c.n_layers, c.dim, c.ffn_dim, c.activation);
        let moe = c.moe.is_moe();
        if !matches!(self, Sparsity::Dense) {
            c.refuse_non_flat("a sparse mode")?;
        }
        match self {
            Sparsity::Dense => {}
            Sparsity::ExactRelu => ensure!(
                act == Activation::Relu,
                Unsupported,
                "exact-relu sparsity needs a ReLU model; this one uses {act:?} (use threshold)"
            ),
            Sparsity::Threshold(t) => {
                ensure!(
                    t.len() == n_layers,
                    Plan,
                    "{} thresholds for a {n_layers}-layer model",
                    t.len()
                );
                ensure!(
                    t.iter().all(|v| v.is_finite() && *v >= 0.0),
                    Plan,
                    "thresholds must be finite and >= 0"
                );
            }
            Sparsity::Input(p) => {
                if moe {
                    crate::modes::refuse(SparsityMode::Input, crate::modes::Place::MoeCpu)?;
                }
                p.validate(n_layers)?
            }
            Sparsity::Predictor {
                layers,
                experts,
                input,
            } if moe => {
                // No expert may have a predictor (none paid): every expert runs exact-relu,
                // and so do the leading dense layers (GLM-4.5's), which take none.
                ensure!(
                    layers.is_empty(),
                    Plan,
                    "a mixture of experts takes predictors per expert (trained from its own \
                     profile), not {} per-layer ones",
                    layers.len()
                );
                if let Some(l) = (0..experts.len().min(c.moe.dense_lead))
                    .find(|&l| experts[l].iter().any(Option::is_some))
                {
                    bail!(Plan, "expert predictors for layer {l}, a dense layer");
                }
                ensure!(
                    *input == PredictorInput::FfnNorm,
                    Plan,
                    "expert predictors read the FFN input after its norm (ffn_norm)"
                );
                ensure!(
                    experts.len() <= n_layers,
                    Plan,
                    "expert predictors for {} layers, the model has {n_layers}",
                    experts.len()
                );
                let ef = c.moe.expert_ffn(ffn);
                for (l, row) in experts.iter().enumerate() {
                    ensure!(
                        row.len() <= c.moe.n_expert,
                        Plan,
                        "layer {l}: predictors for {} experts, the model has {}",
                        row.len(),
                        c.moe.n_expert
                    );
                    for (e, p) in row.iter().enumerate() {
                        if let Some(p) = p {
                            check_predictor(p, &format!("layer {l} expert {e}"), dim, ef)?;
                        }
                    }
                }
            }
            Sparsity::Predictor {
                layers, experts, ..
            } => {
                ensure!(
                    experts.is_empty(),
                    Plan,
                    "predictors per expert for a model without experts"
                );
                ensure!(
                    layers.len() == n_layers,
                    Plan,
                    "predictors for {} layers, the model has {n_layers}",
                    layers.len()
                );
                for (i, p) in layers.iter().enumerate() {
                    check_predictor(p, &i.to_string(), dim, ffn)?;
                }
            }
        }
        Ok(())
    }
}

/// Check predictor `name` reads `dim` values and predicts `ffn` neurons, with a finite threshold.
fn check_predictor(p: &LayerPredictor, name: &str, dim: usize, ffn: usize) -> Result<()> {
    ensure!(
        p.fc1.cols == dim && p.fc2_t.cols == ffn && p.fc1.rows == p.fc2_t.rows,
        Plan,
        "predictor {name}: fc1 {}x{}, fc2 {}x{} do not fit dim {dim}, ffn {ffn}",
        p.fc1.rows,
        p.fc1.cols,
        p.fc2_t.cols,
        p.fc2_t.rows
    );
    ensure!(
        p.threshold.is_finite(),
        Plan,
        "predictor {name}: threshold is not finite"
    );
    Ok(())
}

/// Whether a neuron whose FFN value (act(gate)·up, or act(gate)) is `h` counts as active, in
/// ReLU semantics (`threshold` None: h != 0) or threshold semantics (|h| >= threshold).
#[inline]
pub fn is_active(h: f32, threshold: Option<f32>) -> bool {
    match threshold {
        None => h != 0.0,
        Some(t) => h.abs() >= t,
    }
}

/// Reusable buffers of the predictor (hidden units, their nonzero list, logits), so decoding
/// allocates nothing per token.
#[derive(Clone, Debug, Default)]
pub struct PredictorScratch {
    hidden: Vec<f32>,
    idx: Vec<u32>,
    vals: Vec<f32>,
    pub logits: Vec<f32>,
}

impl PredictorScratch {
    /// Bytes of `p`'s weights the last [`predictor_logits`] on this scratch read: fc1 whole,
    /// and the fc2 rows of the hidden units ReLU left nonzero.
    pub fn bytes_read(&self, p: &LayerPredictor) -> u64 {
        let fc2_row = p.fc2_t.data.len() / p.fc2_t.rows.max(1);
        (p.fc1.data.len() + fc2_row * self.idx.len()) as u64
    }
}

/// Predictor logits for one input row into `s.logits`: fc2 · ReLU(fc1 · x), with fc2 read only
/// for the hidden units ReLU leaves nonzero.
pub fn predictor_logits(p: &LayerPredictor, x: &[f32], s: &mut PredictorScratch) -> Result<()> {
    s.hidden.resize(p.fc1.rows, 0.0);
    powerinfer_cpu::matvec(&p.fc1, x, &mut s.hidden)?;
    s.idx.clear();
    s.vals.clear();
    for (i, &h) in s.hidden.iter().enumerate() {
        if h > 0.0 {
            s.idx.push(i as u32);
            s.vals.push(h);
        }
    }
    s.logits.clear();
    s.logits.resize(p.fc2_t.cols, 0.0);
    powerinfer_cpu::axpy_rows(&p.fc2_t, &s.idx, &s.vals, &mut s.logits)
}

/// Zero the entries of `row` (one token's FFN values, h = act(gate)·up) of the neurons the
/// predictor does not mark active for input `x`: predictor mode on a batch, the function the
/// one-token path computes by reading the marked rows only.
pub fn mask_unpredicted(
    p: &LayerPredictor,
    x: &[f32],
    row: &mut [f32],
    s: &mut PredictorScratch,
) -> Result<()> {
    predictor_logits(p, x, s)?;
    // A neuron is active when its logit is at least the threshold (a NaN logit is not).
    let active = |l: f32| l >= p.threshold;
    row.iter_mut()
        .zip(&s.logits)
        .filter(|(_, &l)| !active(l))
        .for_each(|(h, _)| *h = 0.0);
    Ok(())
}

/// The neurons a predictor marks active for input `x`, into `active` (replacing its contents).
pub fn predicted_active(
    p: &LayerPredictor,
    x: &[f32],
    s: &mut PredictorScratch,
    active: &mut Vec<u32>,
) -> Result<()> {
    predictor_logits(p, x, s)?;
    active.clear();
    active.extend(
        s.logits
            .iter()
            .enumerate()
            .filter(|(_, l)| **l >= p.threshold)
            .map(|(i, _)| i as u32),
    );
    Ok(())
}
