"""GLM-4.5 (``glm4moe``) in the CPU's sparse modes and the profiler: each layer has its own
neuron space (``ModelConfig.layer_neurons``): the first ``dense_lead`` layers their plain
gate/up/down's ``ffn_dim`` neurons, the others the flattened experts (plus the shared expert).
On the synthetic GLM files of tests/test_glm4moe.py (a ReLU variant where exact-relu must be
the dense function): exact-relu, threshold and predictor mode against the float64 reference
masked the same way, batched and one token at a time; the profiler's per-layer counts against
the reference's activity; the profile stage's file with each layer's own width; the neuron
store of each layer's own neurons against the resident engine."""

from __future__ import annotations

import numpy as np
import pytest
from test_glm4moe import GLM_ARGS, ids_for
from test_moe_predictors import expert_predictors, predictor_mask

from powerinfer_rs import Engine
from powerinfer_rs.errors import PlanError
from powerinfer_rs.loading import load_model

from _helpers import assert_batched_and_decoding_match, rel
from reference import _weights, exact_kv_engine, reference_forward

REF_RTOL = 1e-5


def glm(synth_gguf, **kw):
    return load_model(synth_gguf(dtype="F32", **{**GLM_ARGS, **kw}))


def down_t_bytes(c) -> int:
    """F32 transposed down rows: the dense lead's ffn_dim, each layer of experts' routed and
    shared neurons, dim values each."""
    lead = c.dense_lead_layers
    moe = (c.n_layers - lead) * (c.n_expert * c.expert_ffn_dim + c.shared_ffn_dim)
    return (lead * c.ffn_dim + moe) * c.dim * 4


def test_layers_count_their_own_neurons(synth_gguf):
    m = glm(synth_gguf)
    c = m.config
    moe = c.n_expert * c.expert_ffn_dim
    assert c.layer_neurons == [c.ffn_dim] + [moe + c.shared_ffn_dim] * 2
    assert c.layer_routed_neurons == [c.ffn_dim, moe, moe]
    assert c.ffn_dim != moe  # the widths really differ


def test_exact_relu_is_the_dense_function(synth_gguf):
    """A ReLU GLM with a planted sparsity: exact-relu decoding (the dense lead's up and down_t
    rows of its firing neurons, each routed expert's likewise) gives the dense logits; the
    transposed down rows of both kinds of layer are built."""
    m = glm(synth_gguf, activation="relu", active=0.2)
    ids = ids_for(m, n=10)
    dense = Engine(m, threads=2)
    want = np.stack([dense.prefill([t]) for t in ids])
    sparse = Engine(m, threads=2, sparsity="exact-relu")
    assert sparse.core_model.down_t_bytes == down_t_bytes(m.config)
    assert rel(np.stack([sparse.prefill([t]) for t in ids]), want) <= REF_RTOL
    assert rel(sparse.logits(ids), dense.logits(ids)) <= REF_RTOL


def test_threshold_matches_the_masked_reference(synth_gguf):
    """Threshold mode: the dense lead drops its neurons with |act(gate)·up| < t and each
    routed expert its own (the context's first token dense), as the float64 reference masks
    them, batched and decoding; at t = 0 the dense function."""
    m = glm(synth_gguf)
    c, w = m.config, _weights(m)
    ids = ids_for(m, n=12)
    trace: list = []
    lead_vals: list = []

    def lead_up(i, h):
        return h @ w[f"blk.{i}.ffn_up"].T

    def collect(i, h, _x, a):
        lead_vals.append(np.abs(a * lead_up(i, h))[1:])
        return True

    dense_ref, _ = reference_forward(m, ids, ffn_mask=collect, moe_trace=trace)
    vals = [[] for _ in range(c.n_layers)]
    vals[0] = lead_vals
    for layer, tok, _e, hv in trace:
        if tok:
            vals[layer].append(np.abs(hv))
    t = [float(np.median(np.concatenate([v.ravel() for v in vs]))) for vs in vals]

    def lead_mask(i, h, _x, a):
        keep = np.abs(a * lead_up(i, h)) >= t[i]
        keep[0] = True
        return keep

    def mask(layer, tok, hv, **_):
        return hv if tok == 0 else np.where(np.abs(hv) >= t[layer], hv, 0.0)

    ref, _ = reference_forward(m, ids, ffn_mask=lead_mask, moe_mask=mask)
    assert rel(ref, dense_ref) > 10 * REF_RTOL
    only_lead, _ = reference_forward(m, ids, ffn_mask=lead_mask)
    assert rel(only_lead, dense_ref) > 10 * REF_RTOL  # the dense lead's thresholds count
    eng = exact_kv_engine(m, threads=2, sparsity="threshold", thresholds=t)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    assert eng.core_model.down_t_bytes == down_t_bytes(c)
    zero = exact_kv_engine(m, threads=2, sparsity="threshold", thresholds=[0.0] * c.n_layers)
    assert rel(np.stack([zero.prefill([x]) for x in ids]), dense_ref) <= REF_RTOL


