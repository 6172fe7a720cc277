//! `_core.Session`: a KV cache and thread pool over a shared model; prefill and decode.

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use powerinfer_core::Error;
use powerinfer_engine::forward::Logits;
use powerinfer_engine::Session;
use pyo3::prelude::*;

use crate::exceptions::{check, run_detached};
use crate::model::PyModel;

/// One context (KV cache) over a model, with its own worker threads.
#[pyclass(module = "powerinfer_rs._core", name = "Session")]
pub struct PySession {
    inner: Session,
}

#[pymethods]
impl PySession {
    /// A fresh session: `threads` workers (0 = one per core), `n_ctx` positions (0 = the
    /// model's context length).
    #[new]
    #[pyo3(signature = (model, threads = 0, n_ctx = 0))]
    fn new(py: Python<'_>, model: &PyModel, threads: usize, n_ctx: usize) -> PyResult<Self> {
        let weights = model.weights.clone();
        let inner = check(py, Session::new(weights, threads, n_ctx))?;
        Ok(PySession { inner })
    }

    /// Append `tokens` to the context and return float32 logits: shape (1, vocab) for the last
    /// token, or (len(tokens), vocab) with `all_logits=True`. On error the context is unchanged.
    #[pyo3(signature = (tokens, all_logits = false))]
    fn feed<'py>(
        &mut self,
        py: Python<'py>,
        tokens: Vec<i64>,
        all_logits: bool,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let vocab = self.inner.model().config.vocab_size;
        let ids = check(
            py,
            tokens
                .iter()
                .map(|&t| {
                    u32::try_from(t)
                        .ok()
                        .filter(|&u| (u as usize) < vocab)
                        .ok_or_else(|| {
                            Error::Token(format!(
                                "token id {t} is outside the vocabulary 0..{vocab}"
                            ))
                        })
                })
                .collect::<Result<Vec<u32>, Error>>(),
        )?;
        let which = if all_logits {
            Logits::All
        } else {
            Logits::Last
        };
        let session = &mut self.inner;
        let logits = run_detached(py, move || {
            let check_signals =
                || Python::attach(|py| py.check_signals()).map_err(|_| Error::Interrupted);
            session.feed(&ids, which, check_signals)
        })?;
        let rows = logits.len() / vocab;
        let arr = Array2::from_shape_vec((rows, vocab), logits)
            .map_err(|e| crate::exceptions::to_pyerr(py, Error::Other(e.to_string())))?;
        Ok(arr.into_pyarray(py))
    }

    /// Forget the whole context.
    fn reset(&mut self) {
        self.inner.reset();
    }

    /// Keep only the first `n` positions of the context.
    fn truncate(&mut self, n: usize) {
        self.inner.truncate(n);
    }

    /// Positions in the context.
    #[getter]
    fn n_past(&self) -> usize {
        self.inner.n_past()
    }

    /// Context size in positions.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// Worker threads.
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads()
    }

    /// Bytes the KV cache holds now.
    #[getter]
    fn kv_cache_bytes(&self) -> usize {
        self.inner.kv_cache_bytes()
    }
}
