"""gpt-oss (``gpt-oss``) plans and the hybrid executor: the planner places its flattened
experts (``n_expert × expert_ffn`` neurons per layer) and its attention, whose GPU side takes
the layer's sink logits (``attn_sinks``, one more score per head in the softmax), the sliding
window on the even layers, and the q/k/v/o biases; the hot experts' gate and up rows take their
biases and the clamped SwiGLU on the GPU, and the CPU adds every routed expert's down bias with
its cold part. On gpu-sim (each kernel's contract) and gpu-emu (the CUDA kernels' source run on
the CPU: no GPU here), in dense and threshold mode, against the CPU engine in the same mode:
logits within the hybrid tolerance, greedy tokens equal, over a context past the window; the
GPU allocations those of the plan and of the planner's accounting, name for name. MXFP4
experts upload as Q8_0 exactly; their transposed down rows are a Q8_0 copy (dense mode's
tolerance below)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_gptoss import TEMPLATE
from test_hybrid import DEVICES, WITH_EMU, assert_close, greedy
from test_hybrid_moe import measured_profile, thresholds_of

from powerinfer_rs import Engine
from powerinfer_rs.formats.plan import save_plan
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import gpu_allocation, load_hardware, make_plan
from powerinfer_rs.testing.synth_gptoss import write_gptoss_gguf

#: The hybrid's tolerance (test_hybrid.py's TOL): f16 KV caches on both sides, other sums.
TOL = 1e-3
#: Dense mode with MXFP4 experts: the GPU's hot down rows (and the CPU engine's sparse ones) are
#: the transposed experts re-encoded in Q8_0, where the CPU engine's dense decode reads the
#: file's MXFP4 rows: 7.7e-3 of the largest logit with every expert on the GPU, the same as the
#: CPU engine's own threshold mode at t = 0 (which reads that copy) against its dense decode.
TOL_MXFP4_DENSE = 1e-2
#: A prompt past the 16-position window, then decode steps on the GPU.
PROMPT = [int(t) for t in np.random.default_rng(4).integers(3, 300, 20)]
STEPS = 6

_models: dict[str, object] = {}


def gptoss(tmp_path_factory, experts: str | None):
    key = str(experts)
    if key not in _models:
        d = tmp_path_factory.mktemp("gptoss_hyb")
        dtype = "F32" if experts is None else "BF16"
        path = write_gptoss_gguf(
            d / "m.gguf", dtype=dtype, expert_dtype=experts, chat_template=TEMPLATE
        )
        _models[key] = load_model(path)
    return _models[key]


def plan_at(model, share: float, mode: str):
    total = sum(t.nbytes for t in model.tensors.values())
    return make_plan(
        model, measured_profile(model), load_hardware("rtx4090"), int(share * total),
        context=64, bucket=32, sparsity=mode, objective="mass", min_neurons=0, solver="greedy",
    )  # fmt: skip


def split_plan(model, mode: str):
    """A plan with some experts' neurons on each side and attention on the GPU."""
    n = model.config.n_expert * model.config.expert_ffn_dim
    for share in (0.5, 0.4, 0.6, 0.3, 0.7):
        plan = plan_at(model, share, mode)
        hot = [len(ids) for ids in plan.gpu_neurons]
        if any(0 < h < n for h in hot) and any(plan.placement.attention):
            return plan
    raise AssertionError("no budget splits the experts")


CASES = [
    (experts, mode, device, place)
    for experts in (None, "MXFP4")
    for mode in ("dense", "threshold")
    for device in DEVICES + (["gpu-emu"] if WITH_EMU else [])
    for place in ("half", "all")
    # The emulator runs every CUDA thread on one core: one file, one placement per mode.
    if device != "gpu-emu" or (experts == "MXFP4" and place == "half")
]


