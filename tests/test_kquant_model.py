"""Models stored in the Q5 formats and K-quants, end to end: synthetic GGUF files written with
our own encoder (no llama.cpp needed) against the float64 numpy reference, including the mixed
"Q4_K_M" recipe whose rows of ``dim`` weights fall back to Q5_0 / Q8_0 when ``dim`` is not a
multiple of 256 (as in SmolLM2's Q4_K_M files), and the sparse decode kernels on the re-encoded
``down_t``."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_engine import assert_rows_close

from powerinfer_rs import Engine
from powerinfer_rs.loading import load_model

from _helpers import decode_logits, rel
from reference import reference_logits

#: dim 64 (not whole super-blocks: fallbacks) and dim 256 (every matrix a K-quant).
SHAPES = {
    "fallback": dict(dim=64, ffn=256, heads=4, kv_heads=2),
    "whole": dict(dim=256, ffn=512, heads=4, kv_heads=2),
}


def _types(model) -> Counter:
    return Counter(t.dtype for t in model.tensors.values() if t.rows > 1)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_q4_k_m_mix_matches_reference(synth_gguf, shape):
    model = load_model(synth_gguf("Q4_K_M", activation="silu", **SHAPES[shape]))
    types = _types(model)
    if shape == "fallback":
        assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} <= set(types), types
    else:
        assert set(types) == {"Q4_K", "Q6_K"}, types
    ids = list(np.random.default_rng(8).integers(0, model.config.vocab_size, 40))
    eng = Engine(model, threads=2)
    ref = reference_logits(model, ids)
    assert_rows_close(eng.logits(ids), ref)
    # One token at a time: the matvec kernels (int16 x) rather than the batched matmul.
    assert_rows_close(decode_logits(eng, ids[:12]), ref[:12])


@pytest.mark.parametrize("dtype", ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_every_new_format_matches_reference(synth_gguf, dtype):
    model = load_model(synth_gguf(dtype, **SHAPES["whole"]))
    assert set(_types(model)) == {dtype}
    ids = list(np.random.default_rng(9).integers(0, model.config.vocab_size, 24))
    eng = Engine(model, threads=2)
    ref = reference_logits(model, ids)
    assert_rows_close(eng.logits(ids), ref)
    assert_rows_close(decode_logits(eng, ids[:8]), ref[:8])


@pytest.mark.parametrize("shape", list(SHAPES))
def test_exact_relu_decodes_close_on_reencoded_down_t(synth_gguf, shape):
    """Sparse decoding reads ``down_t``, the down projection re-encoded in its format (or its
    32-weight fallback): close to dense, not equal; the batched path is the same function."""
    model = load_model(synth_gguf("Q4_K_M", activation="relu", **SHAPES[shape]))
    ids = list(np.random.default_rng(10).integers(0, model.config.vocab_size, 16))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    assert rel(sparse.logits(ids), dense.logits(ids)) <= 1e-5
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05
