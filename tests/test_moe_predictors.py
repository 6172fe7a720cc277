"""Predictors inside experts (a mixture of experts in predictor mode): a predictor per (layer,
expert) names the neurons a routed expert computes; experts without one run exact-relu (the
dense function of a SiLU expert). Checked against the float64 reference masked by the same
predictors (numpy), batched and one token at a time; the profiler's samples per expert against
the reference's routing and activity; training keeps a predictor only where it pays, resumably;
the file format and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
from test_moe import MOE_ARCHS, REF_RTOL, act_of, ids_for, rel

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, PlanError
from powerinfer_rs.formats.predictors import load_predictors, save_predictors
from powerinfer_rs.formats.samples import load_samples, read_meta
from powerinfer_rs.loading import load_model
from powerinfer_rs.predictors import TrainConfig, train_predictors
from powerinfer_rs.predictors.experts import read_cost
from powerinfer_rs.predictors.model import LayerPredictor, PredictorSet
from powerinfer_rs.stages.profile import profile_model

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
    assert eng._model.down_t_bytes > 0  # decoding reads the experts' transposed down rows
    assert rel(eng.logits(ids), ref) <= REF_RTOL
    eng.reset()
    assert rel(np.stack([eng.prefill([t]) for t in ids]), ref) <= REF_RTOL
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


def test_training_keeps_the_predictors_that_pay(synth_gguf, tmp_path):
    """Per (layer, expert): too few routed samples -> no predictor; trained ones kept only
    where a routed token reads fewer bytes with them; the file holds the kept experts' tensors
    and runs in predictor mode as its predictors say; a rerun resumes (nothing retrained)."""
    m = moe_model(synth_gguf, dim=128, ffn=256, active=0.15, gate_rank=16)
    c = m.config
    eng = Engine(m, threads=2)
    ids = ids_for(m, n=3000, seed=4)
    profile_model(eng, ids, window=250, samples_to=tmp_path / "prof", progress=False)
    out = tmp_path / "pred.safetensors"
    logs: list[str] = []
    cfg = TrainConfig(epochs=8)
    pset = train_predictors(
        tmp_path / "prof", out, model=m, config=cfg, progress=False, log=logs.append
    )
    dropped = pset.metadata["dropped"]
    assert len(pset.experts) + len(dropped) == c.n_layers * c.n_expert
    assert pset.experts, logs  # planted low-rank gates: predictors that pay exist
    for (i, e), p in pset.experts.items():
        s = p.stats
        assert s["n_samples"] >= 64 and s["bytes_with"] < s["bytes_without"], (i, e, s)
        assert s["recall"] > 0.9
    for key, s in dropped.items():
        assert s["reason"] in ("few samples", "does not pay"), (key, s)
        if s["reason"] == "does not pay":
            assert s["bytes_with"] >= s["bytes_without"]
    back = load_predictors(out)
    assert set(back.experts) == set(pset.experts) and not back.layers
    # The engine runs the file's predictors as the masked reference does.
    short = ids[:10]
    mask, _ = predictor_mask(back)
    ref, _ = reference_forward(m, short, moe_mask=mask)
    run = exact_kv_engine(m, threads=2, sparsity="predictor", predictors=str(out))
    assert rel(np.stack([run.prefill([t]) for t in short]), ref) <= 1e-4
    # Resumed: every expert is done, nothing trained again.
    logs.clear()
    again = train_predictors(
        tmp_path / "prof", out, model=m, config=cfg, progress=False, log=logs.append
    )
    assert any("resuming" in s for s in logs) and set(again.experts) == set(pset.experts)


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
    wide = moe_model(synth_gguf, ffn=96)
    with pytest.raises(PlanError, match="neurons"):
        Engine(wide, threads=1, sparsity="predictor", predictors=preds)
    # Malformed files: a bad expert index, a unit missing a tensor, both kinds at once.
    from safetensors.numpy import save_file

    meta = {"format": "powerinfer-rs-predictors/1"}
    fc1, fc2, thr = np.zeros((2, 64), np.float32), np.zeros((128, 2), np.float32), np.zeros(1)
    cases = {
        "unexpected tensor": {"blk.0.exp.x.fc1": fc1},
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
