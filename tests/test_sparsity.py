"""Sparse FFN modes against dense and against the float64 reference with the same masks:
exact-relu, threshold and predictor, on the batched (prefill) and the one-token (decode) paths."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import PlanError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.predictors import LayerPredictor, PredictorSet

from _helpers import decode_logits, rel
from reference import _weights, exact_kv_engine, reference_forward

#: exact-relu must be the dense function (issue 3): relative difference of logits.
EXACT_RTOL = 1e-5
#: a sparse mode against the float64 reference with the same mask.
REF_RTOL = 1e-3


@pytest.fixture(scope="module")
def relu_model(synth_hf):
    return load_model(synth_hf(dtype="f32", activation="relu", ffn=256))


@pytest.fixture(scope="module")
def ids(relu_model):
    return list(np.random.default_rng(5).integers(0, relu_model.config.vocab_size, 24))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_exact_relu_is_the_dense_function(synth_hf, dtype):
    model = load_model(synth_hf(dtype=dtype, activation="relu", ffn=256))
    ids = list(np.random.default_rng(6).integers(0, model.config.vocab_size, 20))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    assert sparse.sparsity == "exact-relu"
    ref = dense.logits(ids)
    assert rel(sparse.logits(ids), ref) <= EXACT_RTOL
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= EXACT_RTOL


@pytest.mark.parametrize("dtype", ["Q8_0", "Q4_0"])
def test_exact_relu_on_quantized_models_differs_only_by_down_t_rounding(synth_gguf, dtype):
    model = load_model(synth_gguf(dtype=dtype, activation="relu", ffn=256))
    ids = list(np.random.default_rng(7).integers(0, model.config.vocab_size, 16))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    # Batched scoring uses ffn_down itself: the same function.
    assert rel(sparse.logits(ids), dense.logits(ids)) <= EXACT_RTOL
    # Decoding reads the re-quantized down_t: close, not equal.
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05


def test_exact_relu_needs_relu(synth_hf):
    silu = load_model(synth_hf(dtype="f32", activation="silu"))
    with pytest.raises(UnsupportedError):
        Engine(silu, threads=1, sparsity="exact-relu")


def test_threshold_mode_matches_masked_reference(synth_hf):
    model = load_model(synth_hf(dtype="f32", activation="silu", ffn=256))
    ids = list(np.random.default_rng(8).integers(0, model.config.vocab_size, 20))
    # The rule: |act(gate)·up| >= t. Thresholds at each layer's median: half the neurons drop.
    w = _weights(model)
    vals = []
    reference_forward(
        model, ids, ffn_mask=lambda i, h, x, a: vals.append(np.abs(a * up(w, i, h))) or True
    )
    t = [float(np.median(v)) for v in vals]
    eng = Engine(model, threads=2, sparsity="threshold", thresholds=t)

    def mask(i, h, x, a):
        keep = np.abs(a * up(w, i, h)) >= t[i]
        keep[0] = True  # the context's first token (the attention sink) stays dense
        return keep

    ref, _ = reference_forward(model, ids, ffn_mask=mask)
    assert rel(eng.logits(ids), ref) <= REF_RTOL
    assert rel(decode_logits(eng, ids), ref) <= REF_RTOL
    dense_ref, _ = reference_forward(model, ids)
    assert rel(ref, dense_ref) > 10 * REF_RTOL  # the threshold really dropped neurons
    # The first token really is dense (its logits are the dense ones), and it matters.
    assert rel(eng.logits(ids[:1]), dense_ref[:1]) <= REF_RTOL
    no_sink, _ = reference_forward(
        model, ids, ffn_mask=lambda i, h, x, a: np.abs(a * up(w, i, h)) >= t[i]
    )
    assert rel(no_sink, ref) > 4 * REF_RTOL  # (6e-3 here; the engine matches ref to 1e-3)
    # Threshold 0 keeps every neuron: the dense function.
    zero = Engine(model, threads=2, sparsity="threshold", thresholds=[0.0] * 2)
    assert rel(decode_logits(zero, ids), dense_ref) <= REF_RTOL


def up(w, i, h):
    return h @ w[f"blk.{i}.ffn_up"].T


def test_threshold_mode_errors(relu_model):
    with pytest.raises(PlanError):
        Engine(relu_model, threads=1, sparsity="threshold")
    with pytest.raises(PlanError):
        Engine(relu_model, threads=1, sparsity="threshold", thresholds=[0.1])
    with pytest.raises(UnsupportedError):
        Engine(relu_model, threads=1, sparsity="sparse-ish")


def random_predictors(model, rank=16, seed=0, threshold=0.0, input="ffn_norm") -> PredictorSet:
    rng = np.random.default_rng(seed)
    c = model.config
    layers = {
        i: LayerPredictor(
            fc1=rng.normal(size=(rank, c.dim)).astype(np.float32) / np.sqrt(c.dim),
            fc2=rng.normal(size=(c.ffn_dim, rank)).astype(np.float32) / np.sqrt(rank),
            threshold=threshold,
        )
        for i in range(c.n_layers)
    }
    return PredictorSet(layers=layers, model_fingerprint=model.fingerprint, input=input)


@pytest.mark.parametrize("source", ["ffn_norm", "ffn_inp"])
def test_predictor_mode_matches_numpy_semantics(relu_model, ids, source):
    """PowerInfer's semantics: neuron active iff fc2 · ReLU(fc1 · x) >= threshold."""
    preds = random_predictors(relu_model, threshold=0.1, input=source)
    eng = Engine(relu_model, threads=2, sparsity="predictor", predictors=preds)

    def mask(i, h, x, a):
        src = h if source == "ffn_norm" else x
        p = preds.layers[i]
        return (np.maximum(src @ p.fc1.T.astype(np.float64), 0) @ p.fc2.T) >= p.threshold

    ref, _ = reference_forward(relu_model, ids, ffn_mask=mask)
    assert rel(eng.logits(ids), ref) <= REF_RTOL
    assert rel(decode_logits(eng, ids), ref) <= REF_RTOL


