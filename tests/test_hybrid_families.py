"""Every family on the hybrid executor, one test body: a synthetic model of each family (files as
llama.cpp's converter writes them, quantized), planned with the mass objective and no neuron
minimum at four placements (nothing on the GPU, everything, every other layer, about half of
the bytes: partial hot-neuron sets and slabs), runs on each GPU device (gpu-sim; gpu-emu, the
real CUDA kernels on the CPU, for the placements that put something there; cuda where present)
in each of the family's modes, and gives the CPU engine's logits within 1e-3 at every decode
step and the same greedy tokens. Every run that places something asserts the GPU side ran:
its allocations equal the plan's, decode steps and transfers were counted, and on gpu-emu the
kernels of each placed step were launched. A plan that places nothing says so instead."""

from __future__ import annotations

import warnings

import pytest
from test_hybrid import DEVICES, WITH_EMU, assert_close, greedy, random_gpu_predictors

from powerinfer_rs import Engine
from powerinfer_rs.formats.plan import save_plan
from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import accounting, load_hardware, make_plan
from powerinfer_rs.planning.predictor_size import PredictorSizes

#: Each family's synth arguments: its own activation where PowerInfer ships a ReLU version
#: (ReluLLaMA, ReluFalcon, OPT, Bamboo), else the family's (GELU for Gemma, SiLU otherwise).
FAMILIES = {
    "llama": {"activation": "relu"},
    "mistral": {"activation": "silu", "sliding_window": 5},
    "qwen2": {"activation": "silu"},
    "gemma3": {"activation": "gelu", "sliding_window": 4, "tie": True, "layers": 6},
    "phi3": {"activation": "silu"},
    "falcon": {"activation": "relu", "kv_heads": 1},
    "opt": {"activation": "relu", "tie": True, "kv_heads": 4},
    "bamboo": {"activation": "relu"},
}
SHAPE = dict(dim=64, ffn=160, layers=4, heads=4, kv_heads=2, vocab=300)
PLACEMENTS = ("none", "all", "alternate", "half")
TOL = 1e-3
#: Dense mode on a quantized model: the GPU side reads its hot neurons' down rows from the
#: transposed down projection, re-quantized (a Q8_0 column is no Q8_0 row), where the CPU's
#: dense decode reads the file's own rows. Measured here, as a share of the largest logit:
#: up to 1.9e-3 with every layer's FFN on the GPU ("all"), 1.4e-3 "alternate", 7.7e-4 "half";
#: on F16 files, which transpose exactly, 1.3e-6 (the test below). Every sparse mode reads the
#: transposed rows on both sides and holds TOL.
TOL_DENSE_REQUANTIZED = 2.5e-3
STEPS = 10
DEVICES_HERE = DEVICES + (["gpu-emu"] if WITH_EMU else [])


def modes(model) -> list[str]:
    relu = model.config.activation == "relu"
    return ["dense", "exact-relu", "predictor"] if relu else ["dense", "threshold"]


_models: dict[str, object] = {}


@pytest.fixture(scope="module")
def family_model(synth_gguf):
    def get(arch: str):
        if arch not in _models:
            args = {**SHAPE, **FAMILIES[arch]}
            _models[arch] = load_model(synth_gguf(dtype="Q8_0", seed=5, arch=arch, **args))
        return _models[arch]

    return get


def make(model, share: float, predictors: PredictorSizes | None, kv_cache: str = "f16"):
    """The mass-objective plan of ``model`` at ``share`` of its bytes (context 64, bucket 32)."""
    c = model.config
    profile = synthetic_profile(
        c.n_layers, c.ffn_dim, 2000, seed=1, model_fingerprint=model.fingerprint
    )
    total = sum(t.nbytes for t in model.tensors.values())
    return make_plan(
        model,
        profile,
        load_hardware("rtx4090"),
        int(share * total),
        context=64,
        bucket=32,
        min_neurons=0,
        solver="greedy",
        objective="mass",
        predictors=predictors,
        kv_cache=kv_cache,
    )


def plan_at(model, path, placement: str, predictors: PredictorSizes | None) -> str:
    """A plan of ``model`` for one of PLACEMENTS: budget 0; everything; everything on the
    even layers only; and the first share from half the model's bytes up at which some layer
    holds part of its neurons (a partial hot set, its last slab partly filled)."""
    c = model.config
    if placement == "half":
        for share in (0.5, 0.6, 0.7, 0.8, 0.9):
            plan = make(model, share, predictors)
            if any(0 < len(ids) < c.ffn_dim for ids in plan.gpu_neurons):
                break
        else:
            raise AssertionError("no share gives a partial hot set")
    else:
        plan = make(model, {"none": 0.0, "all": 4.0, "alternate": 4.0}[placement], predictors)
    pl = plan.placement
    if placement == "all":
        assert all(pl.attention) and pl.output
        assert all(len(ids) == c.ffn_dim for ids in plan.gpu_neurons)
    if placement == "alternate":
        for i in range(1, c.n_layers, 2):
            pl.attention[i] = pl.predictor[i] = False
            pl.ffn_buckets[i] = 0
            plan.gpu_neurons[i] = plan.gpu_neurons[i][:0]
        pl.output = False
        plan.bytes["gpu"]["total"] = accounting.total_bytes(accounting.gpu_allocation(plan, model))
    assert (plan.gpu_bytes > 0) == (placement != "none")
    return str(save_plan(plan, path))


