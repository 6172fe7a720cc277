//! Whole-model checks on a tiny random model: batched prefill equals token-by-token decoding,
//! chunked prefill equals one pass, and bad input is refused without touching the context.

mod common;

use std::collections::HashMap;

use common::{config, diff_and_norm, model, no_check, tensors};
use powerinfer_core::{Activation, Error, Weight};
use powerinfer_engine::forward::Logits;
use powerinfer_engine::{ModelWeights, Session, Sparsity};

/// Relative tolerance between two computations of the same logits in f32.
const TOL: f32 = 1e-4;

fn assert_close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let (diff, norm) = diff_and_norm(a, b);
    assert!(diff <= TOL * norm, "relative difference {}", diff / norm);
}

#[test]
fn prefill_equals_token_by_token() {
    for act in [Activation::Silu, Activation::Relu] {
        let m = model(act);
        let tokens: Vec<u32> = (0..300).map(|i| (i * 7 % 50) as u32).collect();
        let mut batch = Session::new(m.clone(), 3, 0).unwrap();
        // 300 tokens span two prefill chunks.
        let all = batch.feed(&tokens, Logits::All, no_check).unwrap();
        let mut single = Session::new(m.clone(), 2, 0).unwrap();
        let vocab = m.config.vocab_size;
        for (i, &t) in tokens.iter().enumerate() {
            let last = single.feed(&[t], Logits::Last, no_check).unwrap();
            assert_close(&last, &all[i * vocab..(i + 1) * vocab]);
        }
        assert_eq!(single.n_past(), 300);
    }
}

#[test]
fn bad_input_leaves_the_context_alone() {
    let m = model(Activation::Silu);
    let mut s = Session::new(m, 1, 10).unwrap();
    s.feed(&[1, 2, 3], Logits::Last, no_check).unwrap();
    assert!(matches!(
        s.feed(&[1, 99], Logits::Last, no_check),
        Err(Error::Token(_))
    ));
    assert!(matches!(
        s.feed(&[1; 8], Logits::Last, no_check),
        Err(Error::ContextOverflow(_))
    ));
    assert!(matches!(
        s.feed(&[], Logits::Last, no_check),
        Err(Error::Shape(_))
    ));
    assert_eq!(s.n_past(), 3);
    // An interrupt between prefill chunks rolls back too.
    let mut long = Session::new(model(Activation::Silu), 1, 0).unwrap();
    let tokens = vec![1u32; 400];
    let r = long.feed(&tokens, Logits::Last, || Err(Error::Interrupted));
    assert!(matches!(r, Err(Error::Interrupted)));
    assert_eq!(long.n_past(), 0);
}

#[test]
fn missing_or_misshapen_tensors_are_refused() {
    let c = config(Activation::Silu);
    let mut t = HashMap::new();
    t.insert(
        "token_embd".to_string(),
        Weight::from_f32(c.vocab_size, c.dim, &vec![0.0; c.vocab_size * c.dim]).unwrap(),
    );
    let err = ModelWeights::from_tensors(c.clone(), t.clone()).unwrap_err();
    assert!(matches!(err, Error::ModelFile(_)), "{err}");
    t.insert(
        "output_norm".into(),
        Weight::from_f32(1, 3, &[1.0; 3]).unwrap(),
    );
    let err = ModelWeights::from_tensors(c, t).unwrap_err();
    assert!(matches!(err, Error::Shape(_)), "{err}");
}