def test_predictor_marking_everything_active_is_dense(relu_model, ids):
    preds = random_predictors(relu_model, threshold=-1e30)
    eng = Engine(relu_model, threads=2, sparsity="predictor", predictors=preds)
    dense = Engine(relu_model, threads=2)
    assert rel(decode_logits(eng, ids), decode_logits(dense, ids)) <= EXACT_RTOL


def test_predictors_for_another_model_are_refused(relu_model, synth_hf):
    other = load_model(synth_hf(dtype="f32", activation="relu", ffn=256, seed=3))
    preds = random_predictors(other)
    with pytest.raises(PlanError):
        Engine(relu_model, threads=1, sparsity="predictor", predictors=preds)
    preds.model_fingerprint = None
    del preds.layers[1]
    with pytest.raises(PlanError):
        Engine(relu_model, threads=1, sparsity="predictor", predictors=preds)


def test_profiling_counts_match_the_reference(relu_model, ids):
    eng = exact_kv_engine(relu_model, threads=2)
    eng.start_profiling(capture=True)
    eng.logits(ids)
    counts, tokens = eng.profile_counts()
    assert tokens == len(ids)
    _, gates = reference_forward(relu_model, ids)
    want = np.stack([(g > 0).sum(axis=0) for g in gates])
    assert np.array_equal(counts, want)
    cap = eng.take_captured()
    assert len(cap) == relu_model.config.n_layers
    x0, a0 = cap[0]
    assert x0.shape == (len(ids), relu_model.config.dim)
    w = _weights(relu_model)
    h0 = np.maximum(gates[0], 0) * up(w, 0, x0.astype(np.float64))
    assert np.allclose(a0, h0, atol=1e-4)
    assert eng.take_captured()[0][0].shape[0] == 0
    # Threshold semantics count |act(gate)·up| >= t.
    eng.start_profiling(thresholds=[0.05, 0.05], capture=True)
    eng.logits(ids)
    counts, _ = eng.profile_counts()
    hs = [a for _, a in eng.take_captured()]
    want = np.stack([(np.abs(h) >= 0.05).sum(axis=0) for h in hs])
    assert np.array_equal(counts, want)
    assert 0 < counts.sum() < np.stack(hs).size
    eng.stop_profiling()


def test_phase_timing_accounts_for_each_forward_pass(synth_gguf):
    """Session.set_phase_timing: every pass and token counted, the phases a mode runs timed,
    the ones it does not run left at zero (the decode breakdown of bench_powerinfer.py)."""
    from powerinfer_rs import Engine
    from powerinfer_rs.predictors.model import PredictorSet
    from powerinfer_rs.testing.powerinfer_files import random_predictors

    eng = Engine.from_pretrained(str(synth_gguf("F32", activation="relu")), threads=2)
    s = eng.core_session
    assert s.phase_times() is None
    c = eng.config
    preds = PredictorSet(
        layers=random_predictors(c.n_layers, c.dim, c.ffn_dim, 8),
        model_fingerprint=eng.loaded.fingerprint,
    )
    for mode, kw, idle in (
        ("dense", {}, {"predictor", "ffn"}),
        # The sparse decode runs the whole FFN in one region ("ffn"); the prompt's batched
        # pass times gate (with up) and down.
        ("exact-relu", {}, {"predictor"}),
        ("predictor", {"predictors": preds}, set()),
    ):
        eng.set_sparsity(mode, **kw)
        s.set_phase_timing(True)
        # Plain decoding (speculation would verify drafts: other token and pass counts).
        eng.generate(
            [1, 2, 3, 4], max_new_tokens=6, temperature=0, ignore_eos=True, speculative="off"
        )
        t = s.phase_times()
        assert t["tokens"] == 4 + 5 and 6 <= t["passes"] <= 7, (mode, t)  # prefill: 1-2 passes
        for name in ("attention", "predictor", "gate", "down", "ffn", "output", "other"):
            assert (t[name] == 0.0) == (name in idle), (mode, name, t)
        s.set_phase_timing(False)
        assert s.phase_times() is None
