"""The planner and the GPU's weight formats: K-quant row sizes in the byte accounting (Q4_K: 144
bytes per 256 weights, Q6_K: 210, the 32-weight fallbacks of ``down_t``), and parts the GPU
cannot hold (matrices in Q2_K or Q3_K, which have no GPU kernels; gate and up in different
formats) kept on the CPU by every solver, with the reason in the plan's solver note."""

from __future__ import annotations

import pytest

from powerinfer_rs import _core
from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.planning import (
    ModelShape,
    Placement,
    evaluate,
    fixed_predictor_sizes,
    make_plan,
)
from powerinfer_rs.planning import accounting as acc
from powerinfer_rs.planning.greedy import solve_greedy
from powerinfer_rs.planning.model_shape import GPU_DTYPES
from powerinfer_rs.testing.synth_model import SynthSpec
from powerinfer_rs.testing.synth_types import tensor_dtype

from _helpers import all_placements, toy_hardware, toy_problem

#: A machine on which the GPU pays off even for tiny layers, with room for everything.
TOY_HW = toy_hardware()


def config(dim: int = 256, ffn: int = 512, layers: int = 2):
    return SynthSpec(dim, ffn, layers, heads=4, kv_heads=2, vocab=300).model_config()


def q4_k_m(cfg) -> ModelShape:
    """The shape of a Q4_K_M file of ``cfg`` (synth's recipe, fallbacks included)."""
    shape = ModelShape.from_config(cfg, "Q4_K")
    dtypes = {
        n: tensor_dtype("Q4_K_M", n, shape.shape(n)[1], cfg.n_layers)
        for n, d in shape.dtypes.items()
        if shape.shape(n)[0] > 1
    }
    return ModelShape.from_config(cfg, "Q4_K", dtypes=dtypes)


def test_the_gpu_formats_are_the_engines():
    assert tuple(_core.GPU_DTYPES) == GPU_DTYPES
    assert "Q2_K" not in GPU_DTYPES and "Q3_K" not in GPU_DTYPES


def test_k_quant_rows_in_the_accounting():
    # dim 256: whole super-blocks. Of 2 layers, the last takes Q6_K ffn_down (so down_t).
    shape = q4_k_m(config())
    assert shape.dtype("blk.0.ffn_gate") == "Q4_K" and shape.dtype("output") == "Q6_K"
    assert [shape.down_t_dtype(i) for i in range(2)] == ["Q4_K", "Q6_K"]
    assert shape.neuron_read_bytes(0) == 3 * 144
    assert shape.neuron_read_bytes(1) == 144 + 144 + 210
    # A slab: bucket x (rows + i32 id), 256-aligned.
    assert acc.slab_bytes(shape, 1, 8) == 4096  # 8 x 502 = 4016
    assert acc.slab_bytes(shape, 0, 32) == 14080  # 32 x 436 = 13952
    assert shape.tensor_bytes("blk.0.attn_k") == 128 * 144
    assert shape.tensor_bytes("output") == 300 * 210
    # Llama-7B rows: 4096 weights = 16 super-blocks; down_t of ffn_down [4096, 11008] has rows
    # of 4096 too.
    big = ModelShape.from_config(config(4096, 11008), "Q4_K", dtypes={"blk.0.ffn_down": "Q6_K"})
    assert big.neuron_read_bytes(0) == 2 * 16 * 144 + 16 * 210
    # dim 64: the rows of dim fall back to 32-weight formats, down_t too (Q6_K -> Q8_0, Q4_K ->
    # Q5_0), while ffn_down (rows of ffn = 256) stays a K-quant.
    small = q4_k_m(config(64, 256))
    assert small.dtype("blk.1.ffn_down") == "Q6_K" and small.dtype("blk.1.ffn_up") == "Q5_0"
    assert [small.down_t_dtype(i) for i in range(2)] == ["Q5_0", "Q8_0"]
    assert small.neuron_read_bytes(1) == 2 * 2 * 22 + 2 * 34
    for s in (shape, small):
        for i in range(2):
            for part in ("attention", "ffn"):
                assert s.gpu_refusal(part, i) is None, (part, i)
        assert s.gpu_refusal("output") is None


def test_refusals_name_the_format():
    cfg = config()
    q3 = ModelShape.from_config(
        cfg, "Q4_K", dtypes={f"blk.1.ffn_{t}": "Q3_K" for t in ("gate", "up", "down")}
    )
    assert q3.gpu_refusal("ffn", 0) is None
    why = q3.gpu_refusal("ffn", 1)
    assert "blk.1.ffn_gate is Q3_K" in why and "ffn_down_t is Q3_K" in why
    assert q3.gpu_refusal("attention", 1) is None
    q2 = ModelShape.from_config(cfg, "Q2_K")
    assert "Q2_K" in q2.gpu_refusal("attention", 0) and "Q2_K" in q2.gpu_refusal("output")
    # A Q2_K ffn_down over dim 64 is transposed to Q4_0, which the GPU takes; gate/up are not.
    small = ModelShape.from_config(config(64, 256), "Q4_0", dtypes={"blk.0.ffn_down": "Q2_K"})
    assert small.down_t_dtype(0) == "Q4_0" and small.gpu_refusal("ffn", 0) is None
    mixed = ModelShape.from_config(cfg, "Q4_K", dtypes={"blk.0.ffn_up": "Q6_K"})
    assert "ffn_gate is Q4_K and ffn_up Q6_K" in mixed.gpu_refusal("ffn", 0)
    with pytest.raises(ValueError, match="part"):
        mixed.gpu_refusal("ffn_hot", 0)


