"""Helpers shared by several test modules (``from _helpers import ...``; the fixtures are in
``conftest.py``): a tiny valid model config, a small mixture of experts, the relative error of
logits, the engine's logits and greedy tokens fed one token at a time, llama.cpp's greedy
tokens, the profiler's counts, and the planner's toy machine, problems and placements."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

#: The sizes of :func:`toy_config`: 2 layers, dim 8, 16 neurons, 2 query heads over 1 KV head.
TINY_SIZES: dict = dict(n_layers=2, dim=8, ffn_dim=16, n_heads=2, n_kv_heads=1, head_dim=4)
TINY_SIZES.update(vocab_size=300, max_context=32, rms_eps=1e-5, rope_theta=1e4)


def toy_config(**over: object):
    """A valid llama ``ModelConfig`` of :data:`TINY_SIZES` (SiLU, RoPE pairing "norm"), with
    the fields ``over`` names replaced."""
    from powerinfer_rs.loading.types import ModelConfig

    base = dict(arch="llama", rope_style="norm", activation="silu", **TINY_SIZES)
    return ModelConfig(**{**base, **over})


def small_moe(synth_gguf):
    """A synthetic qwen3moe model in F32 (``conftest.synth_gguf``'s shape, 8 experts of 64
    neurons, 3 a token), loaded."""
    from powerinfer_rs.loading import load_model

    moe = dict(arch="qwen3moe", experts=8, experts_used=3, expert_ffn=64)
    return load_model(synth_gguf(dtype="F32", activation="silu", **moe))


def rel(a, b: np.ndarray) -> float:
    """Relative error of ``a`` against ``b`` (Frobenius norms)."""
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def decode_logits(eng, ids: Sequence[int]) -> np.ndarray:
    """Logits of every position, fed one token at a time (the decode kernels); the engine is
    reset before and after."""
    eng.reset()
    rows = [eng.prefill([t]) for t in ids]
    eng.reset()
    return np.stack(rows)


def assert_batched_and_decoding_match(eng, ids: Sequence[int], ref: np.ndarray, rtol: float):
    """The engine's logits of ``ids`` in one batch, then fed one token at a time, are each
    within ``rtol`` (relative) of the reference logits ``ref``."""
    assert rel(eng.logits(ids), ref) <= rtol
    eng.reset()
    rows = np.stack([eng.prefill([t]) for t in ids])
    assert rel(rows, ref) <= rtol


def engine_greedy(eng, prompt: Sequence[int], n: int) -> list[int]:
    """``n`` greedy tokens (argmax) of the engine after ``prompt``, from a reset session."""
    eng.reset()
    logits = eng.prefill(prompt)
    toks = []
    for _ in range(n):
        toks.append(int(np.argmax(logits)))
        logits = eng.prefill([toks[-1]])
    return toks


def llama_greedy(llm, prompt: Sequence[int], n: int) -> list[int]:
    """``n`` greedy tokens (argmax) of a ``llama_cpp.Llama`` with all logits after ``prompt``,
    from a reset context."""
    llm.reset()
    llm.eval(prompt)
    toks = []
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        toks.append(t)
        llm.eval([t])
    return toks


def profile_counts(eng, ids: Sequence[int]) -> tuple[np.ndarray, int]:
    """(neuron activation counts, tokens) the engine's profiler takes over ``ids``."""
    eng.start_profiling()
    eng.logits(ids)
    counts, tokens = eng.profile_counts()
    eng.stop_profiling()
    return counts, tokens


def toy_hardware():
    """A toy machine on which the GPU pays off even for tiny layers, with room for
    everything."""
    from powerinfer_rs.planning import HardwareProfile

    rates = dict(gpu_mem_bw=100.0, pcie_bw=10.0, cpu_mem_bw=1.0, cpu_cores=2)
    latencies = dict(launch_latency_us=0.1, sync_latency_us=0.2)
    return HardwareProfile(name="toy", vram_bytes=2**40, **rates, **latencies)


def toy_problem(shape, prof, budget: int, **kw):
    """The planning problem of ``shape`` with the profile ``prof`` on :func:`toy_hardware`
    within ``budget`` bytes, for a context of 16 positions (``kw``: ``build_problem``'s other
    keywords)."""
    from powerinfer_rs.planning import build_problem

    return build_problem(shape, prof, toy_hardware(), budget, context=16, **kw)


def all_placements(p) -> Iterator:
    """Every placement of the planning problem ``p``: each layer's hot buckets, attention and
    predictor on the GPU or not, and the output head's."""
    from powerinfer_rs.planning import Placement

    per_layer = [
        list(itertools.product(range(lt.n_buckets + 1), (False, True), (False, True)))
        for lt in p.layers
    ]
    for combo in itertools.product(*per_layer):
        for out in (False, True):
            yield Placement(
                attention=[c[1] for c in combo],
                predictor=[c[2] for c in combo],
                ffn_buckets=[c[0] for c in combo],
                output=out,
            )


def load_tool(name: str):
    """``tools/{name}.py`` of this tree as a module (registered in ``sys.modules``)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
