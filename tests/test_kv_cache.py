"""The KV cache's precision: one setting for the CPU and the GPU layers, f16 by default (as
llama.cpp's), f32 on request, ggml's q8_0/q4_0/q4_1 blocks on the CPU (keys and values apart
where asked; tests/test_kv_quant.py). Against the float64 reference, every family at f16 stays
within 1e-3 of the largest logit (prefill and one-token decoding), at f32 within 1e-5; the two
settings give different logits (the rounding happens), and the hybrid executor's GPU layers,
which hold f16, agree with the CPU engine at f16 (tests/test_hybrid_families.py)."""

from __future__ import annotations

import numpy as np
import pytest
from test_architectures import ARCHS, GELU

from powerinfer_rs import Engine
from powerinfer_rs.errors import PlanError, UnsupportedError
from powerinfer_rs.formats.plan import save_plan
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import gpu_allocation

from reference import reference_logits

#: |engine − float64 reference| per logit, over the largest |reference| logit (at least 1).
TOL_F16 = 1e-3
TOL_F32 = 1e-5


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("arch", ["llama", *ARCHS])
def test_each_precision_against_the_float64_reference(synth_gguf, arch):
    act = "gelu" if arch in GELU else "silu"
    m = load_model(synth_gguf(dtype="F32", activation=act, arch=arch, **ARCHS.get(arch, {})))
    ids = [int(t) for t in np.random.default_rng(4).integers(3, m.config.vocab_size, 16)]
    want = reference_logits(m, ids)
    errors = {}
    for kv, tol in (("f16", TOL_F16), ("f32", TOL_F32)):
        eng = Engine(m, threads=2, kv_cache=kv)
        assert eng.kv_cache == kv
        batched = eng.logits(ids)
        eng.reset()
        stepped = np.stack([np.ravel(eng.prefill([t])) for t in ids])
        errors[kv] = (worst(batched, want), worst(stepped, want))
        assert max(errors[kv]) <= tol, (arch, kv, errors[kv])
    # The f16 setting does round: its logits are not the f32 ones.
    assert errors["f16"][0] > errors["f32"][0], errors


def test_default_and_bad_settings(synth_gguf):
    m = load_model(synth_gguf(dtype="F32"))
    assert Engine(m).kv_cache == "f16"
    with pytest.raises(UnsupportedError, match="KV cache type"):
        Engine(m, kv_cache="q5_1")
    # SMALL's heads are 16 values wide: no whole 32-value block.
    with pytest.raises(UnsupportedError, match="head_dim a multiple of 32"):
        Engine(m, kv_cache="q8_0")


def test_plans_record_the_precision_and_the_gpu_side_holds_it(synth_gguf, tmp_path):
    """A plan made for f32 caches counts 4 bytes a value (the engine's report agrees), runs
    with an f32 engine on each GPU device with the CPU engine's logits, and is refused by an
    engine holding f16; an Engine given the plan and no kv_cache takes the plan's."""
    from test_hybrid import DEVICES_WITH_EMU, assert_close, greedy
    from test_hybrid_families import make

    m = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3))
    plans = {}
    for kv in ("f16", "f32"):
        plan = make(m, 4.0, None, kv_cache=kv)
        assert plan.kv_cache == kv and all(plan.placement.attention)
        plans[kv] = (plan, str(save_plan(plan, tmp_path / f"{kv}.safetensors")))
    caches = {kv: dict(gpu_allocation(p, m))["blk.0.cache_k"] for kv, (p, _) in plans.items()}
    assert caches["f32"] == 2 * caches["f16"]
    path32 = plans["f32"][1]
    with pytest.raises(PlanError, match="f32"):
        Engine(m, threads=2, plan=path32, device="gpu-sim", kv_cache="f16")
    cpu = Engine(m, threads=2, kv_cache="f32")
    want, want_toks = greedy(cpu, [5, 17, 123, 42], 8)
    for device in DEVICES_WITH_EMU:
        hyb = Engine(m, threads=2, plan=path32, device=device)
        assert hyb.kv_cache == "f32"
        assert hyb.gpu_allocation_report() == [tuple(a) for a in gpu_allocation(plans["f32"][0], m)]
        got, got_toks = greedy(hyb, [5, 17, 123, 42], 8)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, 1e-3, f"{device} f32 step {i}")
        assert got_toks == want_toks
        if device == "gpu-emu":
            launches = hyb.gpu_info()["kernel_launches"]
            assert launches.get("attention_decode_f32", 0) >= 8, launches
            assert "attention_decode" not in launches, launches
