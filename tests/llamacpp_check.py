"""The check the new families' tests share: our logits and llama.cpp's (llama-cpp-python) on
the same GGUF, each against the float64 reference of the same weights (tests/reference.py),
by the largest relative logit error and the mean KL divergence; ours must stay within
llama.cpp's own distance (floored at f32 rounding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference import exact_kv_engine, reference_logits

#: ggml's f32 type id (llama.cpp's KV cache type for the comparisons).
GGML_TYPE_F32 = 0


def distance(logits: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(largest relative logit error over the positions, mean KL(ref || logits))."""
    rows = np.abs(logits - ref).max(axis=1) / np.abs(ref).max(axis=1)

    def logp(x):
        z = x - x.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    lp, lq = logp(ref), logp(logits)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    return float(rows.max()), float(kl.mean())


@dataclass
class Compared:
    """Both engines on one prompt: ours (an exact-KV engine) and llama.cpp's model, their
    logits, and each one's :func:`distance` from the reference (``err["ours"]``,
    ``err["llama.cpp"]``)."""

    eng: Any
    llm: Any
    ours: np.ndarray
    theirs: np.ndarray
    err: dict[str, tuple[float, float]]

    def assert_within_llama_cpp(self, kl: bool = True) -> None:
        """Ours no further from the reference than llama.cpp's (or than f32 rounding)."""
        assert self.err["ours"][0] <= max(self.err["llama.cpp"][0], 1e-5)
        if kl:
            assert self.err["ours"][1] <= max(self.err["llama.cpp"][1], 1e-9)


def compare_with_llama_cpp(
    m, path: Path, prompt: Sequence[int], label: str, n_ctx: int, **llama_kw: Any
) -> Compared:
    """Run ``prompt`` through llama.cpp (2 threads, f32 KV cache, every position's logits)
    and our engine on model ``m`` loaded from ``path``; print and return the distances."""
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=2,
        n_threads_batch=2,
        logits_all=True,
        type_k=0,
        type_v=0,
        verbose=False,
        **llama_kw,
    )
    llm.eval(list(prompt))
    theirs = np.asarray(llm.scores[: len(prompt)], dtype=np.float64)
    eng = exact_kv_engine(m, threads=2)
    ours = eng.logits(prompt).astype(np.float64)
    ref = reference_logits(m, prompt)
    err = {k: distance(v, ref) for k, v in (("ours", ours), ("llama.cpp", theirs))}
    print(f"{label} vs the float64 reference (max rel, mean KL):", err)
    return Compared(eng, llm, ours, theirs, err)


def worst_relative(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest per-position relative error of logits ``got`` against ``ref``."""
    got, ref = np.asarray(got), np.asarray(ref)
    return float(np.max(np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)))


def format_errors(path: Path, model: Any, n: int = 16, seed: int = 3) -> tuple[float, float, float]:
    """A weight format's check: the largest relative logit error against the float64 reference
    of the file's own weights of ours batched, ours one token at a time, and llama.cpp's (f32 KV
    on both sides), over ``n`` random ids."""
    import llama_cpp

    from _helpers import decode_logits

    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(3, model.config.vocab_size, n)]
    ref = reference_logits(model, ids)
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=64, n_threads=2, n_threads_batch=2, logits_all=True,
        type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, verbose=False,
    )  # fmt: skip
    llm.eval(ids)
    theirs = worst_relative(llm.scores[: len(ids)], ref)
    eng = exact_kv_engine(model, threads=2)
    batched = worst_relative(eng.logits(ids), ref)
    return batched, worst_relative(decode_logits(eng, ids), ref), theirs