def engine_pair(model, mode, path, device, preds):
    kw: dict = {"threads": 2, "sparsity": mode}
    if mode == "threshold":
        kw["thresholds"] = [0.01] * model.config.n_layers
    if mode == "predictor":
        kw["predictors"] = preds
    cpu = Engine(model, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hyb = Engine(model, plan=path, device=device, **kw)
    return cpu, hyb, caught


CASES = [
    (arch, device, placement)
    for arch in FAMILIES
    for device in DEVICES_HERE
    for placement in PLACEMENTS
    # The emulator runs every CUDA thread on one core: the placements that exercise the kernels.
    if not (device == "gpu-emu" and placement in ("none", "all"))
]


@pytest.mark.parametrize(("arch", "device", "placement"), CASES)
def test_family_on_the_gpu_side_matches_the_cpu_engine(
    family_model, tmp_path, arch, device, placement, monkeypatch
):
    # Threshold mode's down product over the rows that pass, on both engines: the transposed
    # rows the GPU side reads (the CPU engine would switch to the file's own rows past a
    # measured crossover, see TOL_DENSE_REQUANTIZED).
    monkeypatch.setenv("POWERINFER_RS_DOWN_CROSSOVER", "1.0")
    model = family_model(arch)
    preds, sizes = random_gpu_predictors(model, 16)
    relu = model.config.activation == "relu"
    path = plan_at(model, tmp_path / f"{placement}.safetensors", placement, sizes if relu else None)
    prompt = [5, 17, 123, 42, 7, 250]
    for mode in modes(model):
        if device == "gpu-emu" and mode == "exact-relu":
            continue  # the same kernels as predictor mode, without the predictor
        cpu, hyb, caught = engine_pair(model, mode, path, device, preds)
        info = hyb.gpu_info()
        assert info is not None
        if placement == "none":
            # Nothing placed: said, not silently run on the CPU.
            assert info["unused"] and not info["allocations"], info
            assert any("nothing on the GPU" in str(w.message) for w in caught)
            continue
        assert info["allocations"] == hyb.plan.allocations and info["allocations"]
        if info["allocated_bytes"] is not None:
            assert info["allocated_bytes"] == hyb.plan.gpu_bytes
        want, want_toks = greedy(cpu, prompt, STEPS)
        got, got_toks = greedy(hyb, prompt, STEPS)
        tol = TOL_DENSE_REQUANTIZED if mode == "dense" else TOL
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, tol, f"{arch} {device} {placement} {mode} step {i}")
        assert got_toks == want_toks, (arch, mode)
        info = hyb.gpu_info()
        assert info["steps"] >= STEPS
        moved = sum(t[2] + t[3] for t in info["transfers"])
        assert moved > 0, info["transfers"]
        if device == "gpu-emu":
            launches = info["kernel_launches"]
            wanted = set()
            if any(hyb.plan.attention):
                wanted |= {"attention_decode", "kv_store"}
                wanted.add("layer_norm" if model.config.layer_norm else "rms_norm")
                if model.config.qk_norm and not model.config.qk_norm_full:
                    # The per-head q/k norm runs inside RoPE's launch.
                    wanted.add("rms_norm (in rope)")
            if any(len(h) for h in hyb.plan.hot_neurons):
                wanted |= {"gate_up_q8_0", "axpy_rows_q8_0"}
                # The FFN's norm quantizes its output for the Q8_0 rows in its own launch.
                norm = "layer_norm" if model.config.layer_norm else "rms_norm"
                wanted.add(f"quantize_x (in {norm})")
            for entry in wanted:
                assert launches.get(entry, 0) >= STEPS, (entry, launches)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_dense_mode_holds_tol_where_the_transposition_is_exact(synth_gguf, tmp_path, arch):
    """TOL_DENSE_REQUANTIZED is the re-quantized down rows alone: on F16 files, whose down
    projection transposes exactly, dense mode on the GPU side holds TOL like every other mode
    (the "half" placement: hot neurons on the GPU, the rest on the CPU)."""
    args = {**SHAPE, **FAMILIES[arch]}
    model = load_model(synth_gguf(dtype="F16", seed=5, arch=arch, **args))
    path = plan_at(model, tmp_path / "half.safetensors", "half", None)
    cpu, hyb, _ = engine_pair(model, "dense", path, DEVICES[0], None)
    assert hyb.gpu_info()["allocations"]
    want, want_toks = greedy(cpu, [5, 17, 123, 42, 7, 250], STEPS)
    got, got_toks = greedy(hyb, [5, 17, 123, 42, 7, 250], STEPS)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, TOL, f"{arch} F16 dense step {i}")
    assert got_toks == want_toks
    assert sum(t[2] + t[3] for t in hyb.gpu_info()["transfers"]) > 0