@pytest.mark.parametrize(("experts", "mode", "device", "place"), CASES)
def test_the_hybrid_matches_the_cpu_engine(tmp_path_factory, tmp_path, experts, mode, device,
                                           place):  # fmt: skip
    m = gptoss(tmp_path_factory, experts)
    c = m.config
    plan = plan_at(m, 4.0, mode) if place == "all" else split_plan(m, mode)
    if place == "all":
        assert all(plan.placement.attention)
        assert all(len(ids) == c.n_expert * c.expert_ffn_dim for ids in plan.gpu_neurons)
    path = save_plan(plan, tmp_path / "plan.safetensors")
    kw: dict = {"threads": 2, "sparsity": mode}
    if mode == "threshold":
        kw["thresholds"] = thresholds_of(m)
    cpu = Engine(m, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hyb = Engine(m, plan=str(path), device=device, **kw)
    info = hyb.gpu_info()
    assert info["allocations"] == hyb.plan.allocations == gpu_allocation(plan, m)
    if info["allocated_bytes"] is not None:
        assert info["allocated_bytes"] == plan.gpu_bytes
    names = {n for n, _ in info["allocations"]}
    for i in range(c.n_layers):
        if plan.placement.attention[i]:
            assert f"blk.{i}.attn_sinks" in names
        if len(plan.gpu_neurons[i]):
            assert {f"blk.{i}.ffn_gate_exps.bias", f"blk.{i}.ffn_up_exps.bias"} <= names
    want, want_toks = greedy(cpu, PROMPT, STEPS)
    got, got_toks = greedy(hyb, PROMPT, STEPS)
    what = f"gpt-oss {experts} {mode} {device} {place}"
    tol = TOL_MXFP4_DENSE if (experts and mode == "dense") else TOL
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, tol, f"{what} step {i}")
    if experts and mode == "dense" and place == "all":
        # ... and within TOL of the CPU engine reading that same copy (t = 0: the dense function).
        zero = Engine(m, threads=2, sparsity="threshold", thresholds=[0.0] * c.n_layers)
        same, _ = greedy(zero, PROMPT, STEPS)
        for i, (g, w) in enumerate(zip(got, same)):
            assert_close(g, w, TOL, f"{what} step {i} against the transposed rows")
    assert got_toks == want_toks
    info = hyb.gpu_info()
    assert info["steps"] >= STEPS and sum(t[2] + t[3] for t in info["transfers"]) > 0
    if place == "half":
        assert sum(info["phases"]["cold_bytes"]) > 0, what
    if device == "gpu-emu":
        launches = info["kernel_launches"]
        assert launches.get("attention_decode", 0) >= STEPS, launches
        assert launches.get("expert_flags", 0) >= STEPS, launches
        if mode == "threshold":
            assert launches.get("threshold_mask", 0) >= STEPS, launches


def test_the_gpu_attention_takes_the_sinks(tmp_path_factory, tmp_path):
    """Everything on gpu-sim: the hybrid's steps follow the CPU engine with its sinks, and
    are far from the same model without them (the sinks' term is no rounding)."""
    m = gptoss(tmp_path_factory, None)
    plan = plan_at(m, 4.0, "dense")
    path = save_plan(plan, tmp_path / "plan.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hyb = Engine(m, plan=str(path), device="gpu-sim", threads=2)
    off = load_model(m.path)
    off.tensors = {k: v for k, v in off.tensors.items() if "attn_sinks" not in k}
    off.config.attn_sinks = False
    off.fingerprint += "-without-sinks"
    _, toks = greedy(hyb, PROMPT, STEPS)
    hyb.reset()
    hyb.prefill(PROMPT)
    eng_off = Engine(off, threads=2)
    eng_off.prefill(PROMPT)
    # The same tokens through both: the GPU steps against the sink-less CPU engine's.
    worst = 0.0
    for t in toks:
        a, b = hyb.prefill([t]), eng_off.prefill([t])
        worst = max(worst, float(np.abs(a - b).max() / max(1.0, np.abs(b).max())))
    assert worst > 10 * TOL, worst


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A fresh prepared-files cache (test_autofit.py's)."""
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_vram_budget_auto_prepares_and_runs_the_hybrid(cache):
    """``--vram-budget auto``'s stages on gpt-oss (calibrated thresholds, the profile at its
    flattened width, the plan with its sinks and expert biases): the prepared plan runs on
    gpu-sim with the GPU allocations the plan's, and the command's text is that engine's."""
    from test_autofit import fast_gpu, generate, prepared_dirs

    from powerinfer_rs.formats.plan import load_plan
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.runtime import autofit

    model = write_gptoss_gguf(cache / "gptoss.gguf", chat_template=TEMPLATE)
    hw = ["--vram-budget", "2MiB", "--device", "gpu-sim", "--hardware", fast_gpu(cache)]
    code, out, err = generate("--model", str(model), *hw)
    assert code == 0, err
    (d,) = prepared_dirs(cache)
    assert autofit.read_prepared(d).sparsity == "threshold"
    c = load_model(model).config
    assert read_profile(d / "profile").layer_neurons == [c.n_expert * c.expert_ffn_dim] * 2
    plan = load_plan(d / "plan.safetensors")
    assert plan.gpu_bytes > 0
    opts = autofit.read_prepared(d).engine_options()
    eng = Engine.from_pretrained(str(model), threads=2, device="gpu-sim", **opts)
    assert eng.gpu_info()["allocations"] == eng.plan.allocations
    assert any(n.endswith("attn_sinks") for n, _ in eng.gpu_info()["allocations"])
    assert out == eng.generate("the cat sat", max_new_tokens=8, temperature=0) + "\n"
