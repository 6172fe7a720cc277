"""The engine's own GPU allocation list (Rust, ``powerinfer_cuda::alloc_plan``) against the
planner's accounting (Python, ``planning.accounting.gpu_allocation``): two independent
derivations that must agree name for name and byte for byte, and sum to the plan's GPU bytes.

Synthetic models (GGUF Q4_0 / Q8_0 / F16, the Q4_K_M mix with its 32-weight fallbacks and, at a
width of whole super-blocks, with its K-quants; HF f32 / f16 / bf16) and the real SmolLM2 when
present.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerinfer_rs.errors import PlanError
from powerinfer_rs.formats.plan import save_plan
from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import gpu_allocation, load_hardware, make_plan, total_bytes
from powerinfer_rs.planning.predictor_size import fixed_predictor_sizes, read_predictor_sizes
from powerinfer_rs.runtime.engine import Engine

from conftest import write_zero_predictors

#: dim 128 so that a 2-byte norm (128 x 2 = 256 B) and the engine's f32 norm (512 B) differ
#: after alignment; ffn 320 is 5 buckets of 64 and a partial one of 48.
SHAPE = dict(dim=128, ffn=320, layers=3, heads=4, kv_heads=2, vocab=300)
#: gguf-Q4_K_M at this shape: Q5_0 / Q8_0 fallbacks (rows of 128 and 320 are no whole number of
#: 256-weight super-blocks).
MODELS = ["gguf-Q4_0", "gguf-Q8_0", "gguf-F16", "gguf-Q4_K_M", "hf-f32", "hf-f16", "hf-bf16"]
#: Rows of 256 and 512: a Q4_K_M file keeps Q4_K and Q6_K (Q6_K ffn_down, so down_t, in the last
#: layer and the output head).
K_SHAPE = dict(dim=256, ffn=512, layers=3, heads=4, kv_heads=2, vocab=300)
SHARES = [0.0, 0.3, 0.7, 1.0]
CONTEXT = 64


@pytest.fixture(scope="module")
def engines(synth_gguf, synth_hf):
    """``kind -> Engine`` (built lazily, CPU device, no plan)."""
    made: dict[str, Engine] = {}

    def get(kind: str) -> Engine:
        if kind not in made:
            fmt, dtype = kind.split("-")
            path = (synth_gguf if fmt == "gguf" else synth_hf)(dtype=dtype, **SHAPE)
            made[kind] = Engine(load_model(path))
        return made[kind]

    return get


def plan_for(engine: Engine, budget: int, **kw):
    c = engine.config
    profile = synthetic_profile(
        c.n_layers, c.ffn_dim, 1000, seed=0, model_fingerprint=engine.loaded.fingerprint
    )
    kw.setdefault("solver", "greedy")
    kw.setdefault("context", CONTEXT)
    kw.setdefault("objective", "mass")  # the time objective keeps layers this tiny on the CPU
    return make_plan(engine.loaded, profile, load_hardware("rtx4090"), budget, min_neurons=0, **kw)


def full_bytes(engine: Engine, **kw) -> int:
    """GPU bytes of the plan that puts everything on the GPU."""
    return plan_for(engine, 10 * 2**30, **kw).gpu_bytes


def check_report(engine: Engine, plan, path) -> list[tuple[str, int]]:
    """The Rust report of ``plan`` (saved at ``path``) equals the Python accounting exactly
    and sums to the GPU bytes the plan file records."""
    report = [tuple(a) for a in engine.gpu_allocation_report(path)]
    assert report == gpu_allocation(plan, engine.loaded)
    assert all(b % 256 == 0 and b > 0 for _, b in report)
    assert len({n for n, _ in report}) == len(report)
    assert total_bytes(report) == plan.gpu_bytes == plan.bytes["gpu"]["total"]
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert int(meta["gpu_bytes"]) == total_bytes(report)
    assert json.loads(meta["plan"])["bytes"]["gpu"]["total"] == total_bytes(report)
    return report


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("kind", MODELS)
def test_report_equals_the_accounting(engines, kind, share, tmp_path):
    engine = engines(kind)
    plan = plan_for(engine, int(full_bytes(engine) * share))
    path = save_plan(plan, tmp_path / "plan.safetensors")
    report = check_report(engine, plan, path)
    names = {n for n, _ in report}
    hot = sum(int(ids.size) for ids in plan.gpu_neurons)
    if share == 0.0:
        assert report == [] and plan.is_cpu_only()
    elif share == 1.0:  # everything: every layer's attention and neurons, and the output head
        c = engine.config
        assert hot == c.n_layers * c.ffn_dim and plan.placement.output
        for i in range(c.n_layers):
            assert {f"blk.{i}.cache_k", f"blk.{i}.ffn_hot", f"blk.{i}.pred_fc2"} <= names
        assert {"output", "output.logits", "scratch.att"} <= names
    else:
        assert 0 < total_bytes(report) <= int(full_bytes(engine) * share)


#: Every family's extra GPU vectors (its layer program's steps), named in the report.
FAMILY_VECTORS = {
    "llama": set(),
    "mistral": set(),
    "qwen2": {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"},
    "qwen3": {"blk.0.attn_q_norm", "blk.0.attn_k_norm", "scratch.kn"},
    "phi3": set(),
    "gemma2": {"blk.0.post_attention_norm", "blk.0.post_ffw_norm"},
    "gemma3": {"blk.0.post_attention_norm", "blk.0.post_ffw_norm", "blk.0.attn_q_norm"},
    "bamboo": set(),
    "opt": {
        "blk.0.attn_norm.bias",
        "blk.0.attn_output.bias",
        "blk.0.ffn_norm.bias",
        "blk.0.ffn_up.bias",
        "blk.0.ffn_down.bias",
        "output_norm.bias",
    },
    "falcon": {"blk.0.attn_norm.bias", "blk.0.ffn_norm.bias", "scratch.saved"},
}


@pytest.mark.parametrize("arch", list(FAMILY_VECTORS))
def test_every_family_report_equals_the_accounting(synth_gguf, arch, tmp_path):
    """Each family's biases, q/k norms, post-norms, LayerNorm biases, gate-less slabs and
    scratch buffers: counted byte for byte by both sides, at half and at all of the bytes."""
    act = {"gemma2": "gelu", "gemma3": "gelu"}.get(arch, "relu")
    extra = {"tie": True} if arch in ("gemma2", "gemma3", "opt") else {}
    extra |= {"falcon": {"kv_heads": 1}, "opt": {"kv_heads": SHAPE["heads"]}}.get(arch, {})
    path = synth_gguf(dtype="Q8_0", activation=act, arch=arch, **{**SHAPE, **extra})
    engine = Engine(load_model(path))
    for share in (0.5, 1.0):
        plan = plan_for(engine, int(full_bytes(engine) * share))
        path = save_plan(plan, tmp_path / f"{share}.safetensors")
        names = {n for n, _ in check_report(engine, plan, path)}
        if share == 1.0:
            assert FAMILY_VECTORS[arch] <= names, FAMILY_VECTORS[arch] - names


@pytest.mark.parametrize("dtype", ["Q4_K_M", "Q5_K", "Q6_K"])
def test_k_quant_report_equals_the_accounting(synth_gguf, dtype, tmp_path):
    """K-quant rows (144, 176, 210 bytes per 256 weights) in attention, slabs and the output
    head: the two accountings agree."""
    engine = Engine(load_model(synth_gguf(dtype=dtype, **K_SHAPE)))
    types = {t.dtype for t in engine.loaded.tensors.values() if t.rows > 1}
    assert types == ({"Q4_K", "Q6_K"} if dtype == "Q4_K_M" else {dtype})
    for share in (0.4, 1.0):
        plan = plan_for(engine, int(full_bytes(engine) * share))
        path = save_plan(plan, tmp_path / f"{share}.safetensors")
        report = dict(check_report(engine, plan, path))
        if share == 1.0:
            rows = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
            out = rows["Q6_K" if dtype == "Q4_K_M" else dtype]
            assert report["output"] == -(-300 * out // 256) * 256
            down = rows["Q6_K" if dtype == "Q4_K_M" else dtype]  # last layer: Q6_K down_t
            gate = rows["Q4_K" if dtype == "Q4_K_M" else dtype]
            slabs = plan.placement.ffn_buckets[2]
            slab = -(-plan.bucket * (2 * gate + down + 4) // 256) * 256
            assert report["blk.2.ffn_hot"] == slabs * slab


@pytest.mark.parametrize("kind", ["gguf-Q4_0", "hf-bf16"])
@pytest.mark.parametrize("bucket", [32, 48, 100])
def test_buckets_and_predictor_sizes(engines, kind, bucket, tmp_path):
    """Partial slabs (320 neurons are no whole number of 48 or 100), predictor sizes from a file
    (fc1 + fc2) and fixed ones (a single ``pred`` buffer), another context."""
    engine = engines(kind)
    c = engine.config
    write_zero_predictors(tmp_path / "pred.safetensors", c, 24, fc2_dtype=np.float32)
    for preds in (
        read_predictor_sizes(tmp_path / "pred.safetensors", c),
        fixed_predictor_sizes(c, 3000),
    ):
        kw = dict(bucket=bucket, predictors=preds, context=200)
        full = full_bytes(engine, **kw)
        for share in (0.6, 1.0):
            plan = plan_for(engine, int(full * share), **kw)
            path = save_plan(plan, tmp_path / "plan.safetensors")
            report = dict(check_report(engine, plan, path))
            fixed = preds.source.startswith("fixed")
            # A predictor goes to the GPU with some of its layer's neurons (it serves them).
            on = [i for i, p in enumerate(plan.placement.predictor) if p]
            assert on and all(plan.placement.ffn_buckets[i] for i in on)
            i = on[0]
            assert (f"blk.{i}.pred" in report) == fixed and (f"blk.{i}.pred_fc1" in report) != fixed
        # everything on the GPU: ceil(320 / bucket) slabs per layer, the last one partial
        assert plan.placement.ffn_buckets == [-(-c.ffn_dim // bucket)] * c.n_layers
        assert report["blk.0.ffn_hot"] % plan.placement.ffn_buckets[0] == 0


def test_the_report_moves_with_the_engine_data(engines, tmp_path):
    """Tests that can fail: the same plan on a model with other dtypes, another bucket, f32
    norms where the file stores f16 ones."""
    q8, q4, f16 = engines("gguf-Q8_0"), engines("gguf-Q4_0"), engines("hf-f16")
    plan = plan_for(q8, int(full_bytes(q8) * 0.7))
    path = save_plan(plan, tmp_path / "q8.safetensors")
    on_q8 = q8.gpu_allocation_report(path)
    # Rust does not know fingerprints: the Q4_0 model's own weights give other sizes ...
    on_q4 = [tuple(a) for a in q4.core_model.gpu_allocation_report(str(path))]
    assert [n for n, _ in on_q4] == [n for n, _ in on_q8]
    assert total_bytes(on_q4) < total_bytes(on_q8) == plan.gpu_bytes
    assert dict(on_q4)["blk.0.ffn_hot"] < dict(on_q8)["blk.0.ffn_hot"]
    # ... and the engine refuses another model's plan.
    with pytest.raises(PlanError, match="made for model"):
        q4.gpu_allocation_report(path)
    # Another bucket changes the slabs.
    p32 = plan_for(q8, int(full_bytes(q8) * 0.7), bucket=32)
    path32 = save_plan(p32, tmp_path / "q8-32.safetensors")
    assert check_report(q8, p32, path32) != on_q8
    # HF f16 norms are stored in 2 bytes but live on the GPU as f32.
    pf = plan_for(f16, full_bytes(f16))
    report = dict(check_report(f16, pf, save_plan(pf, tmp_path / "f16.safetensors")))
    assert report["blk.0.attn_norm"] == report["output_norm"] == 4 * 128
    assert f16.loaded.tensors["blk.0.attn_norm"].dtype == "F16"


def _rewrite(path, out, edit):
    """Copy plan file ``path`` to ``out`` with its JSON metadata passed through ``edit``."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    j = json.loads(meta["plan"])
    edit(j)
    meta["plan"] = json.dumps(j)
    save_file(tensors, str(out), meta)
    return out


