"""GLM-4.5 (``glm4moe``) plans and the hybrid executor: the planner places each layer over its
own neuron space (the leading dense layer's ``ffn_dim`` neurons as a dense model's, hottest
first; the layers of experts' flattened experts with the shared expert first and whole), the
plan file records each layer's count (``layer_neurons``) and reads back; the hybrid on gpu-sim
and gpu-emu matches the CPU engine in the same mode, with the GPU allocations equal to the
plan's (tests/test_hybrid_moe.py ``run_pair``: allocations, steps, transfers, routing
kernels). Flat families' plans carry no ``layer_neurons`` (their files are unchanged)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_glm4moe import GLM_ARGS
from test_hybrid import DEVICES, WITH_EMU
from test_hybrid_moe import run_pair

from powerinfer_rs import Engine
from powerinfer_rs.errors import UnsupportedError
from powerinfer_rs.formats.plan import load_plan, save_plan
from powerinfer_rs.formats.profile import Profile, read_profile, write_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import load_hardware, make_plan

SHAPE = dict(dim=64, ffn=128, heads=4, kv_heads=2, vocab=300)


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A fresh prepared-files cache (test_autofit.py's)."""
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    return tmp_path


_models: dict[tuple, object] = {}


def glm(synth_gguf, dtype: str, activation: str):
    key = (dtype, activation)
    if key not in _models:
        args = {**GLM_ARGS, **SHAPE, "activation": activation, "active": 0.3}
        _models[key] = load_model(synth_gguf(dtype=dtype, seed=5, **args))
    return _models[key]


def measured_profile(model, tokens: int = 64) -> Profile:
    """The engine's profile of ``model``: each layer at its own width, the dense lead's
    routing zero."""
    c = model.config
    eng = Engine(model, threads=2)
    eng.start_profiling()
    eng.prefill([int(t) for t in np.random.default_rng(1).integers(3, 300, tokens)])
    counts, n = eng.profile_counts()
    routed = eng.profile_expert_counts()
    eng.stop_profiling()
    return Profile(
        [np.asarray(counts[i, :w], np.int64) for i, w in enumerate(c.layer_routed_neurons)],
        int(n),
        {"model_fingerprint": model.fingerprint},
        expert_counts=[np.asarray(r, np.int64) for r in routed],
        dense_lead=c.dense_lead_layers,
    )


def glm_plan(model, share: float, profile: Profile, mode: str):
    total = sum(t.nbytes for t in model.tensors.values())
    return make_plan(
        model, profile, load_hardware("rtx4090"), int(share * total), context=64, bucket=32,
        sparsity=mode, objective="mass", min_neurons=0, solver="greedy",
    )  # fmt: skip


def split_plan(model, profile: Profile, mode: str, attention: bool = False):
    """A plan splitting the dense lead between the sides (with some layer's attention on the
    GPU where ``attention``): the first such among a few budgets (the greedy fill is not
    monotone in the budget on layers this tiny)."""
    c = model.config
    for share in (0.2, 0.3, 0.4, 0.25, 0.15, 0.35, 0.45):
        plan = glm_plan(model, share, profile, mode)
        hot = len(plan.gpu_neurons[0])
        if 0 < hot < c.ffn_dim and (any(plan.placement.attention) or not attention):
            return plan
    raise AssertionError(f"no budget splits the dense lead of {model.fingerprint}")


def test_each_layer_is_planned_over_its_own_neurons(synth_gguf, tmp_path):
    """The dense lead's hot set is its hottest neurons (ties: lower id), as a dense model's;
    the plan file records the layers' counts and reads back through the engine's reader; a
    profile file of the model plans the same."""
    m = glm(synth_gguf, "F16", "relu")
    c = m.config
    prof = measured_profile(m)
    plan = split_plan(m, prof, "exact-relu")
    assert plan.neuron_counts == c.layer_neurons and plan.ffn_dim == max(c.layer_neurons)
    hot0 = plan.gpu_neurons[0]
    assert hot0.max() < c.ffn_dim
    cnt = prof.counts[0]
    order = np.lexsort((np.arange(cnt.size), -cnt))
    assert np.array_equal(np.sort(order[: hot0.size]), hot0)
    for ids in plan.gpu_neurons[1:]:  # the shared expert whole with any hot neuron
        routed = c.n_expert * c.expert_ffn_dim
        assert ids.size == 0 or set(range(routed, c.n_neurons)) <= set(ids.tolist())
    path = save_plan(plan, tmp_path / "plan.safetensors")
    back = load_plan(path, m)
    assert back.neuron_counts == plan.neuron_counts and back.to_json()["layer_neurons"]
    assert all(np.array_equal(a, b) for a, b in zip(back.gpu_neurons, plan.gpu_neurons))
    d = write_profile(
        tmp_path / "prof", prof.counts, prof.tokens, model_fingerprint=m.fingerprint,
        expert_counts=prof.expert_counts, dense_lead=1,
    )  # fmt: skip
    again = glm_plan(m, plan.budget_bytes / sum(t.nbytes for t in m.tensors.values()),
                     read_profile(d), "exact-relu")  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(again.gpu_neurons, plan.gpu_neurons))
    with pytest.raises(UnsupportedError, match="RAM tier"):
        make_plan(m, prof, load_hardware("rtx4090"), 10**6, ram_budget=10**6, sparsity="dense")


