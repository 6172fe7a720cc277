"""The bandwidth model of a plan's GPU side: the bytes per kernel class follow the plan, the
profile and the mode (dense reads every hot row, exact-relu every gate row, the sparse modes the
rows of neurons that fire), and a plan that places nothing moves nothing."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.types import row_bytes
from powerinfer_rs.planning import load_hardware, make_plan
from powerinfer_rs.planning.accounting import xq_bytes
from powerinfer_rs.planning.bandwidth import format_traffic, gpu_traffic
from powerinfer_rs.planning.model_shape import ModelShape


@pytest.fixture(scope="module")
def setup(synth_gguf):
    model = load_model(synth_gguf(dtype="Q8_0", dim=64, ffn=160, layers=4, heads=4, kv_heads=2,
                                  vocab=300, activation="relu"))  # fmt: skip
    c = model.config
    prof = synthetic_profile(c.n_layers, c.ffn_dim, 2000, seed=1,
                             model_fingerprint=model.fingerprint)  # fmt: skip

    def plan(share: float):
        total = sum(t.nbytes for t in model.tensors.values())
        return make_plan(model, prof, load_hardware("rtx4090"), int(share * total), context=64,
                         bucket=32, min_neurons=0, solver="greedy", objective="mass")  # fmt: skip

    return model, prof, plan


def by_kernel(traffic):
    return {t.kernel: t for t in traffic}


def test_bytes_follow_the_plan_profile_and_mode(setup):
    model, prof, plan = setup
    p = plan(4.0)  # everything on the GPU
    c, shape = model.config, ModelShape.from_model(model)
    dense = by_kernel(gpu_traffic(p, model, prof, "dense"))
    relu = by_kernel(gpu_traffic(p, model, prof, "exact-relu"))
    pred = by_kernel(gpu_traffic(p, model, prof, "predictor"))
    rb = row_bytes("Q8_0", c.dim)
    vec = 4 * c.dim * c.n_layers  # the f32 output row per layer
    assert dense["gate_up"].bytes == c.n_layers * c.ffn_dim * 2 * rb + vec
    assert dense["axpy_rows (down)"].bytes == c.n_layers * c.ffn_dim * rb + vec
    fires = sum(float(prof.frequencies(i).sum()) for i in range(c.n_layers))
    assert pred["axpy_rows (down)"].bytes == pytest.approx(fires * rb + vec)
    assert pred["gate_up"].bytes == pytest.approx(2 * fires * rb + vec)
    assert relu["gate_up"].bytes == pytest.approx(c.n_layers * c.ffn_dim * rb + fires * rb + vec)
    assert dense["gate_up"].bytes > relu["gate_up"].bytes > pred["gate_up"].bytes
    attn = sum(shape.tensor_bytes(f"blk.{i}.{n}") for i in range(c.n_layers)
               for n in ("attn_q", "attn_k", "attn_v", "attn_output"))  # fmt: skip
    assert dense["sparse_matvec (q/k/v/o)"].bytes == attn
    kv = c.n_kv_heads * c.head_dim
    assert dense["kv_store"].bytes == c.n_layers * 2 * kv * 2  # f16
    assert dense["attention_decode"].bytes > c.n_layers * 2 * 64 * kv * 2
    assert dense["output head"].bytes >= shape.tensor_bytes("output")
    # Q8_0 weights read x quantized: the norms quantize q/k/v's, gate/up's and the head's input
    # in their own launch; quantize_x runs only before the o projection.
    assert dense["quantize_x"].launches == c.n_layers
    q_dim = c.n_heads * c.head_dim
    assert dense["quantize_x"].bytes == c.n_layers * (4 * q_dim + xq_bytes(q_dim))
    # The down pass's rows gathered per layer; predictor mode also gathers its active slots.
    assert dense["compact (lists)"].launches == c.n_layers
    assert pred["compact (lists)"].launches == 2 * c.n_layers
    t = dense["gate_up"]
    assert t.seconds(1000.0) == pytest.approx(t.bytes / 1e12)
    assert t.seconds(1000.0, 5.0) == pytest.approx(t.bytes / 1e12 + t.launches * 5e-6)
    table = format_traffic(list(dense.values()), 1000.0, 5.0)
    assert "gate_up" in table and table.splitlines()[-1].startswith("total")


def test_a_plan_that_places_nothing_moves_nothing(setup):
    model, prof, plan = setup
    assert gpu_traffic(plan(0.0), model, prof) == []
    half = gpu_traffic(plan(0.5), model, prof, "dense")
    assert 0 < sum(t.bytes for t in half) < sum(t.bytes for t in gpu_traffic(
        plan(4.0), model, prof, "dense"))  # fmt: skip
    assert np.isfinite([t.bytes for t in half]).all()
