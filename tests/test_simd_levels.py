"""The SIMD levels end to end: ``POWERINFER_SIMD`` caps the level a process uses (it is read once
per process, so each level runs in a subprocess), and every level gives the same logits on
every weight format within the kernels' accuracy bound, dense and in exact-relu mode. On a CPU
with AVX-512 this compares the 512-bit kernels with the AVX2 ones and the scalar references;
elsewhere the levels it has."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# Kept small: each level is a fresh interpreter loading the extension.
SHAPE = dict(dim=256, ffn=704, layers=2, heads=4, kv_heads=4, vocab=512, activation="relu")
FORMATS = ["F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]
PROMPT = [1, 17, 300, 42, 99, 7, 511, 256, 3]

CHILD = r"""
import json, sys
import numpy as np
import powerinfer_rs as pi
from powerinfer_rs import _core
out = {"level": _core.simd_level(), "logits": {}}
for path in sys.argv[1:]:
    eng = pi.Engine.from_pretrained(path, threads=2, n_ctx=64)
    row = {}
    for mode in ("dense", "exact-relu"):
        eng.set_sparsity(mode)
        eng.reset()
        row[mode] = np.asarray(eng.logits(PROMPT), np.float64).tolist()
    out["logits"][path] = row
print(json.dumps(out))
""".replace("PROMPT", repr(PROMPT))


def _run(level: str | None, paths: list[str]) -> dict:
    env = dict(os.environ)
    env.pop("POWERINFER_SIMD", None)
    if level is not None:
        env["POWERINFER_SIMD"] = level
    res = subprocess.run(
        [sys.executable, "-c", CHILD, *paths], capture_output=True, text=True, env=env, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def models(synth_gguf) -> list[str]:
    return [str(synth_gguf(dt, **SHAPE)) for dt in FORMATS]


def test_levels_are_capped_and_agree(models):
    best = _run(None, models)
    avx2 = _run("avx2", models)
    scalar = _run("scalar", models)
    assert scalar["level"] == "scalar"
    assert avx2["level"] in {"avx2+fma+f16c", "scalar"}  # scalar on CPUs without AVX2
    if best["level"] == "avx512+vnni":
        assert avx2["level"] == "avx2+fma+f16c"
    else:
        assert best["level"] == avx2["level"]
    for path in models:
        for mode in ("dense", "exact-relu"):
            ref = np.asarray(scalar["logits"][path][mode])
            scale = float(np.abs(ref).max())
            for other in (best, avx2):
                got = np.asarray(other["logits"][path][mode])
                assert got.shape == ref.shape
                err = float(np.abs(got - ref).max())
                # The int16-x kernels round x to 16 bits (|dx| <= max|x|/65534 per block);
                # both vector levels must stay within 1e-3 of the largest logit of the scalar
                # path, which computes in f32 from the unrounded x.
                assert err <= 1e-3 * scale, (path, mode, other["level"], err, scale)


def test_unknown_cap_means_best(models):
    """An unrecognised value is not an error and does not lower the level."""
    best = _run(None, models[:1])
    other = _run("sse9000", models[:1])
    assert other["level"] == best["level"]
