"""ggml's block formats in the KV cache (q8_0, q4_0, q4_1 along head_dim; keys and values
apart where asked, as llama.cpp's -ctk/-ctv), on the CPU engine: a multi-token decode pass's
rows (verification, slots) equal one-token steps bit for bit, the logits stay near the float64
reference (looser than f16's), every sparse mode, the slots and the prefix cache's snapshots
take them, the snapshot's bytes are the planner's, and the hybrid executor refuses them
(UnsupportedError naming the type).
The perplexity against llama.cpp's on the same GGUF: tests/test_kv_quant_llamacpp.py."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine, _core, cli
from powerinfer_rs.errors import UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning import gpu_allocation
from powerinfer_rs.planning.accounting import kv_position_bytes
from powerinfer_rs.planning.model_shape import ModelShape
from powerinfer_rs.planning.sizes import align

from reference import reference_logits

#: Heads of 32 values: one block each (SMALL's are 16 wide, no whole block).
WIDE = dict(dim=128, heads=4, kv_heads=2)
QUANT = ("q8_0", "q4_0", "q4_1")
#: |engine − float64 reference| per logit over the largest |reference| logit, per setting
#: (synthetic model, 16 tokens).
TOL = {"q8_0": 2e-2, "q4_0": 1e-1, "q4_1": 1e-1, "q8_0/f16": 2e-2, "f16/q4_0": 1e-1}
GREEDY = dict(max_new_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def relu(synth_gguf):
    return load_model(synth_gguf(dtype="F32", activation="relu", **WIDE))


def ids_of(m, n: int, seed: int = 4) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, m.config.vocab_size, n)]


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def batched_and_stepped(eng: Engine, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The logits of ``ids`` as one multi-token decode pass (``Session.decode``: the rows of
    verification and of the slots) and as one-token steps, each on a fresh session."""
    batched = eng.new_session().decode(ids)
    s = eng.new_session()
    stepped = np.concatenate([s.feed([t]) for t in ids])
    return batched, stepped


@pytest.mark.parametrize("kv", [*QUANT, "q8_0/f16", "f16/q4_0"])
def test_batched_rows_equal_steps_and_stay_near_the_reference(relu, kv):
    ids = ids_of(relu, 16)
    want = reference_logits(relu, ids)
    eng = Engine(relu, threads=2, kv_cache=kv)
    assert eng.kv_cache == kv
    k, _, v = kv.partition("/")
    assert (eng.kv_cache_k, eng.kv_cache_v) == (k, v or k)
    per = eng.new_session().kv_snapshot_bytes_per_position
    assert per == kv_position_bytes(ModelShape.coerce(relu), kv)
    batched, stepped = batched_and_stepped(eng, ids)
    np.testing.assert_array_equal(batched, stepped)
    f16 = worst(Engine(relu, threads=2).logits(ids), want)
    err = (worst(eng.logits(ids), want), worst(stepped, want))
    assert f16 < min(err) and max(err) <= TOL[kv], (kv, err, f16)


def test_the_sides_are_set_apart_and_names_are_checked(relu):
    eng = Engine(relu, threads=2, kv_cache="q4_0", kv_cache_v="q8_0")
    assert eng.kv_cache == "q4_0/q8_0"
    assert Engine(relu, threads=2, kv_cache_k="q8_0").kv_cache == "q8_0/f16"
    assert set(QUANT) <= set(_core.KV_CACHE_TYPES)
    with pytest.raises(UnsupportedError, match="q3_0"):
        Engine(relu, kv_cache_v="q3_0")
    # 68 bytes a q8_0 row of 64 against 128 at f16, per layer and side.
    n_layers = relu.config.n_layers
    assert eng.new_session().kv_snapshot_bytes_per_position == n_layers * (36 + 68)


@pytest.mark.parametrize("mode", ["exact-relu", "threshold"])
def test_sparse_modes_run_on_a_quantized_cache(relu, synth_gguf, mode):
    m = relu if mode == "exact-relu" else load_model(synth_gguf(dtype="F32", **WIDE))
    ids = ids_of(m, 12, seed=5)
    kw = {"thresholds": [0.0] * m.config.n_layers} if mode == "threshold" else {}
    dense = Engine(m, threads=2, kv_cache="q8_0").logits(ids)
    eng = Engine(m, threads=2, kv_cache="q8_0", sparsity=mode, **kw)
    assert eng.kv_cache == "q8_0"
    batched, stepped = batched_and_stepped(eng, ids)
    np.testing.assert_array_equal(batched, stepped)
    # Skipping the rows whose ReLU is 0 (or below a threshold of 0) is dense's function.
    assert worst(batched, dense) < 1e-4