def problem(shape: ModelShape, objective: str, budget: int = 2**40, seed: int = 0):
    c = shape.config
    prof = synthetic_profile(c.n_layers, c.ffn_dim, 500, seed=seed, zipf_a=1.2)
    preds = fixed_predictor_sizes(c, 1000)
    return toy_problem(
        shape, prof, budget, objective=objective, bucket=128, predictors=preds, min_neurons=0
    )


#: Layer 0's attention in Q2_K, layer 1's FFN in Q3_K, the output head in Q2_K.
REFUSED = {
    **{f"blk.0.attn_{t}": "Q2_K" for t in ("q", "k", "v", "output")},
    **{f"blk.1.ffn_{t}": "Q3_K" for t in ("gate", "up", "down")},
    "output": "Q2_K",
}


def refused_parts_on_gpu(pl: Placement) -> bool:
    return bool(pl.attention[0] or pl.ffn_buckets[1] or pl.output)


def idle_predictor(pl: Placement) -> bool:
    """A predictor on the GPU in a layer without hot neurons (whose FFN runs on the CPU)."""
    return any(p and k == 0 for p, k in zip(pl.predictor, pl.ffn_buckets))


@pytest.mark.parametrize("objective", ["mass", "time"])
def test_solvers_keep_refused_parts_on_the_cpu(objective):
    shape = ModelShape.from_config(config(), "Q4_K", dtypes=REFUSED)
    p = problem(shape, objective)
    assert [lt.attn_gpu for lt in p.layers] == [False, True]
    assert [lt.ffn_gpu for lt in p.layers] == [True, False]
    assert not p.output_gpu and len(p.refusals()) == 3
    # Everything on the GPU is infeasible, with the reasons.
    everything = Placement([True] * 2, [True] * 2, [lt.n_buckets for lt in p.layers], True)
    ev = evaluate(p, everything)
    assert not ev.feasible
    assert "layer 0 attention" in ev.reason and "layer 1 neurons" in ev.reason
    assert "output head" in ev.reason and "Q3_K" in ev.reason
    # Brute force over every placement: the best feasible one leaves them on the CPU, and the
    # solvers find it (the budget holds everything else).
    best = None
    for pl in all_placements(p):
        e = evaluate(p, pl)
        assert e.feasible == (not refused_parts_on_gpu(pl) and not idle_predictor(pl)), pl
        if e.feasible:
            v = e.objective(objective)
            if best is None or (v > best if objective == "mass" else v < best):
                best = v
    g = solve_greedy(p).placement
    assert not refused_parts_on_gpu(g) and evaluate(p, g).feasible
    assert g.attention[1] and g.ffn_buckets[0] > 0
    pytest.importorskip("highspy")
    from powerinfer_rs.planning.ilp import solve_ilp

    res = solve_ilp(p, mip_rel_gap=0.0, time_limit=30)
    assert not refused_parts_on_gpu(res.placement)
    assert evaluate(p, res.placement).objective(objective) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("solver", ["greedy", "auto"])
def test_make_plan_keeps_q3_k_layers_on_the_cpu_and_says_so(solver):
    if solver == "auto":
        pytest.importorskip("highspy")
    cfg = config()
    shape = ModelShape.from_config(cfg, "Q4_K", dtypes=REFUSED)
    prof = synthetic_profile(cfg.n_layers, cfg.ffn_dim, 500, seed=1, zipf_a=1.2)
    plan = make_plan(
        shape, prof, TOY_HW, 2**30, context=16, bucket=64, min_neurons=0, solver=solver
    )
    pl = plan.placement
    assert not refused_parts_on_gpu(pl)
    assert len(plan.gpu_neurons[1]) == 0 and len(plan.gpu_neurons[0]) > 0
    assert pl.attention[1]
    assert "kept on the CPU, the GPU cannot hold them: layer 0 attention" in plan.solver["note"]
    assert "and 2 more" in plan.solver["note"]
    # A Q4_K_M model has nothing refused: everything fits and goes.
    plan = make_plan(
        q4_k_m(cfg), prof, TOY_HW, 2**30, context=16, bucket=64, min_neurons=0, solver=solver
    )
    assert plan.placement.output and all(plan.placement.attention)
    assert all(len(n) == cfg.ffn_dim for n in plan.gpu_neurons)
    assert "cannot hold" not in plan.solver.get("note", "")