def test_predictors_inside_experts_with_a_dense_lead(synth_gguf):
    """Predictor mode: each routed expert computes the neurons its predictor names, the dense
    lead (which takes no predictor) runs exact-relu: for SiLU its dense function. A predictor
    for a dense layer is refused."""
    m = glm(synth_gguf)
    ids = ids_for(m, n=12)
    lead = {(0, e) for e in range(m.config.n_expert)}
    preds = expert_predictors(m, skip=lead | {(1, 3)})
    mask, kept = predictor_mask(preds)
    ref, _ = reference_forward(m, ids, moe_mask=mask)
    dense, _ = reference_forward(m, ids)
    assert 0.2 < np.mean(kept) < 0.8 and rel(ref, dense) > 100 * REF_RTOL
    eng = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=preds)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    with pytest.raises(PlanError, match="a dense layer"):
        eng.set_sparsity("predictor", predictors=expert_predictors(m))


def test_profile_counts_each_layers_own_neurons(synth_gguf, tmp_path):
    """A ReLU GLM: the profiler counts the dense lead's ffn_dim neurons as a dense model's and
    each layer of experts' routing and flattened neurons, as the float64 reference activates
    them; the profile stage writes each layer at its own width (and reads it back)."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.stages import profile as stage

    m = glm(synth_gguf, activation="relu", active=0.2)
    c, ef = m.config, m.config.expert_ffn_dim
    ids = ids_for(m, n=24)
    eng = exact_kv_engine(m, threads=2)
    eng.start_profiling(capture=True)
    eng.prefill(ids)
    counts, tokens = eng.profile_counts()
    routed = eng.profile_expert_counts()
    caps = eng.take_captured()
    eng.stop_profiling()
    widths = c.layer_routed_neurons
    assert tokens == 24 and counts.shape == (c.n_layers, max(widths))
    trace: list = []
    _, gates = reference_forward(m, ids, moe_trace=trace)
    want = np.zeros_like(counts)
    want[0, : c.ffn_dim] = (gates[0] > 0).sum(axis=0)
    want_routed = np.zeros_like(routed)
    for layer, _t, e, hv in trace:
        want_routed[layer, e] += 1
        want[layer, e * ef : (e + 1) * ef] += hv != 0
    assert np.array_equal(routed, want_routed) and not routed[0].any()
    assert np.abs(counts - want).sum() <= 2  # a gate within rounding of 0 may flip
    assert 0 < counts[0].sum() < 24 * c.ffn_dim  # the dense lead is sparse, not all or none
    assert len(caps[0]) == 2 and caps[0][1].shape == (24, c.ffn_dim)
    assert len(caps[1]) == 3 and caps[1][1].shape == (24, c.n_expert_used * ef)
    out, text = tmp_path / "prof", tmp_path / "text.txt"
    words = "the river ran past old stone mills where bakers sold warm bread at dawn".split()
    text.write_text(" ".join(np.random.default_rng(9).choice(words, 300)), encoding="utf-8")
    path = synth_gguf(dtype="F32", **{**GLM_ARGS, "activation": "relu", "active": 0.2})
    argv = ["--model", str(path), "--corpus", str(text), "--out", str(out), "--tokens", "64"]
    assert stage.main([*argv, "--quiet", "--samples"]) == 0
    prof = read_profile(out)
    assert prof.layer_neurons == widths and prof.dense_lead == 1
    assert prof.counts[0].sum() > 0 and not prof.expert_counts[0].any()
    assert (np.asarray(prof.expert_counts[1:]).sum(axis=1) == prof.tokens * c.n_expert_used).all()


@pytest.mark.parametrize(("act", "mode"), [("relu", "exact-relu"), ("silu", "dense")])
def test_the_store_decodes_as_the_resident_engine(synth_gguf, tmp_path, act, mode):
    """GLM's neuron store holds each layer's own neurons (a version-3 header: the dense lead's
    ffn_dim, the layers of experts' routed neurons): decoding from it with a cache of a few
    clusters gives the resident engine's logits; exact-relu reads the dense lead's and the
    experts' rows from it (no transposed copy in memory), dense mode the experts' (the dense
    lead's dense products read the mapped weights); hot clusters from the profile's
    per-layer counts stay resident."""
    from test_hybrid import assert_close, assert_same_decode, greedy
    from test_neuron_store import PROMPT, STEPS, TOL

    from powerinfer_rs.runtime.neuron_store import store_neurons

    m = glm(synth_gguf, activation=act, active=0.2)
    c = m.config
    assert store_neurons(c) == c.layer_routed_neurons
    resident = Engine(m, threads=2, sparsity=mode)
    stored = Engine(m, threads=2)
    path = Engine(m).write_neuron_store(tmp_path / "glm.neurons", cluster=8)
    with open(path, "rb") as f:
        assert f.read(12)[8] == 3  # the layers' own counts
    stored.use_neuron_store(path, cache=1 << 16, io_threads=2)
    stored.set_sparsity(mode)
    want = assert_same_decode(resident, stored, PROMPT, STEPS, TOL, f"glm4moe {mode}")
    s = stored.neuron_store_stats()
    assert s["misses"] > 0 and s["bytes_read"] > 0, s
    assert stored.core_model.down_t_bytes == 0  # no transposed rows in memory
    counts = [np.arange(n)[::-1].copy() for n in c.layer_neurons]
    info = stored.use_neuron_store(path, cache=1 << 17, hot=counts)
    assert info["resident_slots"] > 0
    got, _ = greedy(stored, PROMPT, STEPS)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, TOL, f"glm4moe {mode} hot step {i}")
    assert stored.neuron_store_stats()["hits"] > 0
