//! `_core.Predictors`: every layer's activation predictor as one typed object, built once from
//! the trained arrays (borrowed, no copy; the engine transposes fc2) and handed to sessions.

use powerinfer_engine::{ExpertPredictors, LayerPredictor, PredictorInput, Predictors};
use pyo3::prelude::*;

use crate::convert::weight_from_matrix;
use crate::exceptions::{check, run_detached};

/// Per-layer predictors `logits = fc2 · ReLU(fc1 · x)`, neuron active when its logit is at
/// least the layer's threshold.
#[pyclass(module = "powerinfer_rs._core", name = "Predictors", frozen)]
pub struct PyPredictors {
    pub inner: Predictors,
}

#[pymethods]
impl PyPredictors {
    /// `fc1[i]`: float16/float32 array (rank, dim), or a `(dtype, rows, cols, uint8 array)`
    /// tuple of a block format as a file stores it (PowerInfer's Q4_0 predictors); `fc2[i]`:
    /// (ffn, rank) as trained, likewise;
    /// `thresholds[i]`: the logit threshold; `input`: "ffn_norm" (the normed FFN input, our
    /// predictors) or "ffn_inp" (the residual stream, PowerInfer's). Raises `PlanError` when the
    /// lists or shapes disagree.
    ///
    /// `experts` (a mixture of experts): one `(layer, expert)` pair per entry of the lists,
    /// whose predictors are then per routed expert (an expert without one runs exact-relu).
    #[new]
    #[pyo3(signature = (fc1, fc2, thresholds, input = "ffn_norm", experts = None))]
    fn new(
        py: Python<'_>,
        fc1: Vec<Bound<'_, PyAny>>,
        fc2: Vec<Bound<'_, PyAny>>,
        thresholds: Vec<f32>,
        input: &str,
        experts: Option<Vec<(usize, usize)>>,
    ) -> PyResult<Self> {
        let input: PredictorInput = check(input.parse())?;
        check(if fc1.len() == fc2.len() && fc2.len() == thresholds.len() {
            Ok(())
        } else {
            Err(powerinfer_core::Error::Plan(format!(
                "{} fc1, {} fc2 and {} thresholds: one of each per layer",
                fc1.len(),
                fc2.len(),
                thresholds.len()
            )))
        })?;
        let mut parts = Vec::with_capacity(fc1.len());
        for (i, (a, b)) in fc1.iter().zip(&fc2).enumerate() {
            let a = check(weight_from_matrix(&format!("predictor {i} fc1"), a))?;
            let b = check(weight_from_matrix(&format!("predictor {i} fc2"), b))?;
            parts.push((a, b, thresholds[i]));
        }
        let layers = run_detached(py, move || {
            parts
                .into_iter()
                .enumerate()
                .map(|(i, (a, b, t))| {
                    LayerPredictor::new(a, b, t).map_err(|e| match e {
                        powerinfer_core::Error::Plan(m) => {
                            powerinfer_core::Error::Plan(format!("predictor {i}: {m}"))
                        }
                        other => other,
                    })
                })
                .collect::<powerinfer_core::Result<Vec<_>>>()
        })?;
        let Some(units) = experts else {
            return Ok(PyPredictors {
                inner: Predictors {
                    layers,
                    input,
                    experts: Vec::new(),
                },
            });
        };
        check(expert_table(units, layers)).map(|experts| PyPredictors {
            inner: Predictors {
                layers: Vec::new(),
                input,
                experts,
            },
        })
    }

    /// Layers (with per-expert predictors: layers up to the last one holding any).
    #[getter]
    fn n_layers(&self) -> usize {
        self.inner.layers.len().max(self.inner.experts.len())
    }

    /// Experts holding a predictor (0 for per-layer predictors).
    #[getter]
    fn n_expert_predictors(&self) -> usize {
        self.inner.experts.iter().flatten().flatten().count()
    }

    /// Each layer's rank (fc1's rows).
    #[getter]
    fn ranks(&self) -> Vec<usize> {
        self.inner.layers.iter().map(|l| l.fc1.rows).collect()
    }

    /// "ffn_norm" or "ffn_inp".
    #[getter]
    fn input(&self) -> &'static str {
        match self.inner.input {
            PredictorInput::FfnNorm => "ffn_norm",
            PredictorInput::FfnInp => "ffn_inp",
        }
    }
}

/// The per-(layer, expert) table of `predictors`, entry i belonging to `units[i]`; a unit given
/// twice is an error.
fn expert_table(
    units: Vec<(usize, usize)>,
    predictors: Vec<LayerPredictor>,
) -> powerinfer_core::Result<ExpertPredictors> {
    /// Far beyond any model's layers or experts (a guard against absurd indices).
    const MAX_INDEX: usize = 1 << 16;
    powerinfer_core::ensure!(
        units.len() == predictors.len(),
        Plan,
        "{} (layer, expert) pairs for {} predictors",
        units.len(),
        predictors.len()
    );
    let mut table: ExpertPredictors = Vec::new();
    for ((l, e), p) in units.into_iter().zip(predictors) {
        powerinfer_core::ensure!(
            l < MAX_INDEX && e < MAX_INDEX,
            Plan,
            "expert predictor ({l}, {e}) out of range"
        );
        if table.len() <= l {
            table.resize_with(l + 1, Vec::new);
        }
        let row = &mut table[l];
        if row.len() <= e {
            row.resize_with(e + 1, || None);
        }
        powerinfer_core::ensure!(
            row[e].is_none(),
            Plan,
            "two predictors for layer {l} expert {e}"
        );
        row[e] = Some(p);
    }
    Ok(table)
}
