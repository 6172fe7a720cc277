"""Plan files, activation profiles, hardware profiles, sizes and the exact byte accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, PlanError, ShapeError, VramBudgetError
from powerinfer_rs.formats.plan import load_plan, save_plan
from powerinfer_rs.formats.profile import read_profile, synthetic_profile, write_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import (
    ModelShape,
    Placement,
    gpu_allocation,
    list_profiles,
    load_hardware,
    make_plan,
    parse_bytes,
    total_bytes,
)
from powerinfer_rs.planning.gpu_probe import GpuInfo, auto_budget
from powerinfer_rs.planning.predictor_size import read_predictor_sizes

from conftest import write_zero_predictors

REPO = Path(__file__).resolve().parents[1]
TINY = dict(dim=64, ffn=256, layers=3, heads=4, kv_heads=2, vocab=300)


@pytest.fixture(scope="module")
def model(synth_gguf):
    return load_model(synth_gguf(dtype="Q8_0", **TINY))


@pytest.fixture(scope="module")
def other_model(synth_gguf):
    return load_model(synth_gguf(dtype="Q8_0", seed=1, **TINY))


@pytest.fixture(scope="module")
def profile(model):
    return synthetic_profile(3, 256, 1000, seed=0, model_fingerprint=model.fingerprint)


def plan_for(model, profile, budget, **kw):
    kw.setdefault("solver", "greedy" if not _has_highspy() else "auto")
    kw.setdefault("objective", "mass")  # the time objective keeps layers this tiny on the CPU
    return make_plan(
        model, profile, load_hardware("rtx4090"), budget, context=64, min_neurons=0, **kw
    )


def _has_highspy() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    "text,value",
    [
        ("8GiB", 8 * 2**30),
        ("8GB", 8 * 10**9),
        ("512MiB", 512 * 2**20),
        ("0", 0),
        ("1.5 GiB", 3 * 2**29),
        ("123", 123),
        ("4kib", 4096),
        (7, 7),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("bad", ["", "eight", "8XB", "-1GiB", "8 Gi B", "nan", "1e400GiB", "GiB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(PlanError):
        parse_bytes(bad)


# ----------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("share", [0.0, 0.3, 0.6, 1.0])
def test_plan_bytes_are_the_allocation_list_and_fit(model, profile, share):
    full = plan_for(model, profile, 10 * 2**30).gpu_bytes
    budget = int(full * share)
    plan = plan_for(model, profile, budget)
    allocs = gpu_allocation(plan, model)
    assert plan.gpu_bytes == total_bytes(allocs) <= budget
    assert all(b % 256 == 0 for _, b in allocs)
    per_layer = plan.bytes["gpu"]["per_layer"]
    assert sum(per_layer) + plan.bytes["gpu"]["global"] == plan.gpu_bytes
    for i, n in enumerate(per_layer):
        assert n == total_bytes([a for a in allocs if a[0].startswith(f"blk.{i}.")])


def test_budget_zero_is_a_valid_cpu_only_plan(model, profile, tmp_path):
    plan = plan_for(model, profile, 0)
    assert plan.is_cpu_only() and plan.gpu_bytes == 0
    assert gpu_allocation(plan, model) == []
    assert all(ids.size == 0 for ids in plan.gpu_neurons)
    path = save_plan(plan, tmp_path / "cpu.safetensors")
    again = load_plan(path, model, budget_bytes=0)
    assert again.is_cpu_only() and again.tokens_per_s > 0


def test_slab_and_down_t_rules():
    from powerinfer_rs.planning.accounting import slab_bytes
    from powerinfer_rs.testing.synth_model import SynthSpec

    cfg = SynthSpec(48, 64, 1, heads=4, kv_heads=2, vocab=300, max_context=64).model_config()
    # dim 48 is no whole number of Q8_0 blocks: down_t falls back to F16
    shape = ModelShape.from_config(cfg, "F16", dtypes={"blk.0.ffn_down": "Q8_0"})
    assert shape.down_t_dtype(0) == "F16"
    assert shape.neuron_read_bytes(0) == 3 * 48 * 2
    assert slab_bytes(shape, 0, 32) == -(-32 * (288 + 4) // 256) * 256
    q = ModelShape.from_config(cfg.replace(dim=64, head_dim=16), "Q4_0")
    assert q.down_t_dtype(0) == "Q4_0" and q.neuron_read_bytes(0) == 3 * 36
    # K-quants: down_t keeps the format when dim is whole super-blocks, else llama.cpp's
    # 32-weight fallback (as the engine's transpose does).
    for dim, want, down_t_bytes in ((576, "Q5_0", 18 * 22), (512, "Q4_K", 2 * 144)):
        k = ModelShape.from_config(
            cfg.replace(dim=dim, head_dim=dim // 4),
            "F16",
            dtypes={"blk.0.ffn_down": "Q4_K", "blk.0.ffn_gate": "Q8_0"},
        )
        assert k.down_t_dtype(0) == want
        assert k.neuron_read_bytes(0) == dim // 32 * 34 + dim * 2 + down_t_bytes


# ----------------------------------------------------------------------------- plan files
def test_plan_round_trip(model, profile, tmp_path):
    plan = plan_for(model, profile, 400 * 2**10, objective="time")
    path = save_plan(plan, tmp_path / "PLAN.safetensors")
    back = load_plan(path, model, budget_bytes=plan.gpu_bytes)
    assert back.to_json() == json.loads(json.dumps(plan.to_json()))
    for a, b in zip(plan.gpu_neurons, back.gpu_neurons):
        np.testing.assert_array_equal(a, b)
    assert back.placement.key() == plan.placement.key()
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
        assert meta["format"] == "powerinfer-rs-plan/1"
        assert f.get_tensor("blk.0.gpu_neurons").dtype == np.int32
    j = json.loads(meta["plan"])
    for key in (
        "model_fingerprint",
        "budget_bytes",
        "hardware",
        "context",
        "objective",
        "bytes",
        "placement",
        "bucket",
        "predicted",
        "solver",
    ):
        assert key in j
    assert {"status", "mip_gap", "solve_time_s"} <= set(j["solver"])


def test_plan_refuses_other_model_and_over_budget(model, other_model, profile, tmp_path):
    plan = plan_for(model, profile, 400 * 2**10)
    assert plan.gpu_bytes > 0
    path = save_plan(plan, tmp_path / "p.safetensors")
    with pytest.raises(PlanError, match="made for model"):
        load_plan(path, other_model)
    with pytest.raises(VramBudgetError):
        load_plan(path, model, budget_bytes=plan.gpu_bytes - 1)
    load_plan(path, model, budget_bytes=plan.gpu_bytes)


def test_profile_from_another_model_is_refused(model, other_model, profile):
    with pytest.raises(PlanError, match="profile"):
        plan_for(other_model, profile, 0)
    plan_for(other_model, profile, 0, check_fingerprint=False)


def test_bad_plan_files(tmp_path, model):
    with pytest.raises(PlanError):
        load_plan(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(PlanError):
        load_plan(junk)


def test_over_budget_for_hardware(model, profile):
    with pytest.raises(VramBudgetError):
        plan_for(model, profile, 25 * 2**30)  # an rtx4090 has 24564 MiB
    with pytest.raises(VramBudgetError):
        make_plan(model, profile, load_hardware("cpu-only"), 2**20)
    plan = make_plan(model, profile, load_hardware("cpu-only"), 0, solver="greedy")
    assert plan.is_cpu_only()


# ----------------------------------------------------------------------------- profiles
def test_profile_round_trip(tmp_path):
    prof = synthetic_profile(2, 96, 300, seed=3, model_fingerprint="abc")
    path = write_profile(
        tmp_path / "prof", prof.counts, prof.tokens, model_fingerprint="abc", corpus=["a", "b"]
    )
    assert path.name == "profile.safetensors"
    back = read_profile(tmp_path / "prof")
    assert back.tokens == 300 and back.model_fingerprint == "abc"
    assert json.loads(back.meta["corpus"]) == ["a", "b"]
    for a, b in zip(prof.counts, back.counts):
        np.testing.assert_array_equal(a, b)
    assert read_profile(path).n_layers == 2


def test_profile_errors(tmp_path, model):
    with pytest.raises(ModelFileError):
        read_profile(tmp_path / "nothing")
    with pytest.raises(ModelFileError):
        write_profile(tmp_path / "x", [np.array([5, 1])], 3)  # count > tokens
    prof = synthetic_profile(2, 256, 100)  # 2 layers, model has 3
    with pytest.raises(ShapeError):
        make_plan(model, prof, load_hardware("rtx4090"), 0, solver="greedy")


def test_synthetic_profile_is_power_law():
    prof = synthetic_profile(1, 4096, 10_000, seed=0, mean_active=0.1)
    f = np.sort(prof.frequencies(0))[::-1]
    assert abs(f.mean() - 0.1) < 0.01
    assert f[:410].sum() / f.sum() > 0.3  # the hottest 10 % carry a large share


# ----------------------------------------------------------------------------- hardware
def test_shipped_hardware_profiles():
    names = list_profiles()
    assert {"rtx4090", "rtx2080ti", "h100-pcie", "h100-sxm", "h200", "cpu-only"} <= set(names)
    for n in names:
        hw = load_hardware(n)
        assert hw.cpu_mem_bw > 0 and (hw.has_gpu or n == "cpu-only")
    link = REPO / "planner" / "hardware"
    if link.exists():
        assert (
            link.is_symlink()
            and link.resolve()
            == (REPO / "python" / "powerinfer_rs" / "planning" / "hardware").resolve()
        )


def test_hardware_from_file_and_errors(tmp_path):
    d = json.loads(json.dumps(load_hardware("rtx4090").to_dict()))
    d["name"] = "mine"
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(d))
    assert load_hardware(f).name == "mine" and load_hardware(f).cpu_dispatch_us == 0
    # The measured pool start (optional) is read back, and refused when negative.
    f.write_text(json.dumps({**d, "cpu_dispatch_us": 3.5}))
    assert load_hardware(f).cpu_dispatch_us == 3.5
    f.write_text(json.dumps({**d, "cpu_dispatch_us": -1}))
    with pytest.raises(PlanError, match="cpu_dispatch_us"):
        load_hardware(f)
    # The rows-by-index rates (optional): read back, the dense rate where absent.
    hw = load_hardware(f.write_text(json.dumps({**d, "cpu_rows_bw": 9.5})) and f)
    assert hw.rows_bw == 9.5 and hw.gate_bw == hw.cpu_mem_bw == d["cpu_mem_bw"]
    f.write_text(json.dumps({**d, "cpu_gate_bw": "fast"}))
    with pytest.raises(PlanError, match="cpu_gate_bw"):
        load_hardware(f)
    with pytest.raises(PlanError):
        load_hardware("no-such-card")
    del d["pcie_bw"]
    f.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="pcie_bw"):
        load_hardware(f)


def test_auto_budget():
    gpu = GpuInfo("NVIDIA H200", 150 * 2**30, 100 * 2**30)
    assert auto_budget(gpu) == 100 * 2**30 - 5 * 2**30
    small = GpuInfo("x", 8 * 2**30, 2**30)
    assert auto_budget(small) == 2**30 - 512 * 2**20


def test_auto_budget_without_gpu(monkeypatch):
    from powerinfer_rs.planning import gpu_probe

    monkeypatch.setattr(gpu_probe, "detect_gpu", lambda: None)
    with pytest.raises(PlanError, match="--vram-budget"):
        gpu_probe.auto_budget()


def test_predictor_file_sizes(tmp_path, model):
    from safetensors.numpy import save_file

    c = model.config
    t = write_zero_predictors(tmp_path / "pred.safetensors", c, 32)
    sizes = read_predictor_sizes(tmp_path / "pred.safetensors", c)
    assert sizes.allocations[0] == [32 * c.dim * 2, c.ffn_dim * 32 * 2]
    t["blk.1.fc2"] = np.zeros((c.ffn_dim + 1, 32), np.float16)
    save_file(t, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ShapeError):
        read_predictor_sizes(tmp_path / "bad.safetensors", c)


def test_placement_cpu_only_helper():
    pl = Placement.cpu_only(3)
    assert not pl.uses_gpu() and pl.n_layers == 3
