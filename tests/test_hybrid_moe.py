"""Mixture-of-experts plans and the hybrid executor on expert layers.

The planner places a mixture of experts over each layer's flattened neuron space (expert e's row
j is neuron ``e * expert_ffn + j``, then the shared expert's neurons): hot experts and hot neurons
inside warm experts under the budget ("neurons"), or llama.cpp's ``--n-cpu-moe`` baseline.
Every family (synthetic files as llama.cpp's converter writes them) then decodes on gpu-sim and
gpu-emu (the real CUDA kernels on the CPU) at several placements and matches the CPU engine in
the same mode: logits within 1e-3 on F16 files (the transposition is exact), within the
re-quantized down rows' noise on Q8_0, greedy tokens identical. Each run proves the GPU side
ran: allocations equal to the plan's (and to the planner's accounting, byte for byte), decode
steps and transfers counted, and on gpu-emu the routing kernels launched.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_hybrid import DEVICES, WITH_EMU, assert_close, greedy
from test_hybrid_families import TOL_DENSE_REQUANTIZED
from test_moe import MOE_ARCHS

from powerinfer_rs import Engine
from powerinfer_rs.errors import PlanError, ShapeError, UnsupportedError, VramBudgetError
from powerinfer_rs.formats.plan import load_plan, save_plan
from powerinfer_rs.formats.profile import Profile, synthetic_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import gpu_allocation, load_hardware, make_plan, total_bytes
from powerinfer_rs.planning.cost_model import bucket_read
from powerinfer_rs.planning.model_shape import ModelShape
from powerinfer_rs.planning.predictor_size import fixed_predictor_sizes
from powerinfer_rs.planning.problem import build_problem

SHAPE = dict(dim=64, ffn=128, layers=4, heads=4, kv_heads=2, vocab=300)
TOL = 1e-3
STEPS = 6
PROMPT = [5, 17, 123, 42]
#: Placements: "half" (the neuron policy at half the model's bytes: partial hot sets, some
#: experts whole, some split), "n-cpu-moe" (the baseline at half), "all" (everything).
PLACEMENTS = ("half", "n-cpu-moe", "all")

_models: dict[tuple, object] = {}


@pytest.fixture(scope="module")
def moe_model(synth_gguf):
    def get(arch: str, dtype: str):
        key = (arch, dtype)
        if key not in _models:
            args = {**SHAPE, **MOE_ARCHS[arch]}
            args["activation"] = "relu" if arch == "smallthinker" else "silu"
            _models[key] = load_model(synth_gguf(dtype=dtype, seed=5, arch=arch, **args))
        return _models[key]

    return get


def mode_of(model) -> str:
    """The mode the plan is made for (the default: exact-relu for ReLU experts, else dense)."""
    return "exact-relu" if model.config.activation == "relu" else "dense"


def modes_of(model) -> list[str]:
    """The modes each engine pair runs: threshold mode too for SiLU experts."""
    return ["exact-relu"] if model.config.activation == "relu" else ["dense", "threshold"]


_thresholds: dict[str, list[float]] = {}


def thresholds_of(model) -> list[float]:
    """Thresholds dropping about 40% of the routed experts' neurons (the calibrate stage's)."""
    from powerinfer_rs.stages.calibrate import calibrate_thresholds

    if model.fingerprint not in _thresholds:
        ids = [int(t) for t in np.random.default_rng(2).integers(3, 300, 128)]
        eng = Engine(model, threads=2)
        t, _ = calibrate_thresholds(eng, ids, 0.4, window=64, progress=False)
        _thresholds[model.fingerprint] = t
    return _thresholds[model.fingerprint]


def measured_profile(model, tokens: int = 64) -> Profile:
    """The engine's own profile of ``model`` over random tokens (routing and neurons)."""
    eng = Engine(model, threads=2)
    eng.start_profiling()
    eng.prefill([int(t) for t in np.random.default_rng(1).integers(3, 300, tokens)])
    counts, n = eng.profile_counts()
    routed = eng.profile_expert_counts()
    eng.stop_profiling()
    return Profile(
        [np.asarray(c, np.int64) for c in counts],
        int(n),
        {"model_fingerprint": model.fingerprint},
        expert_counts=[np.asarray(r, np.int64) for r in routed],
    )


