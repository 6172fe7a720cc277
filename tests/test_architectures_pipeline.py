"""The sparsity pipeline on other families than llama (synthetic models): calibrate thresholds
(SiLU/GELU families), profile with samples, train predictors, plan, and run the engine in the
mode the pipeline produced. Each stage is checked against the float64 reference where it
computes something (the profile's counts), and for plain success elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.loading import load_model
from powerinfer_rs.stages.profile import main as profile_main

from _helpers import profile_counts
from reference import reference_forward

SHAPE = dict(dim=64, ffn=128, layers=2, heads=4, vocab=300)
#: ReLU families and their synthetic arguments.
RELU = {
    "opt": {"arch": "opt", "tie": True, "kv_heads": 4},
    "bamboo": {"arch": "bamboo", "kv_heads": 2},
    "falcon": {"arch": "falcon", "kv_heads": 1},
}


def corpus(tmp_path, model) -> str:
    rng = np.random.default_rng(1)
    ids = [int(i) for i in rng.integers(3 + 26, model.config.vocab_size, 600)]
    p = tmp_path / "corpus.txt"
    p.write_text(model.tokenizer.decode(ids), encoding="utf-8")
    return str(p)


@pytest.mark.parametrize("family", list(RELU))
def test_profile_train_plan_and_predictor_mode(synth_gguf, tmp_path, family):
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.planning import load_hardware, make_plan
    from powerinfer_rs.predictors import TrainConfig, train_predictors

    path = synth_gguf(dtype="F32", activation="relu", **SHAPE, **RELU[family])
    model = load_model(path)
    out = tmp_path / "prof"
    argv = ["--model", str(path), "--corpus", corpus(tmp_path, model), "--tokens", "400",
            "--out", str(out), "--samples", "--sample-tokens", "256", "--threads", "1",
            "--no-plot", "--quiet"]  # fmt: skip
    assert profile_main(argv) == 0
    prof = read_profile(out)
    assert prof.meta["semantics"] == "relu"
    counts = np.stack(prof.counts)
    assert counts.shape == (2, SHAPE["ffn"]) and 0 < counts.sum()

    cfg = TrainConfig()
    cfg.epochs = 2
    preds = train_predictors(
        out, tmp_path / "pred.safetensors", model=model, config=cfg, progress=False
    )
    assert sorted(preds.layers) == [0, 1]
    eng = Engine(model, threads=2, sparsity="predictor", predictors=preds)
    ids = [5, 40, 77, 123, 9, 250]
    logits = eng.logits(ids)
    assert logits.shape == (len(ids), model.config.vocab_size) and np.isfinite(logits).all()

    budget = sum(t.nbytes for t in model.tensors.values()) // 2
    plan = make_plan(
        model, prof, load_hardware("rtx4090"), budget, context=64, bucket=32, min_neurons=0,
        solver="greedy", objective="mass",  # time keeps layers this tiny on the CPU
    )  # fmt: skip
    assert 0 < plan.gpu_bytes <= budget


def test_profile_counts_match_the_reference_on_a_parallel_gateless_family(synth_gguf):
    """Falcon's FFN reads the residual from before the attention: the counts the profiler
    takes are those of the reference's activated fc1."""
    model = load_model(synth_gguf(dtype="F32", activation="relu", **SHAPE, **RELU["falcon"]))
    ids = [int(i) for i in np.random.default_rng(4).integers(3, 300, 20)]
    eng = Engine(model, threads=2)
    counts, _ = profile_counts(eng, ids)
    _, gates = reference_forward(model, ids)
    assert np.array_equal(counts, np.stack([(g > 0).sum(axis=0) for g in gates]))


@pytest.mark.parametrize(
    ("arch", "act", "kw"), [("qwen2", "silu", {}), ("gemma2", "gelu", {"tie": True})]
)
def test_calibrate_then_threshold_mode(synth_gguf, tmp_path, arch, act, kw):
    from powerinfer_rs.stages.calibrate import main as calibrate_main

    path = synth_gguf(dtype="F32", activation=act, arch=arch, kv_heads=2, **SHAPE, **kw)
    model = load_model(path)
    out = tmp_path / "thr.json"
    argv = ["--model", str(path), "--corpus", corpus(tmp_path, model), "--tokens", "400",
            "--sparsity", "0.6", "--out", str(out), "--threads", "1", "--quiet"]  # fmt: skip
    assert calibrate_main(argv) == 0
    eng = Engine(model, threads=2, sparsity="threshold", thresholds=str(out))
    dense = Engine(model, threads=2)
    ids = [5, 40, 77, 123, 9, 250, 31]
    a, b = eng.logits(ids), dense.logits(ids)
    assert np.isfinite(a).all()
    assert 0 < np.linalg.norm(a - b) / np.linalg.norm(b) < 0.5


@pytest.mark.parametrize("family", ["bamboo", "opt", "falcon"])
def test_powerinfer_files_of_the_families_run_in_predictor_mode(tmp_path, family):
    """PowerInfer's GGUF (PWRI magic, predictors and ffn_down_t inside) of Bamboo, OPT and
    Falcon: predictor mode against the reference masked by the file's predictors (input: the
    residual before the FFN norm)."""
    import dataclasses

    from powerinfer_rs.loading import TensorData
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf

    kw = {k: v for k, v in RELU[family].items() if k != "arch"}
    path = write_powerinfer_gguf(
        tmp_path / "m.powerinfer.gguf", ranks=8, sparse_threshold=0.05, arch=family,
        **SHAPE, **kw,
    )  # fmt: skip
    pwri = load_powerinfer_gguf(path)
    model = pwri.model
    assert model.config.arch == family
    tensors = dict(model.tensors)
    for i in range(model.config.n_layers):
        t = tensors[f"blk.{i}.ffn_down_t"]
        down = np.ascontiguousarray(t.data.view(np.float32).reshape(t.rows, t.cols).T)
        tensors[f"blk.{i}.ffn_down"] = TensorData(
            f"blk.{i}.ffn_down", "F32", *down.shape, down.view(np.uint8).ravel()
        )
    ref_model = dataclasses.replace(model, tensors=tensors)
    preds = pwri.predictors

    def mask(i, h, x, a):
        p = preds.layers[i]
        logits = np.maximum(x @ p.fc1.T.astype(np.float64), 0) @ p.fc2.T.astype(np.float64)
        return logits >= p.threshold

    ids = [int(i) for i in np.random.default_rng(3).integers(3, 300, 16)]
    ref, _ = reference_forward(ref_model, ids, ffn_mask=mask)
    eng = Engine.from_pretrained(path, threads=2)
    assert eng.sparsity == "predictor"
    got = eng.logits(ids)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 1e-3
    eng.reset()
    rows = np.stack([eng.prefill([t]) for t in ids])
    assert np.linalg.norm(rows - ref) / np.linalg.norm(ref) <= 1e-3
