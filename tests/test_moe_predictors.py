"""Predictors inside experts (a mixture of experts in predictor mode): a predictor per (layer,
expert) names the neurons a routed expert computes; experts without one run exact-relu (the
dense function of a SiLU expert). Checked against the float64 reference masked by the same
predictors (numpy), batched and one token at a time; the profiler's samples per expert against
the reference's routing and activity; training keeps a predictor only where it pays, resumably;
the file format and what is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_moe import MOE_ARCHS, REF_RTOL, act_of, ids_for

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, PlanError
from powerinfer_rs.formats.predictors import load_predictors, save_predictors
from powerinfer_rs.formats.samples import load_samples, read_meta
from powerinfer_rs.loading import load_model
from powerinfer_rs.predictors import TrainConfig, train_predictors
from powerinfer_rs.predictors.experts import read_cost
from powerinfer_rs.predictors.model import LayerPredictor, PredictorSet
from powerinfer_rs.stages.profile import profile_model

from _helpers import assert_batched_and_decoding_match, rel
from reference import exact_kv_engine, reference_forward


def moe_model(synth_gguf, arch: str = "smallthinker", **kw):
    args = {**MOE_ARCHS[arch], **kw}
    return load_model(synth_gguf(dtype="F32", activation=act_of(arch), arch=arch, **args))


def expert_predictors(model, skip=(), rank=8, threshold=0.1, seed=0) -> PredictorSet:
    """Random F32 predictors for every (layer, expert) but those in ``skip``."""
    rng = np.random.default_rng(seed)
    c = model.config
    ef = c.expert_ffn_dim or c.ffn_dim
    experts = {
        (i, e): LayerPredictor(
            fc1=rng.normal(size=(rank, c.dim)).astype(np.float32) / np.sqrt(c.dim),
            fc2=rng.normal(size=(ef, rank)).astype(np.float32) / np.sqrt(rank),
            threshold=threshold,
        )
        for i in range(c.n_layers)
        for e in range(c.n_expert)
        if (i, e) not in skip
    }
    return PredictorSet(
        layers={}, experts=experts, model_fingerprint=model.fingerprint, dtype="F32"
    )


def predictor_mask(preds: PredictorSet):
    """The reference's ``moe_mask``: each routed expert keeps the neurons its predictor names
    (float64 logits >= threshold); an expert without a predictor keeps all."""
    kept = []

    def mask(layer, tok, hv, expert, x):
        p = preds.experts.get((layer, expert))
        if p is None:
            return hv
        keep = np.maximum(x @ p.fc1.T.astype(np.float64), 0) @ p.fc2.T >= p.threshold
        kept.append(keep.mean())
        return np.where(keep, hv, 0.0)

    return mask, kept


@pytest.mark.parametrize("arch", ["smallthinker", "qwen3moe"])
def test_predictors_inside_experts_match_the_masked_reference(synth_gguf, arch):
    """ReGLU experts (SmallThinker) and SiLU ones (Qwen3-MoE): batched scoring and decoding
    compute each routed expert over the neurons its predictor names, as the float64 reference
    masked by the same predictors; experts without a predictor compute every neuron."""
    m = moe_model(synth_gguf, arch)
    ids = ids_for(m, n=12)
    skip = {(0, 1), (0, 5), (1, 2)}
    preds = expert_predictors(m, skip=skip)
    mask, kept = predictor_mask(preds)
    ref, _ = reference_forward(m, ids, moe_mask=mask)
    dense, _ = reference_forward(m, ids)
    assert 0.2 < np.mean(kept) < 0.8, np.mean(kept)  # the predictors drop about half
    assert rel(ref, dense) > 100 * REF_RTOL  # ... and that changes the function
    eng = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=preds)
    assert eng.core_model.down_t_bytes > 0  # decoding reads the experts' transposed down rows
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    # Predictors that name every neuron are the dense function.
    every = expert_predictors(m, skip=skip, threshold=-1e30)
    eng.set_sparsity("predictor", predictors=every)
    assert rel(np.stack([eng.prefill([t]) for t in ids]), dense) <= REF_RTOL


def test_profile_writes_samples_per_expert(synth_gguf, tmp_path):
    """With samples, a mixture of experts' profile writes one unit per (layer, expert): the
    tokens routed to the expert, in order, with the mask over its neurons, equal to the
    reference's routing and activity."""
    m = moe_model(synth_gguf, active=0.3)
    c = m.config
    ids = ids_for(m, n=40, seed=9)
    trace: list = []
    reference_forward(m, ids, moe_trace=trace)
    eng = exact_kv_engine(m, threads=2)
    _, _, rows = profile_model(eng, ids, window=len(ids), samples_to=tmp_path, progress=False)
    assert rows == len(ids)
    meta = read_meta(tmp_path)
    assert meta["n_layers"] == c.n_layers * c.n_expert and meta["ffn_dim"] == c.expert_ffn_dim
    assert meta["metadata"]["moe"] == {
        "n_layers": c.n_layers,
        "n_expert": c.n_expert,
        "expert_ffn": c.expert_ffn_dim,
    }
    total = 0
    for layer in range(c.n_layers):
        for e in range(c.n_expert):
            x, mask = load_samples(tmp_path, layer * c.n_expert + e)
            want = [hv != 0 for i, _t, ex, hv in trace if i == layer and ex == e]
            assert x.shape == (len(want), c.dim) and mask.shape[0] == len(want)
            if want:
                assert np.array_equal(mask, np.stack(want)), (layer, e)
            total += len(want)
    assert total == c.n_layers * len(ids) * c.n_expert_used