def moe_plan(model, placement: str, profile: Profile | None = None):
    total = sum(t.nbytes for t in model.tensors.values())
    share = 4.0 if placement == "all" else 0.5
    return make_plan(
        model,
        profile or measured_profile(model),
        load_hardware("rtx4090"),
        int(share * total),
        context=64,
        bucket=32,
        sparsity=mode_of(model),
        moe_policy="n-cpu-moe" if placement == "n-cpu-moe" else "neurons",
        objective="mass",  # the time objective keeps layers this tiny on the CPU
        min_neurons=0,
        solver="greedy",
    )


CASES = [
    (arch, dtype, device, placement)
    for arch in MOE_ARCHS
    for dtype in ("F16", "Q8_0")
    for device in DEVICES + (["gpu-emu"] if WITH_EMU else [])
    for placement in PLACEMENTS
    # The emulator runs every CUDA thread on one core: one file format, the partial placements.
    if device != "gpu-emu" or (dtype == "Q8_0" and placement != "all")
]


@pytest.mark.parametrize(("arch", "dtype", "device", "placement"), CASES)
def test_expert_layers_on_the_gpu_side_match_the_cpu_engine(
    moe_model, tmp_path, arch, dtype, device, placement
):
    model = moe_model(arch, dtype)
    c = model.config
    prof = measured_profile(model)
    plan = moe_plan(model, placement, prof)
    hot = [len(ids) for ids in plan.gpu_neurons]
    ef = c.expert_ffn_dim or c.ffn_dim
    routed = c.n_expert * ef
    if placement == "all":  # every expert the profile routes to (one never routed reads nothing)
        assert all(plan.placement.attention) and plan.placement.output
        for ids, ec in zip(plan.gpu_neurons, prof.expert_counts):
            want = [e for e in range(c.n_expert) if ec[e]]
            assert sorted({int(i) // ef for i in ids if i < routed}) == want
    elif placement == "half":
        assert any(c.shared_ffn_dim < h < c.n_neurons for h in hot), hot  # partial hot sets
    else:
        assert all(plan.placement.attention) and plan.predicted["moe_policy"] == "n-cpu-moe"
    for ids in plan.gpu_neurons:  # the shared expert is whole on the GPU with any hot neuron
        assert ids.size == 0 or set(range(routed, c.n_neurons)) <= set(ids.tolist())
    path = save_plan(plan, tmp_path / "plan.safetensors")
    for mode in modes_of(model):
        if device == "gpu-emu" and mode == "dense" and placement != "half":
            continue  # the emulator's time on the modes whose kernels differ
        run_pair(
            model, path, plan, device, mode, dtype, hot, f"{arch} {dtype} {device} {placement}"
        )


def run_pair(model, path, plan, device, mode, dtype, hot, what, tol=None) -> None:
    """The CPU engine and the hybrid one in ``mode``: the same logits (within ``tol``, else
    this file's for the mode and format) and greedy tokens, the GPU side's allocations, steps,
    transfers and (on gpu-emu) routing kernels."""
    kw: dict = {"threads": 2, "sparsity": mode}
    if mode == "threshold":
        # Calibrated (40% of the routed neurons dropped) on F16 files. On quantized ones the
        # GPU side and the CPU compute |act(gate)·up| in other arithmetic (f32 x against the
        # CPU's int16 x), and a neuron within rounding of its threshold flips, moving the
        # logits by about t·|down row| (8e-3 at t = 0.1 here): a small threshold there, as in
        # test_hybrid_families.
        kw["thresholds"] = (
            thresholds_of(model) if dtype == "F16" else [0.01] * model.config.n_layers
        )
    cpu = Engine(model, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hyb = Engine(model, plan=str(path), device=device, **kw)
    info = hyb.gpu_info()
    assert info["allocations"] == hyb.plan.allocations == gpu_allocation(plan, model)
    if info["allocated_bytes"] is not None:
        assert info["allocated_bytes"] == plan.gpu_bytes
    names = {n for n, _ in info["allocations"]}
    assert "scratch.expert_w" in names and any(n.endswith("ffn_hot") for n in names)
    want, want_toks = greedy(cpu, PROMPT, STEPS)
    got, got_toks = greedy(hyb, PROMPT, STEPS)
    # Dense experts on a quantized file: the GPU side and the CPU's cold part read re-quantized
    # transposed down rows where the CPU engine reads the file's (test_hybrid_families).
    if tol is None:
        tol = TOL_DENSE_REQUANTIZED if (mode == "dense" and dtype != "F16") else TOL
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, tol, f"{what} {mode} step {i}")
    assert got_toks == want_toks
    info = hyb.gpu_info()
    assert info["steps"] >= STEPS
    assert sum(t[2] + t[3] for t in info["transfers"]) > 0
    # Half the neurons on the GPU (experts split between the devices): the CPU read the routed
    # experts' cold rows, and counted them.
    if what.endswith("half"):
        assert sum(info["phases"]["cold_bytes"]) > 0, what
    if device == "gpu-emu":
        launches = info["kernel_launches"]
        layers = sum(1 for h in hot if h)
        for entry in ("expert_flags", "expert_scale", "attention_decode"):
            assert launches.get(entry, 0) >= STEPS * min(layers, 1), (entry, launches)
        assert launches.get("expert_flags", 0) == launches.get("expert_scale", 0)
        # The mask runs on the routed experts' hot rows (the shared expert's stay dense).
        if mode == "threshold" and any(h > model.config.shared_ffn_dim for h in hot):
            assert launches.get("threshold_mask", 0) >= STEPS, launches


def test_the_hottest_experts_go_first(moe_model):
    """With routing skewed to a few experts, a small budget holds the most routed experts'
    neurons; the shared expert comes first and whole; the plan's accounting covers the routing
    scratch and the flattened space."""
    model = moe_model("qwen2moe", "Q8_0")
    c = model.config
    ef = c.expert_ffn_dim
    routed = c.n_expert * ef
    counts, experts = [], []
    for layer in range(c.n_layers):
        e = np.array([900, 700, 40, 30, 20, 10, 200, 100], np.int64)[np.roll(np.arange(8), layer)]
        experts.append(e)
        counts.append(np.repeat(e, ef) // 2)
    prof = Profile(counts, 1000, {}, expert_counts=experts)
    total = sum(t.nbytes for t in model.tensors.values())
    plan = make_plan(
        model,
        prof,
        load_hardware("rtx4090"),
        int(0.25 * total),
        context=64,
        bucket=32,
        sparsity="dense",
        objective="mass",
        min_neurons=0,
        solver="greedy",
    )
    assert plan.ffn_dim == c.n_neurons == routed + c.shared_ffn_dim
    for layer, ids in enumerate(plan.gpu_neurons):
        if ids.size == 0:
            continue
        assert set(range(routed, c.n_neurons)) <= set(ids.tolist())
        got = sorted({int(i) // ef for i in ids if i < routed})
        order = np.argsort(-experts[layer], kind="stable")
        assert got == sorted(order[: len(got)].tolist()), (layer, got)
    assert any(ids.size for ids in plan.gpu_neurons)
    names = [n for n, _ in gpu_allocation(plan, model)]
    assert "scratch.expert_w" in names


def test_a_neuron_costs_its_experts_routing(moe_model):
    """Dense experts: a bucket reads its neurons' rows in the tokens their experts are routed
    to (the profile's expert counts), not in every token; exact-relu reads the gate rows of
    routed neurons and the rest of the rows of firing ones."""
    model = moe_model("qwen3moe", "Q8_0")
    c = model.config
    shape = ModelShape.from_model(model)
    prof = synthetic_profile(
        c.n_layers,
        c.n_expert * c.expert_ffn_dim,
        1000,
        seed=3,
        n_expert=c.n_expert,
        n_expert_used=c.n_expert_used,
        mean_active=0.3,
    )
    preds = fixed_predictor_sizes(c, 0)
    hw = load_hardware("rtx4090")
    for mode in ("dense", "exact-relu"):
        p = build_problem(shape, prof, hw, 0, bucket=32, predictors=preds, sparsity=mode)
        lt = p.layers[0]
        route = np.repeat(prof.expert_counts[0], c.expert_ffn_dim)[lt.order] / 1000.0
        act = prof.counts[0][lt.order] / 1000.0
        r, f = lt.neuron_read, lt.neuron_fixed
        want = np.add.reduceat(act * (r - f) + route * f, np.arange(0, route.size, 32))
        assert np.allclose(bucket_read(lt), want)
        # Ordered by bytes read per token: hot experts first.
        key = act * (r - f) + route * f
        assert (np.diff(key) <= 1e-12).all()
        assert lt.router_read == shape.tensor_bytes("blk.0.ffn_gate_inp") > 0


def test_n_cpu_moe_is_llama_cpps_baseline(moe_model, tmp_path):
    model = moe_model("qwen2moe", "F16")
    c = model.config
    prof = measured_profile(model)
    total = sum(t.nbytes for t in model.tensors.values())
    hw = load_hardware("rtx4090")

    def plan(share: float, **kw):
        kw.setdefault("moe_policy", "n-cpu-moe")
        return make_plan(model, prof, hw, int(share * total), context=64, bucket=32, **kw)

    base = plan(0.35)
    pl = base.placement
    assert all(pl.attention) and pl.output and not any(pl.predictor)
    assert [len(i) for i in base.gpu_neurons] == [c.shared_ffn_dim] * c.n_layers
    assert "--n-cpu-moe 4" in base.solver["status"]
    more = plan(0.75)  # experts of the last layers join while the budget holds them
    on = [len(i) == c.n_neurons for i in more.gpu_neurons]
    assert any(on) and on == sorted(on) and more.gpu_bytes <= int(0.75 * total)
    assert f"--n-cpu-moe {on.count(False)}" in more.solver["status"]
    with pytest.raises(VramBudgetError, match="n-cpu-moe baseline"):
        plan(0.01)
    # The same budget, the neuron policy: rated at least as fast by the cost model.
    neurons = plan(0.75, moe_policy="neurons")
    assert neurons.predicted["tokens_per_s"] >= more.predicted["tokens_per_s"] * (1 - 1e-9)
    # Saved and read back, checked against the model.
    out = save_plan(more, tmp_path / "p.safetensors")
    assert load_plan(out, model).gpu_bytes == more.gpu_bytes


def test_what_moe_plans_refuse(moe_model, synth_gguf, tmp_path):
    model = moe_model("qwen3moe", "Q8_0")
    c = model.config
    hw = load_hardware("rtx4090")
    prof = measured_profile(model)
    with pytest.raises(PlanError, match="CPU only.*dense, exact-relu or threshold"):
        make_plan(model, prof, hw, 10**7, sparsity="predictor")
    no_routing = Profile(prof.counts, prof.tokens, {})
    with pytest.raises(ShapeError, match="expert_count"):
        make_plan(model, no_routing, hw, 10**7, sparsity="dense")
    dense = load_model(synth_gguf(dtype="Q8_0", **SHAPE))
    dprof = synthetic_profile(dense.config.n_layers, dense.config.ffn_dim, 100)
    with pytest.raises(PlanError, match="mixture-of-experts"):
        make_plan(dense, dprof, hw, 10**7, moe_policy="n-cpu-moe")
    with pytest.raises(PlanError, match="moe_policy"):
        make_plan(model, prof, hw, 10**7, sparsity="dense", moe_policy="everything")
    # A shared expert in another format than the routed experts cannot share their slabs.
    q2 = load_model(
        synth_gguf(
            dtype="Q8_0",
            seed=5,
            arch="qwen2moe",
            activation="silu",
            **{**SHAPE, **MOE_ARCHS["qwen2moe"]},
        )
    )
    shape = ModelShape(
        q2.config, {**ModelShape.from_model(q2).dtypes, "blk.1.ffn_down_shexp": "F16"}
    )
    assert shape.gpu_refusal("ffn", 0) is None
    assert "shared expert" in (shape.gpu_refusal("ffn", 1) or "")
    # A hand-made plan splitting the shared expert: refused by the engine.
    plan = moe_plan(q2, "all")
    routed = q2.config.n_neurons - q2.config.shared_ffn_dim
    plan.gpu_neurons[0] = plan.gpu_neurons[0][plan.gpu_neurons[0] < routed + 5]
    plan.placement.ffn_buckets[0] = -(-plan.gpu_neurons[0].size // plan.bucket)
    plan.bytes["gpu"]["total"] = total_bytes(gpu_allocation(plan, q2))
    path = save_plan(plan, tmp_path / "split.safetensors")
    with pytest.raises(PlanError, match="shared expert"):
        Engine(q2, sparsity="dense", plan=str(path), device="gpu-sim")
    assert c.n_neurons == c.n_expert * c.expert_ffn_dim


def test_plan_cli_places_experts(moe_model, synth_gguf, tmp_path, capsys):
    """``python -m powerinfer_rs.plan`` on a mixture of experts: both policies, the mode
    chosen from the experts' activation."""
    from powerinfer_rs.formats.profile import write_profile
    from powerinfer_rs.stages import plan as stage

    path = synth_gguf(
        dtype="Q8_0",
        seed=5,
        arch="smallthinker",
        activation="relu",
        **{**SHAPE, **MOE_ARCHS["smallthinker"]},
    )
    model = load_model(path)
    prof = measured_profile(model)
    pdir = write_profile(
        tmp_path / "prof",
        prof.counts,
        prof.tokens,
        model_fingerprint=model.fingerprint,
        expert_counts=prof.expert_counts,
    )
    for policy in ("neurons", "n-cpu-moe"):
        out = tmp_path / f"{policy}.safetensors"
        argv = [
            "--model",
            str(path),
            "--profile",
            str(pdir.parent),
            "--hardware",
            "rtx4090",
            "--vram-budget",
            "1MiB",
            "--out",
            str(out),
            "--moe-policy",
            policy,
            "--objective",
            "mass",
            "--context",
            "64",
            "--quiet",
        ]
        assert stage.main(argv) == 0
        plan = load_plan(out, model)
        assert plan.predicted["sparsity"] == "exact-relu"
        assert plan.predicted["moe_policy"] == policy
        assert plan.gpu_bytes > 0
    assert "--moe-policy" in stage.build_parser().format_help()


def test_predictors_inside_experts_stay_on_the_cpu(moe_model, tmp_path):
    """Predictor mode inside experts runs on the CPU engine only (tests/test_moe_predictors.py):
    the hybrid executor refuses it with a typed error rather than running something else."""
    from test_moe_predictors import expert_predictors

    model = moe_model("smallthinker", "F16")
    path = save_plan(moe_plan(model, "half"), tmp_path / "plan.safetensors")
    preds = expert_predictors(model)
    with pytest.raises(UnsupportedError, match="predictors inside experts run on the CPU only"):
        Engine(model, plan=str(path), device="gpu-sim", sparsity="predictor", predictors=preds)
    hyb = Engine(model, plan=str(path), device="gpu-sim", sparsity="exact-relu")
    with pytest.raises(UnsupportedError, match="predictors inside experts"):
        hyb.set_sparsity("predictor", predictors=preds)
    # A trainer's set in which no expert's predictor paid (no tensors) too.
    from powerinfer_rs.predictors.model import PredictorSet

    none = PredictorSet(layers={}, metadata={"dropped": {}})
    with pytest.raises(UnsupportedError, match="predictors inside experts"):
        hyb.set_sparsity("predictor", predictors=none)
    assert hyb.sparsity == "exact-relu"
    assert greedy(hyb, PROMPT, 2)[1] == greedy(Engine(model, sparsity="exact-relu"), PROMPT, 2)[1]
