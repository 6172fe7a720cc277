"""The facts Rust owns and Python asks for (issue 60): the device grammar, the table of which
sparsity mode runs where, and their refusal texts, each written once in the Rust core. These
tests fail when Python grows its own copy again and the two drift."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from powerinfer_rs import _core
from powerinfer_rs.cli import _auto_device
from powerinfer_rs.errors import CudaError, PowerInferError, UnsupportedError
from powerinfer_rs.facts import MODE_TABLE, mode_refusal, mode_row, modes_at
from powerinfer_rs.planning.model_shape import MOE_SPARSITIES, SPARSITIES
from powerinfer_rs.runtime.placement import check_device

NAMES = '"cpu", "gpu-sim", "gpu-emu", "cuda" or "cuda:N"'
VALID = {
    "cpu": ("cpu", None),
    "gpu-sim": ("gpu-sim", None),
    "gpu-emu": ("gpu-emu", None),
    "cuda": ("cuda", 0),
    "cuda:0": ("cuda", 0),
    "cuda:7": ("cuda", 7),
    "cuda:007": ("cuda", 7),
}
INVALID = ["gpu", "GPU", "CUDA", "Cuda:1", " cuda", "cuda ", "cuda:", "cuda:-1", "cuda:+1",
           "cuda:x", "cuda:1.0", "cuda:\u0663", "cuda:1:2", "cpu:0", "gpu-sim:0", "tpu", "",
           "cuda:99999999999999999999999"]  # fmt: skip


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_devices_parse_the_same_on_both_sides(name):
    assert _core.parse_device(name) == VALID[name]
    # The auto-fit's --device and the Engine's check take the Rust parse: a valid name passes
    # the grammar, and the Engine's check is Rust's (the device may still be absent here).
    assert _auto_device(argparse.Namespace(device=name)) == name
    try:
        got = check_device(name)
    except (CudaError, UnsupportedError) as e:
        with pytest.raises(type(e)) as rust:
            _core.check_device(name)
        assert str(rust.value) == str(e)
        assert name.startswith(("cuda", "gpu-emu"))
    else:
        assert got == _core.check_device(name)
        kind, index = VALID[name]
        assert got == (kind if index is None else f"{kind}:{index}")


@pytest.mark.parametrize("name", INVALID)
def test_invalid_devices_are_refused_with_rusts_one_text(name):
    want = f"unsupported: device {_rust_debug(name)}: expected {NAMES}"
    for call in (
        _core.parse_device,
        _core.check_device,
        check_device,
        lambda d: _auto_device(argparse.Namespace(device=d)),
    ):
        with pytest.raises(UnsupportedError) as e:
            call(name)
        assert str(e.value).startswith(want), (call, str(e.value))


def test_plain_gpu_is_refused_and_says_which_to_use():
    """Plain gpu is refused on both sides (three devices run a GPU plan; it says not which)."""
    with pytest.raises(UnsupportedError) as e:
        check_device("gpu")
    assert str(e.value) == (
        f'unsupported: device "gpu": expected {NAMES}: "gpu" does not say which; "cuda" is a '
        'real GPU, "gpu-sim" and "gpu-emu" run a plan\'s GPU side on the CPU'
    )


@pytest.mark.parametrize("value", [None, 3, b"cuda", ["cpu"]])
def test_a_device_that_is_no_string_is_refused_by_rust(value):
    for call in (_core.parse_device, _core.check_device, check_device):
        with pytest.raises(UnsupportedError, match=rf"device must be a string \({NAMES}\), got "):
            call(value)


def test_missing_gpus_are_cuda_errors_in_rusts_words():
    with pytest.raises(CudaError, match=r"cuda:1000000 was asked for|no CUDA support") as e:
        check_device("cuda:1000000")
    assert isinstance(e.value, PowerInferError)


def test_the_mode_table_is_the_engines():
    assert tuple(r["name"] for r in MODE_TABLE) == _core.SPARSITY_MODES
    places = ("cpu", "gpu", "moe_cpu", "moe_gpu", "store", "moe_store")
    for row in MODE_TABLE:
        assert set(row) == {"name", *places, "relu_only", "needs"}
        assert row["cpu"], "every mode runs on the CPU engine"
        for place in places:
            why = mode_refusal(row["name"], place)
            assert (why is None) == row[place], (row["name"], place, why)
    # What the planner plans for is what the GPU side runs.
    assert set(SPARSITIES) == set(modes_at("gpu"))
    assert set(MOE_SPARSITIES) == set(modes_at("moe_gpu"))
    # The facts the review found retyped: the CPU runs threshold and predictor inside experts,
    # the GPU side no predictors there; input mode is the CPU's alone.
    assert mode_row("threshold")["moe_cpu"] and mode_row("predictor")["moe_cpu"]
    assert not mode_row("predictor")["moe_gpu"] and mode_row("threshold")["moe_gpu"]
    assert modes_at("gpu") == ("dense", "exact-relu", "threshold", "predictor")
    assert modes_at("store") == ("exact-relu", "predictor")
    assert modes_at("moe_store") == ("dense", "exact-relu")
    with pytest.raises(UnsupportedError, match="place"):
        mode_refusal("dense", "tpu")
    with pytest.raises(UnsupportedError, match="sparsity"):
        mode_refusal("sparse", "cpu")


def test_info_reads_the_table(synth_gguf):
    from test_moe import MOE_ARCHS

    from powerinfer_rs.info import sparsity_modes
    from powerinfer_rs.loading import load_model

    for kw in ({}, {"arch": "qwen2moe", **MOE_ARCHS["qwen2moe"]}):
        model = load_model(synth_gguf(dtype="F32", activation="relu", **kw))
        moe = bool(model.config.n_expert)
        lines = dict(sparsity_modes(model))
        assert tuple(lines) == _core.SPARSITY_MODES
        for mode, text in lines.items():
            runs = mode_row(mode)["moe_cpu" if moe else "cpu"]
            assert text.startswith(("yes", "always")) == runs, (mode, text)
            if not runs:
                assert text == f"no: {mode_refusal(mode, 'moe_cpu' if moe else 'cpu')}"
            gpu = mode_row(mode)["moe_gpu" if moe else "gpu"]
            assert ("CPU only" in text) == (runs and not gpu), (mode, text)


def _rust_debug(s: str) -> str:
    """``s`` as Rust's ``{:?}`` writes it (the tests' names: ASCII, or printable non-ASCII)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ----------------------------------------------------------------------------- the plan reader
