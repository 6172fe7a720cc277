"""The low-bit formats end to end: NVFP4 (E2M1 values, a UE4M3 scale per 16 weights), Q1_0
(signs times an f16 scale per 128) and Q2_0 (2-bit codes −1..2 times an f16 scale per 64), on
files written by llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``) from a
synthetic F32 model: Q1_0 and Q2_0 with their file types' default recipe (``MOSTLY_Q1_0`` = 40,
``MOSTLY_Q2_0`` = 41: the head in Q6_K, Q2_0's token embeddings in Q4_K), NVFP4 through the
quantizer's tensor-type overrides (every weight in NVFP4 over a Q8_0 base, as
``llama-quantize --tensor-type weight=nvfp4`` does: this llama.cpp refuses ``MOSTLY_NVFP4`` = 39
itself, "invalid output file type").

- every tensor of the format decodes (``_core.dequantize``) to the reference decoder's values
  bit for bit: gguf-py's numpy NVFP4 (the installed gguf and llama.cpp's vendored gguf-py
  agree), and for Q1_0 and Q2_0, which gguf-py has no numpy code for, ggml's own ``to_float``
  called in libggml-base.so through ctypes (``ggml_types.py``);
- our encoder (``_core.quantize``) writes ggml's reference quantizer's bytes;
- the largest per-position relative logit error against the float64 reference of the same
  weights is within llama.cpp's own, batched and one-token;
- exact-relu decodes as dense on a ReLU model in the format; the neuron store and the planner
  (``info``'s plan estimate) take it.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from ggml_types import GGML_TYPE, from_float, llama_quantize, to_float
from llamacpp_check import format_errors
from test_hybrid import assert_same_decode

from powerinfer_rs import Engine, _core
from powerinfer_rs.info import report
from powerinfer_rs.loading import load_model

from _helpers import decode_logits, rel

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

#: Every matrix's rows whole blocks of 128 (dim, ffn and the head's rows of 256).
SHAPE = dict(dim=256, ffn=512, heads=4, kv_heads=2)
#: llama.cpp's file type (llama_ftype), whether every weight is overridden to the format, and
#: the matrix formats it writes on our synthetic model.
FILES = {
    "NVFP4": (7, True, {"NVFP4"}),
    "Q1_0": (40, False, {"Q1_0", "Q6_K"}),
    "Q2_0": (41, False, {"Q2_0", "Q6_K", "Q4_K"}),
}


@pytest.fixture(scope="module")
def quantized(synth_gguf, tmp_path_factory):
    """``quantized(dtype, activation)`` -> a file llama.cpp's quantizer wrote (cached)."""
    made = {}

    def make(dtype, activation="silu"):
        if (dtype, activation) not in made:
            ftype, every, _ = FILES[dtype]
            src = synth_gguf("F32", activation=activation, seed=5, **SHAPE)
            dst = tmp_path_factory.mktemp(f"{dtype}_{activation}") / "model.gguf"
            llama_quantize(src, dst, ftype, GGML_TYPE[dtype] if every else None)
            made[(dtype, activation)] = dst
        return made[(dtype, activation)]

    return make


def _matrix_types(model) -> Counter:
    return Counter(t.dtype for t in model.tensors.values() if t.rows > 1)


def _reference_decode(dtype: str, raw: np.ndarray, cols: int) -> np.ndarray:
    if dtype == "NVFP4":
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.NVFP4).astype(np.float32)
    return to_float(dtype, raw, cols)


@pytest.mark.parametrize("dtype", list(FILES))
def test_dequantize_is_the_reference_bit_for_bit(quantized, dtype):
    model = load_model(quantized(dtype))
    assert set(_matrix_types(model)) == FILES[dtype][2], _matrix_types(model)
    checked = 0
    for t in model.tensors.values():
        if t.dtype != dtype:
            continue
        raw = np.asarray(t.data).reshape(t.rows, t.row_bytes)
        want = _reference_decode(dtype, raw, t.cols).reshape(t.rows, t.cols)
        got = _core.dequantize(dtype, raw, t.cols)
        np.testing.assert_array_equal(got, want)
        if dtype == "NVFP4":  # ggml's own decoder agrees with gguf-py's
            np.testing.assert_array_equal(to_float(dtype, raw, t.cols), want)
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("dtype", list(FILES))
def test_encoder_writes_ggmls_reference_bytes(dtype):
    """``_core.quantize`` follows ggml's ``quantize_row_*_ref`` (which llama.cpp's quantizer
    calls for these formats): the same bytes, block for block, on Gaussian rows with an
    outlier and a zero block."""
    x = np.random.default_rng(7).standard_normal((5, 3 * 128)).astype(np.float32)
    x[1, 17] = 40.0
    x[2, :128] = 0.0
    np.testing.assert_array_equal(_core.quantize(dtype, x), from_float(dtype, x))


@pytest.mark.parametrize("dtype", list(FILES))
def test_logits_within_llama_cpps_distance_of_the_reference(quantized, dtype):
    path = quantized(dtype)
    model = load_model(path)
    batched, one, theirs = format_errors(path, model)
    assert max(batched, one) <= theirs, (batched, one, theirs)


@pytest.mark.parametrize("dtype", list(FILES))
def test_exact_relu_decodes_as_dense(quantized, dtype):
    """Sparse decoding reads ``down_t``, the down projection re-encoded in Q8_0 (the engine's
    ``transposed_format``): close to dense, not equal; the batched path is the dense function."""
    model = load_model(quantized(dtype, activation="relu"))
    assert set(_matrix_types(model)) == FILES[dtype][2]
    ids = list(np.random.default_rng(10).integers(0, model.config.vocab_size, 12))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    assert rel(sparse.logits(ids), dense.logits(ids)) <= 1e-5
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05


@pytest.mark.parametrize("dtype", list(FILES))
def test_the_neuron_store_and_the_planner_take_it(quantized, tmp_path, dtype):
    """The neuron store holds the format's up rows and Q8_0 down_t rows: decoding through a
    cache of two clusters gives the resident engine's logits; ``info`` reports the format and
    a plan estimate (the planner's byte accounting of the format and its GPU conversion)."""
    model = load_model(quantized(dtype, activation="relu"))
    resident = Engine(model, threads=2, sparsity="exact-relu")
    stored = Engine(model, threads=2, sparsity="exact-relu")
    path = stored.write_neuron_store(tmp_path / "m.neurons", cluster=16)
    per_cluster = (os.path.getsize(path) - 4096) // (model.config.n_layers * 512 // 16)
    stored.use_neuron_store(path, cache=2 * per_cluster, io_threads=2)
    assert_same_decode(resident, stored, [5, 17, 123, 42], 6, 1e-4, f"{dtype} store")
    assert stored.neuron_store_stats()["misses"] > 0
    out = report(model, 1 << 20, "rtx4090", 256)
    assert dtype in out and "plan at --vram-budget" in out, out
