"""gpt-oss (``gpt-oss``) in the CPU's sparse modes and the profiler, on the synthetic F32 files
of tests/test_gptoss.py: the experts' neurons are one flattened space (``n_expert ×
expert_ffn``) whose values are the clamped SwiGLU of the biased gate and up,
``h = swiglu_oai(gate + b_g, up + b_u)``; a neuron skipped drops its ``h`` only, and every
routed expert adds its down bias whatever its active set. That ``h`` is zero only where the
clamped gate is 0 or the up value −1, so exact-relu (which reads up and down rows where the
gate fires) would be the dense function: it is refused, typed, and the sparse modes are
threshold mode on calibrated thresholds over ``|h|`` and predictor mode, each against the
float64 reference masked the same way, batched, one token at a time, and a session's batched
rows against its one-token steps bit for bit; the profiler's counts and the profile stage's
file at gpt-oss's shape."""

from __future__ import annotations

import numpy as np
import pytest
from test_gptoss import TEMPLATE, ids_for
from test_moe_predictors import expert_predictors, predictor_mask

from powerinfer_rs import Engine
from powerinfer_rs.errors import UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.predictors.model import LayerPredictor
from powerinfer_rs.stages.calibrate import calibrate_thresholds
from powerinfer_rs.testing.synth_gptoss import write_gptoss_gguf

from _helpers import assert_batched_and_decoding_match, rel
from reference import exact_kv_engine, reference_forward

#: F32 files against the float64 reference.
REF_RTOL = 1e-5


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptoss_sparse")
    return write_gptoss_gguf(d / "m.gguf", dtype="F32", expert_dtype=None, chat_template=TEMPLATE)


def expert_down_t_bytes(c) -> int:
    """F32 transposed down rows of every layer's experts."""
    return c.n_layers * c.n_expert * c.expert_ffn_dim * c.dim * 4


def test_exact_relu_is_refused_typed(path):
    m = load_model(path)
    with pytest.raises(UnsupportedError, match="(?i)relu"):
        Engine(m, threads=2, sparsity="exact-relu")


def test_threshold_on_calibrated_thresholds_matches_the_masked_reference(path):
    """Thresholds calibrated to half the neurons on other tokens (the calibrate stage's
    quantiles of |h|, the context's first token left out): each routed expert drops its
    neurons with |swiglu_oai| < t and keeps its down bias (the context's first token dense),
    as the float64 reference masks them, batched and decoding; a session's batched rows are
    its steps bit for bit; at t = 0 the dense function."""
    m = load_model(path)
    c = m.config
    eng = exact_kv_engine(m, threads=2)
    t, below = calibrate_thresholds(eng, ids_for(m, n=48, seed=11), 0.5, window=24, progress=False)
    assert all(0.3 < b < 0.7 for b in below), below
    ids = ids_for(m, n=20)
    dropped: list = []

    def mask(layer, tok, hv, **_):
        if tok == 0:
            return hv
        keep = np.abs(hv) >= t[layer]
        dropped.append(1.0 - keep.mean())
        return np.where(keep, hv, 0.0)

    ref, _ = reference_forward(m, ids, moe_mask=mask)
    dense, _ = reference_forward(m, ids)
    assert 0.3 < np.mean(dropped) < 0.7 and rel(ref, dense) > 100 * REF_RTOL
    eng.set_sparsity("threshold", thresholds=t)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    assert eng.core_model.down_t_bytes == expert_down_t_bytes(c)
    s = eng.new_session()
    stepped = np.concatenate([s.feed([x]) for x in ids])
    np.testing.assert_array_equal(eng.new_session().decode(ids), stepped)
    eng.set_sparsity("threshold", thresholds=[0.0] * c.n_layers)
    eng.reset()
    assert rel(np.stack([eng.prefill([x]) for x in ids]), dense) <= REF_RTOL


