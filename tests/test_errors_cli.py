"""Typed errors from both sides of the boundary, and the command line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from powerinfer_rs import Engine, _core
from powerinfer_rs.errors import (
    ContextOverflowError,
    ModelFileError,
    PowerInferError,
    ShapeError,
    TokenError,
    UnsupportedError,
)
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime.engine import core_model_arguments


@pytest.fixture(scope="module")
def small(synth_hf):
    return load_model(synth_hf(dtype="f32"))


def test_token_ids_out_of_range(small):
    eng = Engine(small, threads=1)
    vocab = small.config.vocab_size
    for bad in ([vocab], [-1], [1, 2, vocab + 5]):
        with pytest.raises(TokenError):
            eng.logits(bad)
    with pytest.raises(TokenError):
        eng.generate([0, vocab], max_new_tokens=1)
    # The Rust side checks too, with the same class.
    sess = _core.Session(eng.core_model, 1, 16)
    with pytest.raises(TokenError):
        sess.feed([vocab])
    with pytest.raises(TokenError):
        sess.feed([2**40])
    assert sess.n_past == 0


def test_context_overflow(small):
    eng = Engine(small, threads=1, n_ctx=16)
    with pytest.raises(ContextOverflowError):
        eng.logits(list(range(17)))
    with pytest.raises(ContextOverflowError):
        eng.generate(list(range(16)), max_new_tokens=1)
    # Generation stops cleanly when the context fills up.
    eng.generate(list(range(10)), max_new_tokens=50, temperature=0, ignore_eos=True)
    assert eng.last_stats.finish_reason == "context"
    assert eng.n_past == 16


def test_rust_side_rejects_bad_tensors(small):
    cfg, tensors = core_model_arguments(small)
    _core.Model(cfg, tensors)  # the good case builds

    t = dict(tensors)
    dt, r, c, data = t["blk.0.attn_q"]
    t["blk.0.attn_q"] = (dt, r, c, data[:-4])
    with pytest.raises(ShapeError, match="blk.0.attn_q"):
        _core.Model(cfg, t)

    t = dict(tensors)
    del t["blk.1.ffn_down"]
    with pytest.raises(ModelFileError, match="blk.1.ffn_down"):
        _core.Model(cfg, t)

    t = dict(tensors)
    t["blk.0.attn_k"] = ("Q8_K", *tensors["blk.0.attn_k"][1:])  # llama.cpp's activation type
    with pytest.raises(UnsupportedError):
        _core.Model(cfg, t)

    t = dict(tensors)
    t["blk.0.attn_v"] = (dt, r, c, np.zeros(3, dtype=np.float32))
    with pytest.raises(ModelFileError):
        _core.Model(cfg, t)

    t = dict(tensors)
    t["blk.0.attn_v"] = (dt, r, c, np.repeat(data, 2)[::2])  # the same bytes, strided
    with pytest.raises(ShapeError, match="contiguous"):
        _core.Model(cfg, t)

    # The core checks the config itself (the loaders' validate() is not its only guard).
    with pytest.raises(ShapeError, match="n_kv_heads"):
        _core.Model(cfg.replace(n_kv_heads=3), tensors)
    with pytest.raises(ShapeError, match="dim"):
        _core.Model(cfg.replace(dim=0), tensors)
    with pytest.raises(UnsupportedError, match="tanh"):
        cfg.replace(activation="tanh")
    with pytest.raises(ShapeError, match="n_layers"):
        cfg.replace(n_layers=-1)
    with pytest.raises(ShapeError, match="qkv_bias"):
        cfg.replace(qkv_bias=1)  # a flag is a bool
    with pytest.raises(TypeError, match="no field"):
        cfg.replace(n_layer=2)
    with pytest.raises(TypeError):
        _core.Model(cfg.to_dict(), tensors)  # a config, not a dict


def test_every_error_is_a_powerinfer_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    with pytest.raises(PowerInferError):
        Engine.from_pretrained(bad)
    with pytest.raises(ModelFileError):
        Engine.from_pretrained(tmp_path / "missing.gguf")
    with pytest.raises(ShapeError):
        Engine.from_pretrained(bad, threads=-1)


def test_bad_generation_arguments(small):
    eng = Engine(small, threads=1)
    with pytest.raises(ShapeError):
        eng.generate("x", temperature=-1.0)
    with pytest.raises(ShapeError):
        eng.generate("x", top_p=2.0)
    with pytest.raises(ShapeError):
        eng.generate("x", max_new_tokens=-1)
    with pytest.raises(ShapeError):
        eng.logits([])


def test_kernel_info_and_bandwidth():
    assert _core.simd_level() in {"avx512+vnni", "avx2+fma+f16c", "scalar"}
    gbs = _core.measure_read_bandwidth(16 << 20, 2, 1)
    assert 0.1 < gbs < 10_000


def _cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "powerinfer_rs", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_cli_help():
    out = _cli("--help")
    assert out.returncode == 0 and "generate" in out.stdout and "perplexity" in out.stdout
    for cmd in ("generate", "chat", "perplexity"):
        out = _cli(cmd, "--help")
        assert out.returncode == 0 and "--model" in out.stdout and "--threads" in out.stdout
    assert "--max-tokens" in _cli("generate", "--help").stdout


def test_cli_generate_and_perplexity(smol_path):
    out = _cli(
        "generate",
        "--model",
        str(smol_path),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--threads",
        "2",
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "tok/s" in out.stderr
    out = _cli("perplexity", "--model", str(smol_path), "--text", "Hello there, how are you?", "-q")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("perplexity ")


def test_cli_reports_bad_model_cleanly(tmp_path):
    out = _cli("generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "x")
    assert out.returncode == 2
    assert "ModelFileError" in out.stderr and "Traceback" not in out.stderr
