"""The facts Rust owns and Python asks for (issue 60): the device grammar, the table of which
sparsity mode runs where, and their refusal texts, each written once in the Rust core. These
tests fail when Python grows its own copy again and the two drift."""

from __future__ import annotations

import argparse

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
        with pytest.raises(UnsupportedError, match=f"device must be a string, {NAMES}, got "):
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