def test_training_keeps_the_predictors_that_pay(synth_gguf, tmp_path, monkeypatch):
    """Per (layer, expert): too few routed samples -> no predictor; trained ones kept only
    where they meet the recall target and a routed token reads fewer bytes with them; the file
    holds the kept experts' tensors and runs in predictor mode as its predictors say; an
    interrupted run resumes from its parts, a finished one retrains nothing."""
    from powerinfer_rs.predictors import experts as experts_mod

    m = moe_model(synth_gguf, dim=128, ffn=256, active=0.15, gate_rank=16)
    c = m.config
    eng = Engine(m, threads=2)
    ids = ids_for(m, n=3000, seed=4)
    profile_model(eng, ids, window=250, samples_to=tmp_path / "prof", progress=False)
    out = tmp_path / "pred.safetensors"
    logs: list[str] = []
    cfg = TrainConfig(epochs=8)
    calls = []
    real = experts_mod.train_layer

    def interrupted(*a, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(experts_mod, "train_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_predictors(tmp_path / "prof", out, model=m, config=cfg, progress=False)
    monkeypatch.setattr(experts_mod, "train_layer", real)
    assert not out.exists() and (tmp_path / "pred.safetensors.parts").is_dir()
    pset = train_predictors(
        tmp_path / "prof", out, model=m, config=cfg, progress=False, log=logs.append
    )
    done_before = [s for s in logs if s.startswith("resuming: ")]
    assert done_before and int(done_before[0].split()[1]) >= 3, logs  # the parts were kept
    dropped = pset.metadata["dropped"]
    assert len(pset.experts) + len(dropped) == c.n_layers * c.n_expert
    assert pset.experts, logs  # planted low-rank gates: predictors that pay exist
    for (i, e), p in pset.experts.items():
        s = p.stats
        assert s["n_samples"] >= 256 and s["bytes_with"] < s["bytes_without"], (i, e, s)
        assert s["met_target"] and s["recall"] >= 0.99
    reasons = {s["reason"] for s in dropped.values()}
    assert reasons <= {"few samples", "does not pay", "misses recall"}, reasons
    for s in dropped.values():
        if s["reason"] == "does not pay":
            assert s["bytes_with"] >= s["bytes_without"]
        if s["reason"] == "few samples":
            assert s["n_samples"] < 256
    back = load_predictors(out)
    assert set(back.experts) == set(pset.experts) and not back.layers
    # The engine runs the file's predictors as the masked reference does.
    short = ids[:10]
    mask, _ = predictor_mask(back)
    ref, _ = reference_forward(m, short, moe_mask=mask)
    run = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=str(out))
    assert rel(np.stack([run.prefill([t]) for t in short]), ref) <= 1e-4
    # Finished: every expert is done, nothing trained again.
    logs.clear()
    monkeypatch.setattr(experts_mod, "train_layer", None)  # would fail if called
    again = train_predictors(
        tmp_path / "prof", out, model=m, config=cfg, progress=False, log=logs.append
    )
    n = c.n_layers * c.n_expert
    assert f"resuming: {n} of {n} experts already done" in logs
    assert set(again.experts) == set(pset.experts)


def test_silu_experts_pay_against_reading_everything(synth_gguf, tmp_path):
    """SiLU experts (threshold semantics in the profile): without a predictor an expert reads
    all its rows, with one the predicted rows and the predictor -- the rule the trainer's
    record shows for every expert it trained."""
    m = moe_model(synth_gguf, "qwen3moe", dim=128)
    c = m.config
    eng = Engine(m, threads=2)
    ids = ids_for(m, n=1500, seed=6)
    thr = [0.02] * c.n_layers
    profile_model(eng, ids, window=250, thresholds=thr, samples_to=tmp_path, progress=False)
    pset = train_predictors(
        tmp_path,
        tmp_path / "p.safetensors",
        model=m,
        config=TrainConfig(epochs=4),
        progress=False,
    )
    from powerinfer_rs.predictors.experts import expert_bytes

    g, u, d = expert_bytes(m, 0, c.n_expert)
    stats = [p.stats for p in pset.experts.values()]
    stats += [s for s in pset.metadata["dropped"].values() if "bytes_without" in s]
    assert stats
    for s in stats:
        assert s["bytes_without"] == pytest.approx(g + u + d)
        assert s["bytes_with"] == pytest.approx(s["bytes"] + s["predicted_fraction"] * (g + u + d))


def test_what_a_routed_token_reads():
    """The pay rule: ReLU experts without a predictor read every gate row and the firing
    neurons' up and down rows; SiLU experts read all; with one, the predicted gate rows
    (every predicted row, SiLU) plus the predictor."""
    st = {"active_fraction": 0.1, "predicted_fraction": 0.2}
    assert read_cost(st, 50.0, 100.0, 100.0, 100.0, relu=True) == pytest.approx((120.0, 90.0))
    assert read_cost(st, 50.0, 100.0, 100.0, 100.0, relu=False) == pytest.approx((300.0, 110.0))


def test_expert_predictor_files_and_refusals(synth_gguf, tmp_path):
    m = moe_model(synth_gguf)
    preds = expert_predictors(m, skip={(1, 0)})
    path = save_predictors(tmp_path / "p.safetensors", preds)
    back = load_predictors(path)
    assert set(back.experts) == set(preds.experts)
    for k, p in preds.experts.items():
        assert np.array_equal(back.experts[k].fc1, p.fc1) and back.experts[
            k
        ].threshold == np.float32(0.1)
    # Per-layer predictors for a mixture of experts, per-expert ones for a dense model, and
    # predictors whose width is not the experts' are refused.
    from test_sparsity import random_predictors

    with pytest.raises(PlanError, match="takes predictors per expert"):
        Engine(m, threads=1, sparsity="predictor", predictors=random_predictors(m))
    dense = load_model(synth_gguf(dtype="F32", activation="relu"))
    preds.model_fingerprint = None
    with pytest.raises(PlanError, match="no experts"):
        Engine(dense, threads=1, sparsity="predictor", predictors=preds)
    # The engine's own checks, below the Python ones: per-layer predictors on a mixture of
    # experts, an expert predictor of the wrong width, or outside the model.
    from powerinfer_rs import _core

    eng = Engine(m, threads=1)
    c = m.config
    fc1, fc2 = np.zeros((4, c.dim), np.float32), np.zeros((c.expert_ffn_dim, 4), np.float32)
    per_layer = _core.Predictors([fc1] * c.n_layers, [fc2] * c.n_layers, [0.0] * c.n_layers)
    with pytest.raises(PlanError, match="per-layer ones"):
        eng.core_session.set_sparsity("predictor", predictors=per_layer)
    narrow = _core.Predictors([fc1], [fc2[:-1]], [0.0], experts=[(0, 1)])
    with pytest.raises(PlanError, match="layer 0 expert 1"):
        eng.core_session.set_sparsity("predictor", predictors=narrow)
    outside = _core.Predictors([fc1], [fc2], [0.0], experts=[(0, c.n_expert)])
    with pytest.raises(PlanError, match="experts, the model has"):
        eng.core_session.set_sparsity("predictor", predictors=outside)
    with pytest.raises(PlanError, match="empty predictor"):  # rank 0 (once a Rust panic)
        _core.Predictors([fc1[:0]], [fc2[:, :0]], [0.0], experts=[(0, 1)])
    with pytest.raises(PlanError, match="two predictors"):
        _core.Predictors([fc1] * 2, [fc2] * 2, [0.0] * 2, experts=[(0, 1), (0, 1)])
    wide = moe_model(synth_gguf, ffn=96)
    with pytest.raises(PlanError, match="neurons"):
        Engine(wide, threads=1, sparsity="predictor", predictors=preds)
    # Malformed files: a bad expert index, a unit missing a tensor, both kinds at once.
    from safetensors.numpy import save_file

    meta = {"format": "powerinfer-rs-predictors/1"}
    fc1, fc2, thr = np.zeros((2, 64), np.float32), np.zeros((128, 2), np.float32), np.zeros(1)
    cases = {
        "unexpected tensor": {"blk.0.exp.x.fc1": fc1},
        "unexpected tensor 'blk.01": {"blk.01.exp.1.fc1": fc1},
        "lacks tensor": {"blk.0.exp.1.fc1": fc1, "blk.0.exp.1.fc2": fc2},
        "both": {
            **{f"blk.0.{k}": v for k, v in (("fc1", fc1), ("fc2", fc2), ("threshold", thr))},
            **{f"blk.0.exp.1.{k}": v for k, v in (("fc1", fc1), ("fc2", fc2), ("threshold", thr))},
        },
    }
    for what, tensors in cases.items():
        bad = tmp_path / "bad.safetensors"
        t = {k: v.astype(np.float32) for k, v in tensors.items()}
        save_file(t, str(bad), metadata=meta)
        with pytest.raises(ModelFileError, match=what):
            load_predictors(bad)


def test_evaluate_scores_predictors_per_routed_expert(synth_gguf):
    """The evaluate stage's recall table on a mixture of experts counts each routed expert that
    has a predictor over its own neurons: predictors naming every neuron have recall 1 and
    precision equal to the share of neurons that fire (the reference's, over those experts)."""
    from powerinfer_rs.stages.evaluate import format_quality, predictor_quality

    m = moe_model(synth_gguf, active=0.3)
    skip = {(0, 2), (1, 6)}
    every = expert_predictors(m, skip=skip, threshold=-1e30)
    ids = ids_for(m, n=30, seed=2)
    trace: list = []
    reference_forward(m, ids, moe_trace=trace)
    rows = predictor_quality(Engine(m, threads=2), ids, every, window=len(ids), progress=False)
    # A layer whose experts have no predictor reports None (JSON null), and the table says so.
    layer0 = expert_predictors(m, threshold=-1e30)
    layer0.experts = {k: v for k, v in layer0.experts.items() if k[0] == 0}
    half = predictor_quality(Engine(m, threads=2), ids, layer0, window=len(ids), progress=False)
    assert half[1]["recall"] is None and half[1]["active_fraction"] is None
    assert half[0]["recall"] == 1.0
    assert "no expert of this layer has one" in format_quality(half, "relu")
    json.loads(json.dumps(half))
    for r in rows:
        hv = [h for i, _t, e, h in trace if i == r["layer"] and (i, e) not in skip]
        fire = float(np.mean(np.concatenate(hv) != 0))
        assert r["recall"] == 1.0 and r["predicted_fraction"] == 1.0, r
        assert r["precision"] == pytest.approx(fire, abs=1e-9), r
        assert r["tokens"] == len(ids) and r["rank"] == 8


def test_a_set_where_no_predictor_paid_runs_exact_relu(synth_gguf, tmp_path):
    """A trainer's file in which no expert's predictor paid holds no tensors: predictor mode
    then runs every routed expert exact-relu (the dense function); a set with neither
    predictors nor the trainer's record is refused."""
    m = moe_model(synth_gguf)
    ids = ids_for(m, n=8)
    none = PredictorSet(
        layers={}, model_fingerprint=m.fingerprint, metadata={"dropped": {"0.0": {}}}
    )
    path = save_predictors(tmp_path / "none.safetensors", none)
    eng = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=str(path))
    want = exact_kv_engine(m, threads=2, sparsity="exact-relu")
    got = np.stack([eng.prefill([t]) for t in ids])
    assert rel(got, np.stack([want.prefill([t]) for t in ids])) <= REF_RTOL
    with pytest.raises(PlanError, match="takes predictors per expert"):
        Engine(m, threads=1, sparsity="predictor", predictors=PredictorSet(layers={}))