@pytest.mark.parametrize("kv", ["q8_0", "q4_0"])
def test_slots_and_the_prefix_cache_take_quantized_caches(relu, kv):
    from test_slots import run_together

    from powerinfer_rs.runtime.slots import SlotPool

    eng = Engine(relu, threads=2, kv_cache=kv)
    prompts = [list(range(10, 50)) + [5], list(range(10, 50)) + [7, 8], [200, 201, 2, 9]]
    want = [eng.generate(p, **GREEDY) for p in prompts]
    with SlotPool(eng, 2, cache_bytes=1 << 20, chunk=8) as pool:
        assert all(s._core.kv_cache == kv for s in pool.slots)
        assert run_together(pool, prompts, **GREEDY) == want
        assert pool.batcher.shared_rounds > 0, pool.batcher.stats()
        for p in ([250, 251, 252, 253, 254], [240, 241, 242, 243]):  # no slot holds the prefix
            pool.generate(p, **GREEDY)
        assert all(s.reusable(prompts[1]) == 0 for s in pool.slots)
        assert pool.generate(prompts[1], **GREEDY) == want[1]
        cache = pool.stats()["prefix_cache"]
        assert cache["hits"] >= 1, cache
        per = pool.slots[0]._core.kv_snapshot_bytes_per_position
        assert per == kv_position_bytes(ModelShape.coerce(relu), kv)


def test_a_snapshot_restores_the_same_logits(relu):
    ids = ids_of(relu, 20, seed=6)
    eng = Engine(relu, threads=2, kv_cache="q4_1")
    s = eng.new_session()
    s.feed(ids[:15])
    snap = s.kv_snapshot(15)
    assert len(snap) == 15 * s.kv_snapshot_bytes_per_position
    want = s.decode(ids[15:16])
    t = eng.new_session()
    t.kv_restore(snap, 15)
    np.testing.assert_array_equal(t.decode(ids[15:16]), want)
    f16 = Engine(relu, threads=2).new_session()
    with pytest.raises(Exception, match="snapshot"):
        f16.kv_restore(snap, 15)


def test_the_planner_counts_block_bytes_and_the_hybrid_refuses_them(relu, tmp_path):
    from test_hybrid_families import make

    from powerinfer_rs.formats.plan import save_plan

    plan = make(relu, 4.0, None, kv_cache="q8_0")
    assert plan.kv_cache == "q8_0" and all(plan.placement.attention)
    alloc = dict(gpu_allocation(plan, relu))
    kv_dim = relu.config.n_kv_heads * relu.config.head_dim
    assert alloc["blk.0.cache_k"] == align(plan.context * kv_dim // 32 * 34)
    path = str(save_plan(plan, tmp_path / "q8.safetensors"))
    assert _core.read_plan(path)["kv_cache"] == "q8_0"
    with pytest.raises(UnsupportedError, match="q8_0 KV cache on the hybrid"):
        Engine(relu, threads=2, plan=path, device="gpu-sim")
    f16 = make(relu, 4.0, None)
    f16_path = str(save_plan(f16, tmp_path / "f16.safetensors"))
    hyb = Engine(relu, threads=2, plan=f16_path, device="gpu-sim")
    with pytest.raises(UnsupportedError, match="q4_0"):
        hyb.ctx.session.set_kv_cache("q4_0")
    assert hyb.kv_cache == "f16"


def test_the_cli_spells_llama_cpp_s_flags(synth_gguf, monkeypatch):
    seen = []
    real = Engine.from_pretrained.__func__

    def spy(cls, *args, **kw):
        eng = real(cls, *args, **kw)
        seen.append(eng.kv_cache)
        return eng

    monkeypatch.setattr(Engine, "from_pretrained", classmethod(spy))
    model = str(synth_gguf(dtype="F32", activation="relu", **WIDE))
    base = ["generate", "--model", model, "--prompt", "hi", "-n", "2", "--quiet"]
    for extra, want in (
        (["--kv-cache", "q8_0"], "q8_0"),
        (["-ctk", "q4_0", "-ctv", "q8_0"], "q4_0/q8_0"),
        (["--kv-cache", "q4_1", "--cache-type-v", "f16"], "q4_1/f16"),
        (["--kv-cache-k", "q8_0"], "q8_0/f16"),
    ):
        assert cli.main(base + extra) == 0, extra
        assert seen[-1] == want
