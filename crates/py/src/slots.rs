//! `_core.decode_slots`: decode steps of several sessions in one forward pass (the server's
//! parallel slots), each row bit-identical to its session's own one-token step.

use std::sync::MutexGuard;

use numpy::PyArray2;
use powerinfer_core::Error;
use powerinfer_engine::{token_ids, Session};
use pyo3::prelude::*;

use crate::exceptions::{check, run_detached, to_pyerr};
use crate::session::{matrix, PySession};

/// One pass over several sessions of one model: session i takes `tokens[i]` (one token for a
/// decode step, more for speculative verification) after its context, and gets float32 logits
/// of shape (len(tokens[i]), vocab); every row is bit-identical to what `feed([token])` of that
/// session alone gives after the tokens before it, whatever else is in the pass. The weights
/// are read once for all rows; attention runs per session over its own KV cache. Sessions must
/// be distinct and over the same model; the pass runs on the first one's threads (hybrid
/// sessions run one after the other). On any error no session's context changes.
#[pyfunction]
#[pyo3(signature = (sessions, tokens))]
pub fn decode_slots<'py>(
    py: Python<'py>,
    sessions: Vec<Bound<'py, PySession>>,
    tokens: Vec<Vec<i64>>,
) -> PyResult<Vec<Bound<'py, PyArray2<f32>>>> {
    if sessions.len() != tokens.len() {
        let msg = format!(
            "{} sessions but {} token lists",
            sessions.len(),
            tokens.len()
        );
        return Err(to_pyerr(py, Error::Shape(msg)));
    }
    let refs: Vec<&PySession> = sessions.iter().map(|s| s.get()).collect();
    // Locked in address order (two calls over the same sessions never wait on each other).
    let mut order: Vec<usize> = (0..refs.len()).collect();
    order.sort_by_key(|&i| refs[i] as *const PySession as usize);
    if order
        .windows(2)
        .any(|w| std::ptr::eq(refs[w[0]], refs[w[1]]))
    {
        let msg = "a session appears twice in one decode_slots call".to_string();
        return Err(to_pyerr(py, Error::Shape(msg)));
    }
    let mut guards: Vec<Option<MutexGuard<'_, Session>>> = (0..refs.len()).map(|_| None).collect();
    for &i in &order {
        guards[i] = Some(refs[i].lock(py));
    }
    let mut held: Vec<MutexGuard<'_, Session>> = guards.into_iter().flatten().collect();
    let vocab = held.first().map_or(0, |s| s.model().config.vocab_size);
    let ids = tokens
        .iter()
        .map(|t| check(token_ids(t, vocab)))
        .collect::<PyResult<Vec<_>>>()?;
    let mut all: Vec<&mut Session> = held.iter_mut().map(|g| &mut **g).collect();
    let out = run_detached(py, move || Session::decode_slots(&mut all, &ids))?;
    out.into_iter().map(|l| matrix(py, vocab, l)).collect()
}
