"""The decoded formats end to end: the table formats (IQ4_NL, IQ4_XS, MXFP4: 4-bit indices into
16 non-linear values) and the ternary ones (TQ1_0, TQ2_0: {-1, 0, 1} times a scale per 256), on
files written by llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``; none of
them needs an importance matrix) from a synthetic F32 model: IQ4_NL, IQ4_XS, TQ1_0 and TQ2_0
with llama.cpp's default recipe for the file type (the head in Q6_K; for TQ*, the token
embeddings in Q4_K), MXFP4 as llama.cpp's
MXFP4_MOE type writes it (the experts of a synthetic Qwen3-MoE in MXFP4, the rest Q8_0), and a
dense file with every matrix in MXFP4 (``pure``) for the sparse modes.

- every table-format tensor decodes (``_core.dequantize``) to gguf-py's values bit for bit;
- the largest per-position relative logit error against the float64 reference of the same
  weights is within llama.cpp's own (llama.cpp also quantizes the activations to 8 bits), for
  the batched and the one-token kernels;
- exact-relu decodes as dense does on a ReLU model in the format.
"""

from __future__ import annotations

import ctypes
from collections import Counter

import numpy as np
import pytest
from llamacpp_check import format_errors

from powerinfer_rs import Engine, _core
from powerinfer_rs.loading import load_model

from _helpers import decode_logits, rel

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

#: Every matrix's rows whole IQ4_XS super-blocks (dim, ffn and the head's rows of 256).
SHAPE = dict(dim=256, ffn=512, heads=4, kv_heads=2)
MOE = dict(arch="qwen3moe", experts=8, experts_used=3, expert_ffn=256)
#: llama.cpp's file types (llama_ftype) and what each writes on our synthetic models.
FILES = {
    "IQ4_NL": (25, False, {}, {"IQ4_NL", "Q6_K"}),
    "IQ4_XS": (30, False, {}, {"IQ4_XS", "Q6_K"}),
    "MXFP4": (38, False, MOE, {"MXFP4", "Q8_0", "F32"}),
    "TQ1_0": (36, False, {}, {"TQ1_0", "Q6_K", "Q4_K"}),
    "TQ2_0": (37, False, {}, {"TQ2_0", "Q6_K", "Q4_K"}),
}
#: The dense file with every matrix in MXFP4 (llama.cpp's ``pure`` quantization).
MXFP4_DENSE = (38, True, {}, {"MXFP4"})


@pytest.fixture(scope="module")
def quantized(synth_gguf, tmp_path_factory):
    """``quantized(spec, activation)`` -> a file llama.cpp's quantizer wrote (cached)."""
    made = {}

    def make(spec, activation="silu"):
        ftype, pure, extra, _ = spec
        key = (ftype, pure, activation, tuple(extra))
        if key not in made:
            src = synth_gguf("F32", activation=activation, seed=5, **SHAPE, **extra)
            dst = tmp_path_factory.mktemp(f"ftype{ftype}") / "model.gguf"
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.pure, params.nthread = ftype, pure, 2
            rc = llama_cpp.llama_model_quantize(
                str(src).encode(), str(dst).encode(), ctypes.byref(params)
            )
            assert rc == 0, f"llama_model_quantize failed: {rc}"
            made[key] = dst
        return made[key]

    return make


def _matrix_types(model) -> Counter:
    return Counter(t.dtype for t in model.tensors.values() if t.rows > 1)


@pytest.mark.parametrize("dtype", list(FILES))
def test_dequantize_is_gguf_py_bit_for_bit(quantized, dtype):
    model = load_model(quantized(FILES[dtype]))
    types = _matrix_types(model)
    assert set(types) == FILES[dtype][3], types
    checked = 0
    for t in model.tensors.values():
        if t.dtype != dtype:
            continue
        raw = np.asarray(t.data).reshape(t.rows, t.row_bytes)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[dtype])
        got = _core.dequantize(dtype, raw, t.cols)
        np.testing.assert_array_equal(got, want.astype(np.float32).reshape(t.rows, t.cols))
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("dtype", list(FILES))
def test_logits_within_llama_cpps_distance_of_the_reference(quantized, dtype):
    path = quantized(FILES[dtype])
    model = load_model(path)
    batched, one, theirs = format_errors(path, model)
    assert max(batched, one) <= theirs, (batched, one, theirs)


@pytest.mark.parametrize(
    "spec", [FILES["IQ4_NL"], FILES["IQ4_XS"], MXFP4_DENSE, FILES["TQ1_0"], FILES["TQ2_0"]]
)
def test_exact_relu_decodes_as_dense(quantized, spec):
    """Sparse decoding reads ``down_t``, the down projection re-encoded in its format: close to
    dense, not equal; the batched path is the dense function."""
    model = load_model(quantized(spec, activation="relu"))
    assert set(_matrix_types(model)) == spec[3]
    ids = list(np.random.default_rng(10).integers(0, model.config.vocab_size, 12))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    assert rel(sparse.logits(ids), dense.logits(ids)) <= 1e-5
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05
