"""The KV cache's precision: one setting for the CPU and the GPU layers, f16 by default (as
llama.cpp's), f32 on request. Against the float64 reference, every family at f16 stays within
1e-3 of the largest logit (prefill and one-token decoding), at f32 within 1e-5; the two
settings give different logits (the rounding happens), and the hybrid executor's GPU layers,
which hold f16, agree with the CPU engine at f16 (tests/test_hybrid_families.py)."""

from __future__ import annotations

import numpy as np
import pytest
from test_architectures import ARCHS, GELU

from powerinfer_rs import Engine
from powerinfer_rs.errors import UnsupportedError
from powerinfer_rs.loading import load_model

from reference import reference_logits

#: |engine − float64 reference| per logit, over the largest |reference| logit (at least 1).
TOL_F16 = 1e-3
TOL_F32 = 1e-5


def worst(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("arch", ["llama", *ARCHS])
def test_each_precision_against_the_float64_reference(synth_gguf, arch):
    act = "gelu" if arch in GELU else "silu"
    m = load_model(synth_gguf(dtype="F32", activation=act, arch=arch, **ARCHS.get(arch, {})))
    ids = [int(t) for t in np.random.default_rng(4).integers(3, m.config.vocab_size, 16)]
    want = reference_logits(m, ids)
    errors = {}
    for kv, tol in (("f16", TOL_F16), ("f32", TOL_F32)):
        eng = Engine(m, threads=2, kv_cache=kv)
        assert eng.kv_cache == kv
        batched = eng.logits(ids)
        eng.reset()
        stepped = np.stack([np.ravel(eng.prefill([t])) for t in ids])
        errors[kv] = (worst(batched, want), worst(stepped, want))
        assert max(errors[kv]) <= tol, (arch, kv, errors[kv])
    # The f16 setting does round: its logits are not the f32 ones.
    assert errors["f16"][0] > errors["f32"][0], errors


def test_default_and_bad_settings(synth_gguf):
    m = load_model(synth_gguf(dtype="F32"))
    assert Engine(m).kv_cache == "f16"
    with pytest.raises(UnsupportedError, match="KV cache precision"):
        Engine(m, kv_cache="q8_0")