def test_bad_plans_are_plan_errors(engines, tmp_path):
    engine = engines("gguf-Q8_0")
    core = engine.core_model
    plan = plan_for(engine, int(full_bytes(engine) * 0.5))
    good = save_plan(plan, tmp_path / "good.safetensors")
    assert check_report(engine, plan, good)

    def bucket(j):
        j["bucket"] = j["bucket"] // 2  # the neuron counts then need other bucket counts

    def layers(j):
        j["placement"]["attention"].pop()

    def junk_json(j):
        j["placement"]["output"] = "yes"

    for edit in (bucket, layers, junk_json):
        bad = _rewrite(good, tmp_path / f"{edit.__name__}.safetensors", edit)
        with pytest.raises(PlanError):
            core.gpu_allocation_report(str(bad))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a plan file at all")
    for p in (junk, tmp_path / "missing.safetensors"):
        with pytest.raises(PlanError):
            core.gpu_allocation_report(str(p))


def test_engine_plan_argument_and_no_plan(engines, synth_gguf, tmp_path):
    engine = Engine(engines("gguf-Q4_0").loaded)
    with pytest.raises(PlanError, match="no plan"):
        engine.gpu_allocation_report()
    cpu = save_plan(plan_for(engine, 0), tmp_path / "cpu.safetensors")
    loaded = Engine(engine.loaded, plan=cpu)  # the CPU device takes CPU-only plans
    assert loaded.gpu_allocation_report() == []
    other = Engine(load_model(synth_gguf(dtype="Q4_0", **{**SHAPE, "layers": 2})))
    with pytest.raises(PlanError):
        other.core_model.gpu_allocation_report(str(cpu))  # 3 layers of neurons, 2 in the model


