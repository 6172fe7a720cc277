"""The engine adopts a placement plan: the Rust core reads its neuron table, and a plan for
another model, over the VRAM budget, or putting anything on the GPU while the device is the
CPU is refused (test_hybrid.py runs plans on gpu-sim)."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import CudaError, PlanError, UnsupportedError, VramBudgetError
from powerinfer_rs.formats.plan import save_plan
from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import load_hardware, make_plan

TINY = dict(dim=64, ffn=256, layers=3, heads=4, kv_heads=2, vocab=300)


@pytest.fixture(scope="module")
def model(synth_gguf):
    return load_model(synth_gguf(dtype="Q8_0", **TINY))


def plan_file(model, tmp_path, budget, name):
    profile = synthetic_profile(3, 256, 1000, seed=0, model_fingerprint=model.fingerprint)
    plan = make_plan(
        model,
        profile,
        load_hardware("rtx4090"),
        budget,
        context=64,
        min_neurons=0,
        solver="greedy",
        objective="mass",  # the time objective keeps layers this tiny on the CPU
    )
    return plan, save_plan(plan, tmp_path / name)


def test_cpu_only_plan_is_adopted(model, tmp_path):
    plan, path = plan_file(model, tmp_path, 0, "cpu.safetensors")
    eng = Engine(model, threads=1, plan=path)
    assert eng.plan is not None and all(h.size == 0 for h in eng.hot_neurons)


def test_rust_reads_the_same_neuron_table(model, synth_gguf, tmp_path):
    plan, path = plan_file(model, tmp_path, 2**20, "gpu.safetensors")
    assert sum(len(h) for h in plan.gpu_neurons) > 0
    core = Engine(model, threads=1).core_model
    adopted = core.load_plan(str(path), model.fingerprint, 2**20)
    assert adopted.gpu_bytes == plan.gpu_bytes and adopted.model_fingerprint == model.fingerprint
    assert sum(b for _, b in adopted.allocations) == plan.gpu_bytes
    for mine, theirs in zip(adopted.hot_neurons, plan.gpu_neurons):
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))
    with pytest.raises(PlanError):
        core.load_plan(str(path), "another model")
    with pytest.raises(VramBudgetError):
        core.load_plan(str(path), model.fingerprint, plan.gpu_bytes - 1)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(PlanError):
        core.load_plan(str(bad))
    for shape in ({**TINY, "layers": 4}, {**TINY, "ffn": 128}):  # the plan: 3 layers x 256
        other = load_model(synth_gguf(dtype="Q8_0", **shape))
        with pytest.raises(PlanError):
            Engine(other, threads=1).core_model.load_plan(str(path))
    # A plan that uses VRAM does not fit the CPU device.
    with pytest.raises(VramBudgetError):
        Engine(model, threads=1, plan=path)


def test_plan_for_another_model_is_refused(model, synth_gguf, tmp_path):
    other = load_model(synth_gguf(dtype="Q8_0", seed=1, **TINY))
    _, path = plan_file(other, tmp_path, 0, "other.safetensors")
    with pytest.raises(PlanError):
        Engine(model, threads=1, plan=path)


def test_devices(model):
    with pytest.raises(CudaError):
        Engine(model, threads=1, device="cuda")
    with pytest.raises(CudaError):
        Engine(model, threads=1, device="cuda:3")
    with pytest.raises(UnsupportedError):
        Engine(model, threads=1, device="tpu")
