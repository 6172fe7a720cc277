"""The plan's RAM tier (models bigger than RAM): of the CPU's neurons, the hottest resident in
RAM under a budget and the rest read from storage through the neuron store. The bytes add up
(base + process + the store's cache within the budget, slots of the engine's own cluster size),
the resident clusters are the most likely to fire, the plan file keeps and checks it all, the
engine runs the store from a plan with the plan's cache and resident set and decodes as the
all-resident engine, and the storage probe measures a file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_hybrid import assert_same_decode
from test_neuron_store import PROMPT, SHAPE, STEPS, TOL, engines

from powerinfer_rs import Engine
from powerinfer_rs.errors import PlanError, ShapeError, VramBudgetError
from powerinfer_rs.formats.plan import load_plan, save_plan
from powerinfer_rs.formats.profile import Profile, write_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import ModelShape, make_plan
from powerinfer_rs.planning.hardware_profile import load_hardware
from powerinfer_rs.planning.ram_tier import cluster_probabilities
from powerinfer_rs.planning.storage_probe import MIN_PROBE_FILE, probe_storage
from powerinfer_rs.stages.plan import main as plan_main

GiB = 1 << 30


@pytest.fixture(scope="module")
def model(synth_gguf):
    return load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))


@pytest.fixture(scope="module")
def profile(model):
    """A profile the engine measured on this model (predictor mode plans from it)."""
    eng, _ = engines(model, "exact-relu")
    eng.start_profiling()
    eng.prefill([int(t) for t in np.random.default_rng(0).integers(3, 300, 64)])
    counts, tokens = eng.profile_counts()
    eng.stop_profiling()
    return Profile(
        [np.asarray(c, dtype=np.int64) for c in counts],
        int(tokens),
        {"model_fingerprint": model.fingerprint},
    )


def ram_plan(model, profile, slots: int, cluster: int = 2, **kw):
    """A CPU-only plan whose RAM budget leaves ``slots`` store slots."""
    shape = ModelShape.from_model(model)
    hw = load_hardware("cpu-only")
    big = make_plan(shape, profile, hw, 0, ram_budget=GiB, store_cluster=cluster, ram_overhead=0)
    r = big.ram
    budget = r["base_bytes"] + slots * r["slot_bytes"]
    return make_plan(
        shape, profile, hw, 0, ram_budget=budget, store_cluster=cluster, ram_overhead=0, **kw
    )


def test_the_ram_tier_adds_up_and_keeps_the_hottest_clusters(model, profile, tmp_path):
    plan = ram_plan(model, profile, slots=200)
    r = plan.ram
    assert r["total_bytes"] <= r["budget_bytes"]
    assert r["total_bytes"] == r["base_bytes"] + r["overhead_bytes"] + r["cache_bytes"]
    assert r["cache_bytes"] == (r["resident_slots"] + r["working_slots"]) * r["slot_bytes"]
    assert r["resident_slots"] + r["working_slots"] == 200 and r["resident_slots"] > 0
    # The slot is the engine's own: its store file's largest cluster.
    eng, _ = engines(model, "predictor")
    path = eng.write_neuron_store(tmp_path / "m.neurons", cluster=2)
    eng.use_neuron_store(path)
    assert max(eng.neuron_store_stats()["cluster_bytes"]) == r["slot_bytes"]
    # Every resident cluster is at least as likely to fire as every cluster left on storage.
    probs = [cluster_probabilities(profile.frequencies(i), 2, np.zeros(0, int)) for i in range(3)]
    res = [np.unique(ids // 2) for ids in plan.ram_neurons]
    low = min(float(p[k].min()) for p, k in zip(probs, res) if k.size)
    high = max(float(np.delete(p, k).max()) for p, k in zip(probs, res))
    assert low >= high
    assert sum(k.size for k in res) == r["resident_slots"] == sum(r["resident_clusters"])
    # The expected reads are the non-resident clusters' chances.
    want = sum(float(np.delete(p, k).sum()) for p, k in zip(probs, res))
    assert r["storage"]["reads_per_token"] == pytest.approx(want)
    assert r["storage"]["time_per_token_s"] is None  # cpu-only measured no storage
    # The file keeps it; a tampered one is refused.
    out = save_plan(plan, tmp_path / "PLAN.safetensors")
    back = load_plan(out, model)
    assert back.ram == json.loads(json.dumps(plan.ram))
    for a, b in zip(back.ram_neurons, plan.ram_neurons):
        np.testing.assert_array_equal(a, b)
    bad = load_plan(out)
    bad.ram = {**bad.ram, "cache_bytes": bad.ram["cache_bytes"] + 4096}
    with pytest.raises(PlanError, match="do not add up"):
        bad.validate()
    bad = load_plan(out)
    bad.ram = {**bad.ram, "budget_bytes": bad.ram["total_bytes"] - 1}
    with pytest.raises(PlanError, match="over the RAM budget"):
        bad.validate()
    for broken in ({"storage": 5}, {"slot_bytes": "x"}, {"resident_clusters": None}):
        bad = load_plan(out)
        bad.ram = {**bad.ram, **broken}
        with pytest.raises(PlanError, match="lacks or garbles"):
            bad.validate()


def test_a_priced_storage_and_the_budget_errors(model, profile):
    shape = ModelShape.from_model(model)
    hw = load_hardware("cpu-only")
    hw = hw.__class__(**{**hw.to_dict(), "storage_read_bw": 2.0, "storage_iops": 1000.0})
    plan = ram_plan(model, profile, slots=40)
    budget = plan.ram["budget_bytes"]
    big = make_plan(shape, profile, hw, 0, ram_budget=budget, ram_overhead=0, store_cluster=2)
    st = big.ram["storage"]
    per = max(1 / 1000.0, big.ram["slot_bytes"] / 2e9)
    assert st["time_per_token_s"] == pytest.approx(st["reads_per_token"] * per)
    with pytest.raises(VramBudgetError, match="holds no neuron store"):
        make_plan(shape, profile, hw, 0, ram_budget=1 << 20)
    with pytest.raises(PlanError, match="modes a neuron store runs"):
        make_plan(shape, profile, hw, 0, ram_budget=GiB, sparsity="dense")


def test_the_store_runs_a_plans_ram_tier(model, profile, tmp_path):
    """use_neuron_store(plan=...) sizes the cache and loads the resident clusters from the plan;
    decoding equals the all-resident engine; plans it cannot run are refused."""
    plan = ram_plan(model, profile, slots=200)
    resident, stored = engines(model, "predictor")
    path = stored.write_neuron_store(tmp_path / "m.neurons", cluster=2)
    info = stored.use_neuron_store(path, plan=plan)
    assert info["cache_slots"] == 200
    assert info["resident_slots"] == plan.ram["resident_slots"]
    assert_same_decode(resident, stored, PROMPT, STEPS, TOL, "planned store")
    assert stored.neuron_store_stats()["hits"] > 0
    # From the plan's file too.
    out = save_plan(plan, tmp_path / "PLAN.safetensors")
    assert stored.use_neuron_store(path, plan=out)["resident_slots"] == info["resident_slots"]
    # Refused: another cluster size, no RAM tier, a cache given with a plan.
    other = stored.write_neuron_store(tmp_path / "c1.neurons", cluster=1)
    with pytest.raises(PlanError, match="clusters of 2"):
        stored.use_neuron_store(other, plan=plan)
    assert stored.neuron_store_stats() == {}
    shape = ModelShape.from_model(model)
    plain = make_plan(shape, profile, load_hardware("cpu-only"), 0)
    with pytest.raises(PlanError, match="no RAM tier"):
        stored.use_neuron_store(path, plan=plain)
    with pytest.raises(ShapeError, match="a plan sets"):
        stored.use_neuron_store(path, plan=plan, cache="1MiB")


def test_the_cli_plans_a_ram_tier_and_probes_storage(model, profile, tmp_path, capsys):
    prof = tmp_path / "prof"
    write_profile(prof, profile.counts, profile.tokens, model_fingerprint=model.fingerprint)
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(MIN_PROBE_FILE)
    out = tmp_path / "PLAN.safetensors"
    argv = ["--model", str(model.path), "--profile", str(prof), "--vram-budget", "0"]
    argv += ["--hardware", "cpu-only", "--ram-budget", "512MiB", "--store-cluster", "2"]
    argv += ["--probe-storage", str(big), "--out", str(out)]
    assert plan_main(argv) == 0
    text = capsys.readouterr().out
    assert "storage measured on" in text and "RAM bytes" in text and "ms/token" in text
    plan = load_plan(out, model)
    assert plan.ram["cluster"] == 2 and plan.ram["storage"]["iops"] > 0
    assert plan.hardware["storage_iops"] == plan.ram["storage"]["iops"]
    # Errors are one line, exit 2.
    small = tmp_path / "small.bin"
    small.write_bytes(b"\0" * 8192)
    assert plan_main(argv[:-4] + ["--probe-storage", str(small), "--out", str(out)]) == 2
    assert "too small to probe" in capsys.readouterr().err
    assert plan_main(argv[:8] + ["--probe-storage", str(big)]) == 2
    assert "give --ram-budget" in capsys.readouterr().err
    p = probe_storage(big, read_bytes=8192, depth=2, seconds=0.2)
    assert p.read_bw > 0 and p.iops > 0 and p.read_bytes == 8192


@pytest.mark.parametrize(
    "arch,mode,slots", [("qwen3moe", "dense", 300), ("smallthinker", "exact-relu", 700)]
)
def test_a_mixture_of_experts_ram_tier(synth_gguf, tmp_path, arch, mode, slots):
    """A mixture of experts' RAM tier is over its routed neurons (the store's; the router and
    the shared expert stay in the base part): in dense mode a neuron is read whenever its
    expert is routed, so whole hot experts are resident first; the engine runs the plan's
    store and decodes as the resident engine."""
    from test_moe import MOE_ARCHS

    act = "relu" if arch == "smallthinker" else "silu"
    kw = {**MOE_ARCHS[arch], "active": 0.2} if act == "relu" else MOE_ARCHS[arch]
    model = load_model(synth_gguf(dtype="F32", activation=act, arch=arch, **kw))
    c, shape = model.config, ModelShape.from_model(model)
    routed, ef = shape.routed_neurons, shape.expert_ffn
    rng = np.random.default_rng(0)
    tokens = 100
    experts = [rng.integers(1, tokens, c.n_expert) for _ in range(c.n_layers)]
    counts = [
        np.minimum(rng.integers(0, tokens, c.n_neurons), np.resize(np.repeat(e, ef), c.n_neurons))
        for e in experts
    ]
    prof = Profile(counts, tokens, {"model_fingerprint": model.fingerprint}, experts)
    hw = load_hardware("cpu-only")
    args = dict(sparsity=mode, store_cluster=4, ram_overhead=0)
    big = make_plan(shape, prof, hw, 0, ram_budget=GiB, **args)
    budget = big.ram["base_bytes"] + slots * big.ram["slot_bytes"]
    plan = make_plan(shape, prof, hw, 0, ram_budget=budget, **args)
    assert plan.ram["resident_slots"] > 0
    assert all(ids.size == 0 or ids[-1] < routed for ids in plan.ram_neurons)
    if mode == "dense":  # resident clusters belong to experts routed at least as often
        for layer, ids in enumerate(plan.ram_neurons):
            on = np.unique(ids // ef)
            off = np.setdiff1d(np.arange(c.n_expert), on)
            if on.size and off.size:
                assert experts[layer][on].min() >= experts[layer][off].max()
    resident = Engine(model, threads=2, sparsity=mode)
    stored = Engine(model, threads=2)
    path = Engine(model).write_neuron_store(tmp_path / "moe.neurons", cluster=4)
    info = stored.use_neuron_store(path, plan=plan)
    stored.set_sparsity(mode)
    assert info["cache_slots"] == slots
    assert info["resident_slots"] == plan.ram["resident_slots"]
    assert_same_decode(resident, stored, PROMPT, STEPS, TOL, f"{arch} planned store")


def test_cluster_chances_with_neurons_read_together():
    """Dense experts' neurons are read together: a cluster inside one expert has its chance,
    one spanning two experts the chance either is routed; GPU neurons never count."""
    q = np.array([0.5] * 3 + [0.2] * 3)
    got = cluster_probabilities(q, 4, np.zeros(0, int), group=3)
    np.testing.assert_allclose(got, [1 - 0.5 * 0.8, 0.2])
    # Independent neurons: every neuron counts.
    np.testing.assert_allclose(
        cluster_probabilities(q, 4, np.zeros(0, int)), [1 - 0.5**3 * 0.8, 1 - 0.8**2]
    )
    # Expert 0's neurons on the GPU: the first cluster is read when expert 1 is.
    np.testing.assert_allclose(cluster_probabilities(q, 4, np.arange(3), group=3), [0.2, 0.2])