def test_smollm2(smol, tmp_path):
    engine = Engine(smol, n_ctx=64)
    full = full_bytes(engine, context=512)
    for share in (0.25, 1.0):
        plan = plan_for(engine, int(full * share), context=512)
        report = check_report(engine, plan, save_plan(plan, tmp_path / f"{share}.safetensors"))
        assert total_bytes(report) > 0


def test_load_plan_refuses_a_plan_the_engine_would_exceed(engines, tmp_path):
    """A plan that under-counts (its file puts the output head on the GPU but records 0 GPU
    bytes) is refused by the planner's reader and, independently, by the engine's own
    allocation list when the Rust core reads the plan."""
    from powerinfer_rs.formats.plan import load_plan

    engine = Engine(engines("gguf-Q4_0").loaded)  # its own: this test loads plans into it
    cpu = save_plan(plan_for(engine, 0), tmp_path / "cpu.safetensors")
    bad = _rewrite(cpu, tmp_path / "bad.safetensors", lambda j: j["placement"].update(output=True))
    with pytest.raises(PlanError, match="records 0 GPU bytes"):
        load_plan(bad, model=engine.loaded)  # the planner's own check
    with pytest.raises(PlanError, match="would allocate"):
        engine.load_plan(bad)  # the engine's, without the planner's help
    assert engine.plan is None
    engine.load_plan(cpu)
    assert engine.plan is not None and engine.gpu_allocation_report() == []