def test_predictors_inside_the_biased_experts(path):
    """Predictor mode: each routed expert computes the neurons its predictor names (their
    biased gate and up, the clamped SwiGLU) and adds its down bias; an expert without a
    predictor computes all of them, one whose predictor names none adds its down bias
    alone; as the float64 reference masked by the same predictors, batched and decoding."""
    m = load_model(path)
    c = m.config
    ids = ids_for(m, n=14)
    preds = expert_predictors(m, skip={(0, 1), (1, 2)})
    p = preds.experts[(1, 0)]
    preds.experts[(1, 0)] = LayerPredictor(fc1=p.fc1, fc2=p.fc2, threshold=1e30)  # names none
    mask, kept = predictor_mask(preds)
    ref, _ = reference_forward(m, ids, moe_mask=mask)
    dense, _ = reference_forward(m, ids)
    assert 0.2 < np.mean(kept) < 0.8 and 0.0 in kept and rel(ref, dense) > 100 * REF_RTOL
    eng = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=preds)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    every = expert_predictors(m, threshold=-1e30)
    eng.set_sparsity("predictor", predictors=every)
    eng.reset()
    assert rel(np.stack([eng.prefill([x]) for x in ids]), dense) <= REF_RTOL
    assert eng.core_model.down_t_bytes == expert_down_t_bytes(c)


def test_profile_counts_and_the_profile_file(path, tmp_path):
    """The profiler counts each expert's routing and, under thresholds, its neurons with
    |h| >= t, as the float64 reference routes and activates them; the profile stage writes
    gpt-oss's flattened width per layer (and reads it back)."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.formats.thresholds import ThresholdFile, save_thresholds
    from powerinfer_rs.stages import profile as stage

    m = load_model(path)
    c, ef = m.config, m.config.expert_ffn_dim
    ids = ids_for(m, n=24)
    t = [0.05] * c.n_layers
    eng = exact_kv_engine(m, threads=2)
    eng.start_profiling(thresholds=t, capture=True)
    eng.prefill(ids)
    counts, tokens = eng.profile_counts()
    routed = eng.profile_expert_counts()
    caps = eng.take_captured()
    eng.stop_profiling()
    assert tokens == 24 and counts.shape == (c.n_layers, c.n_expert * ef)
    trace: list = []
    reference_forward(m, ids, moe_trace=trace)
    want, want_routed = np.zeros_like(counts), np.zeros_like(routed)
    for layer, _tok, e, hv in trace:
        want_routed[layer, e] += 1
        want[layer, e * ef : (e + 1) * ef] += np.abs(hv) >= t[layer]
    assert np.array_equal(routed, want_routed)
    assert np.abs(counts - want).sum() <= 2  # an |h| within rounding of t may flip
    assert 0 < counts.sum() < want_routed.sum() * ef  # thresholds leave some out
    assert len(caps[0]) == 3 and caps[0][1].shape == (24, c.n_expert_used * ef)
    out, text = tmp_path / "prof", tmp_path / "text.txt"
    words = "the river ran past old stone mills where bakers sold warm bread at dawn".split()
    text.write_text(" ".join(np.random.default_rng(9).choice(words, 300)), encoding="utf-8")
    tf = save_thresholds(
        tmp_path / "t.json",
        ThresholdFile(thresholds=t, model_fingerprint=m.fingerprint, activation="silu"),
    )
    argv = ["--model", str(path), "--corpus", str(text), "--out", str(out), "--tokens", "64"]
    assert stage.main([*argv, "--thresholds", str(tf), "--quiet", "--samples"]) == 0
    prof = read_profile(out)
    assert prof.layer_neurons == [c.n_expert * ef] * c.n_layers
    assert 0 < sum(int(x.sum()) for x in prof.counts) < int(np.sum(prof.expert_counts)) * ef
    assert (np.asarray(prof.expert_counts).sum(axis=1) == prof.tokens * c.n_expert_used).all()