#[test]
fn threshold_decode_is_the_same_function_on_both_down_paths() {
    // Token-by-token threshold decoding with the down product always as axpy over down_t rows
    // (crossover 1) and always as the dense matvec over the masked values (crossover 0) gives
    // the batched (dense GEMM + mask) logits either way.
    let tokens: Vec<u32> = (0..40).map(|i| (i * 11 % 50) as u32).collect();
    let mut want: Option<Vec<f32>> = None;
    for crossover in [1.0f32, 0.0] {
        let m = model(Activation::Silu);
        assert!(m.set_down_crossover(crossover));
        assert!(!m.set_down_crossover(0.5), "set once");
        assert_eq!(m.down_crossover().unwrap(), crossover);
        let mode = || Sparsity::Threshold(vec![0.02; m.config.n_layers]);
        let mut batch = Session::new(m.clone(), 2, 0).unwrap();
        batch.set_sparsity(mode()).unwrap();
        let all = batch.feed(&tokens, Logits::All, no_check).unwrap();
        let mut single = Session::new(m.clone(), 2, 0).unwrap();
        single.set_sparsity(mode()).unwrap();
        let vocab = m.config.vocab_size;
        let mut rows = Vec::with_capacity(all.len());
        for (i, &t) in tokens.iter().enumerate() {
            let last = single.feed(&[t], Logits::Last, no_check).unwrap();
            assert_close(&last, &all[i * vocab..(i + 1) * vocab]);
            rows.extend_from_slice(&last);
        }
        if let Some(w) = &want {
            assert_close(&rows, w);
        }
        want = Some(rows);
    }
}

#[test]
fn the_crossover_is_a_function_of_the_formats_never_of_a_timing() {
    // Which down product a token takes decides its bits: two engines of the same model (in one
    // process or two) must choose alike, so the share comes from the formats' table.
    let (a, b) = (model(Activation::Silu), model(Activation::Silu));
    let want = powerinfer_engine::weights::down_crossover_share(a.layers[0].w_down.dtype());
    for m in [&a, &b] {
        for l in 0..m.config.n_layers {
            assert_eq!(m.down_crossover_at(l).unwrap(), want);
        }
    }
    assert!(!a.set_down_crossover(0.3), "fixed at the first query");
}

#[test]
fn non_finite_logits_are_an_error_and_leave_the_cache_as_it_was() {
    // Finite weights whose product overflows float32: the output norm scaled to 1e38.
    let model = model(Activation::Silu);
    let mut huge = (*model).clone();
    huge.output_norm.iter_mut().for_each(|v| *v = 3.0e38);
    let mut s = Session::new(std::sync::Arc::new(huge), 1, 0).unwrap();
    let err = s.feed(&[1, 2, 3], Logits::All, || Ok(())).unwrap_err();
    assert!(matches!(err, Error::Other(_)), "{err}");
    assert!(
        err.to_string().contains("non-finite logits at position 0"),
        "{err}"
    );
    assert_eq!(s.n_past(), 0);
}

/// The final hidden states ([`Logits::Hidden`]) are the rows the output head reads: times the
/// (tied, f32) output matrix they give [`Logits::All`]'s logits, and the context advances
/// as a logits pass advances it.
#[test]
fn hidden_states_times_the_output_matrix_are_the_logits() {
    let m = model(Activation::Silu);
    let (dim, vocab) = (m.config.dim, m.config.vocab_size);
    let tokens: Vec<u32> = (0..9).map(|i| (i * 11 % 50) as u32).collect();
    let mut a = Session::new(m.clone(), 2, 0).unwrap();
    let hidden = a.feed(&tokens, Logits::Hidden, no_check).unwrap();
    assert_eq!(hidden.len(), tokens.len() * dim);
    let mut b = Session::new(m.clone(), 2, 0).unwrap();
    let logits = b.feed(&tokens, Logits::All, no_check).unwrap();
    let t = tensors(&m.config);
    let head = t.get("output").unwrap_or(&t["token_embd"]);
    let w: Vec<f32> = (0..vocab)
        .flat_map(|r| {
            head.row(r)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect::<Vec<_>>()
        })
        .collect();
    let product: Vec<f32> = hidden
        .chunks_exact(dim)
        .flat_map(|h| {
            w.chunks_exact(dim)
                .map(|row| row.iter().zip(h).map(|(x, y)| x * y).sum::<f32>())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_close(&product, &logits);
    assert_eq!((a.n_past(), b.n_past()), (tokens.len(), tokens.len()));
    let next_a = a.feed(&[3], Logits::Last, no_check).unwrap();
    let next_b = b.feed(&[3], Logits::Last, no_check).unwrap();
    assert_eq!(next_a, next_b);
    assert!(matches!(
        a.feed(&[99], Logits::Hidden, no_check),
        Err(Error::Token(_))
    ));
}