def _family_model(synth_gguf, arch: str):
    """A Q8_0 model of ``arch`` at this file's shape (a mixture of experts at its own)."""
    from test_moe import MOE_ARCHS

    if arch in MOE_ARCHS:
        from test_hybrid_moe import SHAPE as MOE_SHAPE

        act = "relu" if arch == "smallthinker" else "silu"
        args = {**MOE_SHAPE, **MOE_ARCHS[arch], "activation": act}
        return load_model(synth_gguf(dtype="Q8_0", seed=5, arch=arch, **args))
    act = {"gemma2": "gelu", "gemma3": "gelu"}.get(arch, "relu")
    extra = {"tie": True} if arch in ("gemma2", "gemma3", "opt") else {}
    extra |= {"falcon": {"kv_heads": 1}, "opt": {"kv_heads": SHAPE["heads"]}}.get(arch, {})
    return load_model(synth_gguf(dtype="Q8_0", activation=act, arch=arch, **{**SHAPE, **extra}))


def _family_modes():
    """(family, mode) for every family the tests build and every mode a plan is for there
    (the engine's mode table: what the GPU side runs, inside experts for a mixture)."""
    from test_moe import MOE_ARCHS

    from powerinfer_rs.planning.model_shape import MOE_SPARSITIES, SPARSITIES

    return [(a, m) for a in FAMILY_VECTORS for m in SPARSITIES] + [
        (a, m) for a in MOE_ARCHS for m in MOE_SPARSITIES
    ]


@pytest.mark.parametrize(("arch", "mode"), _family_modes())
def test_every_family_and_mode_report_equals_the_accounting(synth_gguf, arch, mode, tmp_path):
    """The planner's Python accounting and the engine's Rust allocation list, on every family
    (the dense ones and the mixtures of experts) and every mode a plan is made for: name for
    name, byte for byte, at half and at all of the model's bytes."""
    model = _family_model(synth_gguf, arch)
    engine = Engine(model)
    c = engine.config
    if c.n_expert:
        from test_hybrid_moe import measured_profile

        profile = measured_profile(model)
    else:
        profile = synthetic_profile(
            c.n_layers, c.ffn_dim, 1000, seed=0, model_fingerprint=model.fingerprint
        )
    total = sum(t.nbytes for t in model.tensors.values())
    kw = dict(context=CONTEXT, bucket=32, sparsity=mode, objective="mass", min_neurons=0)
    for share in (0.5, 4.0):
        plan = make_plan(model, profile, load_hardware("rtx4090"), int(share * total),
                         solver="greedy", **kw)  # fmt: skip
        assert plan.predicted["sparsity"] == mode
        path = save_plan(plan, tmp_path / f"{share}.safetensors")
        report = check_report(engine, plan, path)
        assert report, "a plan at half the model's bytes puts something on the GPU"