def test_flat_plans_carry_no_layer_counts(synth_gguf):
    from test_hybrid_moe import moe_plan

    m = load_model(synth_gguf(dtype="F16", arch="qwen3moe", experts=8, experts_used=2))
    plan = moe_plan(m, "half")
    assert plan.layer_neurons is None and "layer_neurons" not in plan.to_json()


CASES = [
    (dtype, act, device, share)
    for dtype in ("F16", "Q8_0")
    for act in ("silu", "relu")
    for device in DEVICES + (["gpu-emu"] if WITH_EMU else [])
    for share in (0.5, 4.0)
    # The emulator runs every CUDA thread on one core: one file, one placement.
    if device != "gpu-emu" or (dtype == "Q8_0" and act == "relu" and share == 0.5)
]
#: Quantized files: the shared expert runs whole on the CPU engine in every mode, from the
#: file's down rows, where the GPU side reads its hot rows' re-quantized transposed copy (as
#: dense mode does for every neuron: test_hybrid.py's TOL_DENSE_Q8, DESIGN.md's 5e-3), and
#: routed_scaling_factor 2.5 scales the routed experts' share of it.
TOL_Q8 = 5e-3


@pytest.mark.parametrize(("dtype", "act", "device", "share"), CASES)
def test_the_hybrid_matches_the_cpu_engine(synth_gguf, tmp_path, dtype, act, device, share):
    """Half (the dense lead split between the sides, experts partly hot) and everything on
    the GPU: logits within the hybrid tolerance of the CPU engine, greedy tokens equal, the
    GPU's allocations those of the plan."""
    m = glm(synth_gguf, dtype, act)
    mode = "exact-relu" if act == "relu" else "dense"
    prof = measured_profile(m)
    emu = device == "gpu-emu"  # its kernel count wants attention on the GPU
    plan = glm_plan(m, share, prof, mode) if share > 1 else split_plan(m, prof, mode, emu)
    hot = [len(ids) for ids in plan.gpu_neurons]
    if share > 1:
        assert hot[0] == m.config.ffn_dim and all(plan.placement.attention)
    path = save_plan(plan, tmp_path / "plan.safetensors")
    assert "layer_neurons" in json.loads(json.dumps(plan.to_json()))
    what = f"glm4moe {dtype} {act} {device} " + ("half" if share < 1 else "all")
    run_pair(m, path, plan, device, mode, dtype, hot, what, None if dtype == "F16" else TOL_Q8)


def test_vram_budget_auto_prepares_and_runs_the_hybrid(cache):
    """``--vram-budget auto``'s stages on GLM (SiLU: calibrated thresholds, the profile at each
    layer's width, the plan over each layer's own neurons): the prepared plan runs on gpu-sim
    with the GPU allocations the plan's, and the command's text is that engine's."""
    from test_autofit import fast_gpu, generate, prepared_dirs, run

    from powerinfer_rs.runtime import autofit

    model = str(cache / "glm.gguf")
    code, _, err = run(["synth", "--dim", "64", "--ffn", "128", "--layers", "3", "--heads", "4",
                        "--kv-heads", "2", "--vocab", "300", "--arch", "glm4moe", "--activation",
                        "silu", "--experts", "8", "--experts-used", "2", "--expert-ffn", "64",
                        "--dense-lead", "1", "--format", "gguf-q8_0", "--out", model])  # fmt: skip
    assert code == 0, err
    hw = ["--vram-budget", "2MiB", "--device", "gpu-sim", "--hardware", fast_gpu(cache)]
    code, out, err = generate("--model", model, *hw)
    assert code == 0, err
    (d,) = prepared_dirs(cache)
    assert autofit.read_prepared(d).sparsity == "threshold"
    c = load_model(model).config
    assert read_profile(d / "profile").layer_neurons == c.layer_routed_neurons
    plan = load_plan(d / "plan.safetensors")
    assert plan.gpu_bytes > 0 and plan.layer_neurons == c.layer_neurons
    opts = autofit.read_prepared(d).engine_options()
    eng = Engine.from_pretrained(model, threads=2, device="gpu-sim", **opts)
    assert eng.gpu_info()["allocations"] == eng.plan.allocations
    assert out == eng.generate("the cat sat", max_new_tokens=8, temperature=0) + "\n"