def _plan(synth_gguf, tmp_path, **kw):
    """A tiny model and a plan file for it (GPU neurons at 1 MiB; a RAM tier with ``ram``)."""
    from powerinfer_rs.formats.plan import save_plan
    from powerinfer_rs.formats.profile import synthetic_profile
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.planning import load_hardware, make_plan

    model = load_model(synth_gguf(dtype="Q8_0", dim=64, ffn=256, layers=3, heads=4, kv_heads=2,
                                  vocab=300, activation="relu"))  # fmt: skip
    profile = synthetic_profile(3, 256, 1000, seed=0, model_fingerprint=model.fingerprint)
    hw = load_hardware("cpu-only" if "ram_budget" in kw else "rtx4090")
    budget = 0 if "ram_budget" in kw else 2**20
    plan = make_plan(model, profile, hw, budget, context=64, min_neurons=0, solver="greedy",
                     objective="mass", **kw)  # fmt: skip
    return model, plan, save_plan(plan, tmp_path / "p.safetensors")


def test_python_reads_plans_through_the_engines_reader(synth_gguf, tmp_path):
    from powerinfer_rs.formats.plan import load_plan

    model, plan, path = _plan(synth_gguf, tmp_path)
    raw = _core.read_plan(path)
    back = load_plan(path, model)
    assert raw["n_layers"] == back.n_layers == 3 and raw["gpu_bytes"] == back.gpu_bytes
    for a, b, c in zip(raw["gpu_neurons"], back.gpu_neurons, plan.gpu_neurons):
        assert a.dtype == np.int64 and np.array_equal(a, b) and np.array_equal(a, c)
    assert back.to_json() == json.loads(json.dumps(plan.to_json()))
    assert raw["ram_neurons"] is None and back.ram_neurons is None
    # The engine's own reading of the same file agrees.
    from powerinfer_rs import Engine

    adopted = Engine(model, threads=1).core_model.load_plan(str(path), model.fingerprint)
    for a, b in zip(adopted.hot_neurons, back.gpu_neurons):
        assert np.array_equal(a, b)


def test_a_ram_tier_is_read_by_rust_and_the_engine_takes_the_file(synth_gguf, tmp_path):
    from powerinfer_rs import Engine
    from powerinfer_rs.formats.plan import load_plan

    model, plan, path = _plan(synth_gguf, tmp_path, ram_budget=2**30, store_cluster=2)
    raw = _core.read_plan(path)
    assert raw["ram_neurons"] is not None
    for a, b in zip(raw["ram_neurons"], plan.ram_neurons):
        assert np.array_equal(a, b)
    assert load_plan(path, model).ram == json.loads(json.dumps(plan.ram))
    Engine(model, threads=1, plan=path)  # the engine's reader takes a RAM tier's tensors


def _edited(path, out, edit_meta=None, edit_tensors=None):
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), "numpy") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    j = json.loads(meta["plan"])
    if edit_meta:
        edit_meta(j)
    if edit_tensors:
        edit_tensors(tensors)
    meta["plan"] = json.dumps(j)
    save_file(tensors, str(out), meta)
    return out


BROKEN = {
    "buckets disagree": (lambda j: j["placement"].update(ffn_buckets=[9, 9, 9]), None),
    "short ranks": (lambda j: j["predictors"].update(ranks=[1]), None),
    "float context": (lambda j: j.update(context=2.5), None),
    "kv cache": (lambda j: j.update(kv_cache="f8"), None),
    "twice": (None, lambda t: t.update({"blk.0.gpu_neurons": np.array([1, 1], np.int32)})),
    "out of range": (None, lambda t: t.update({"blk.1.gpu_neurons": np.array([999], np.int32)})),
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_one_error_path_for_a_broken_plan(synth_gguf, tmp_path, what):
    """Python's reader and the engine's raise the same PlanError, in the engine's words."""
    from powerinfer_rs import Engine
    from powerinfer_rs.errors import PlanError
    from powerinfer_rs.formats.plan import load_plan

    model, _, path = _plan(synth_gguf, tmp_path)
    bad = _edited(path, tmp_path / "bad.safetensors", *BROKEN[what])
    with pytest.raises(PlanError) as py_side:
        load_plan(bad, model)
    with pytest.raises(PlanError) as rust_side:
        _core.read_plan(bad)
    assert str(py_side.value) == str(rust_side.value)
    assert str(bad) in str(py_side.value)
    with pytest.raises(PlanError) as engine_side:
        Engine(model, threads=1).core_model.load_plan(str(bad), model.fingerprint)
    assert str(engine_side.value) == str(py_side.value)
