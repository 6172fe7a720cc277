"""The lattice i-quants IQ3_XXS, IQ3_S, IQ1_S and IQ1_M end to end, on files written by
llama.cpp's own quantizer functions (``testing.ggml_quantizer``: ``ggml_quantize_chunk`` with an
importance matrix; one path for the four, since IQ1_S and IQ1_M need an importance matrix and
``llama_model_quantize`` cannot take one) from a synthetic one-layer F32 model, every matrix in
the format but the token embeddings (Q8_0):

- every tensor decodes (``_core.dequantize``) to gguf-py's values and to ggml's own
  ``to_float`` bit for bit;
- the largest per-position relative logit error against the float64 reference of the same
  weights is within llama.cpp's own, for the batched and the one-token kernels;
- exact-relu decodes as dense does on a ReLU model in the format (``down_t`` in Q8_0);
- ``info`` names the format and prices a plan; the neuron store decodes as the resident
  engine; the planner's plan runs on the GPU side (gpu-sim) with the rows converted to Q8_0 at
  upload (IQ1_M re-encoded), as the CPU engine decodes.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from llamacpp_check import format_errors
from test_hybrid import DEVICES, TOL_INT8, assert_close, assert_same_decode, greedy, plan_for

from powerinfer_rs import Engine, _core
from powerinfer_rs.loading import load_model

from _helpers import decode_logits, rel

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from powerinfer_rs.testing.ggml_quantizer import ggml_dequantize, quantize_gguf  # noqa: E402

DTYPES = ["IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
#: IQ1_M's GPU rows are a Q8_0 re-encoding of its weights (its scales are per 16, Q8_0's per
#: 32; crates/cuda/src/convert.rs): each weight within max|w| / 254 of its block, where the
#: CPU reads the file's. Measured: 3.5e-3 of the largest logit at the first step.
TOL_IQ1_M = 2e-2
#: Every matrix's rows whole 256-weight super-blocks; one layer, as IQ1's search takes about
#: 20 us per weight.
SHAPE = dict(dim=256, ffn=256, layers=1, heads=4, kv_heads=2, vocab=300)


def _types(dtype):
    """Every matrix in ``dtype`` (the output head included) but the token embeddings (Q8_0:
    one row read per token; their lattice decoding is the dequantize test's)."""
    return lambda name, shape: (
        None if len(shape) < 2 else "Q8_0" if name == "token_embd.weight" else dtype
    )


@pytest.fixture(scope="module")
def lattice(synth_gguf, tmp_path_factory):
    """``lattice(dtype, activation)`` -> a file of llama.cpp's quantizer, every matrix in
    ``dtype`` (cached: IQ1_S's search takes seconds)."""
    made = {}

    def make(dtype, activation="silu"):
        if (dtype, activation) not in made:
            src = synth_gguf("F32", activation=activation, seed=5, **SHAPE)
            dst = tmp_path_factory.mktemp(f"{dtype}_{activation}") / "model.gguf"
            made[dtype, activation] = quantize_gguf(src, dst, dtype, types=_types(dtype))
        return made[dtype, activation]

    return make


def _matrix_types(model) -> set:
    return {t.dtype for t in model.tensors.values() if t.rows > 1}


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_is_gguf_py_and_ggml_bit_for_bit(lattice, dtype):
    model = load_model(lattice(dtype))
    assert _matrix_types(model) == {dtype, "Q8_0"}
    checked = 0
    for t in model.tensors.values():
        if t.dtype != dtype:
            continue
        raw = np.asarray(t.data).reshape(t.rows, t.row_bytes)
        got = _core.dequantize(dtype, raw, t.cols)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[dtype])
        np.testing.assert_array_equal(got, want.astype(np.float32).reshape(t.rows, t.cols))
        ggml = ggml_dequantize(dtype, raw.tobytes(), t.rows * t.cols)
        np.testing.assert_array_equal(got.ravel(), ggml)
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_within_llama_cpps_distance_of_the_reference(lattice, dtype):
    path = lattice(dtype)
    model = load_model(path)
    batched, one, theirs = format_errors(path, model)
    assert max(batched, one) <= theirs, (batched, one, theirs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_relu_decodes_as_dense(lattice, dtype):
    """Sparse decoding reads ``down_t`` (the down projection transposed into Q8_0): close to
    dense, not equal; the batched path is the dense function."""
    model = load_model(lattice(dtype, "relu"))
    assert _matrix_types(model) == {dtype, "Q8_0"}
    ids = list(np.random.default_rng(10).integers(0, model.config.vocab_size, 12))
    dense = Engine(model, threads=2)
    sparse = Engine(model, threads=2, sparsity="exact-relu")
    assert rel(sparse.logits(ids), dense.logits(ids)) <= 1e-5
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_neuron_store_decodes_as_the_resident_engine(lattice, tmp_path, dtype):
    model = load_model(lattice(dtype, "relu"))
    resident = Engine(model, threads=2, sparsity="exact-relu")
    stored = Engine(model, threads=2, sparsity="exact-relu")
    path = stored.write_neuron_store(tmp_path / "model.neurons", cluster=4)
    size = os.path.getsize(path)
    stored.use_neuron_store(path, cache=size // 8, io_threads=2)
    assert_same_decode(resident, stored, [5, 17, 123, 42, 7], 6, 1e-4, f"{dtype} store")
    s = stored.neuron_store_stats()
    assert s["misses"] > 0 and s["bytes_read"] > 0, s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_plan_runs_them_as_q8_0_on_the_gpu_side(lattice, tmp_path, device, dtype):
    """No GPU kernels of their own: rows converted to Q8_0 at upload (crates/cuda/src/convert.rs,
    the sub-block scales rounded to f16), the plan counting the Q8_0 bytes (the engine checks
    them against its own); the hybrid decodes as the CPU engine."""
    assert _core.GPU_UPLOAD_AS[dtype] == "Q8_0"
    model = load_model(lattice(dtype, "relu"))
    # About 0.9 of the file's bytes as Q8_0 (34 bytes per 32 weights where these hold 12.25,
    # 13.75, 6.25 or 7): attention, output head and hot neurons on the GPU.
    per32 = {"IQ3_XXS": 12.25, "IQ3_S": 13.75, "IQ1_S": 6.25, "IQ1_M": 7.0}[dtype]
    path = plan_for(model, tmp_path / "t.safetensors", 0.9 * 34 / per32)
    cpu = Engine(model, threads=2, sparsity="exact-relu")
    hyb = Engine(model, threads=2, sparsity="exact-relu", plan=path, device=device)
    assert any(hyb.plan.attention) and hyb.plan.output
    assert all(len(h) for h in hyb.plan.hot_neurons)
    # The CPU's products take the int8 x (the fused kernels), the GPU's Q8_0 rows another x:
    # test_hybrid's TOL_INT8 (measured on gpu-sim: 4.5e-3 of the largest logit for IQ3_XXS,
    # 7.4e-3 for IQ3_S, 5.9e-3 for IQ1_S). The hybrid reads the CPU's greedy tokens: on random
    # weights a near-tie may fall either way between two numerics, and the decodes then part.
    tol = max(TOL_IQ1_M, TOL_INT8) if dtype == "IQ1_M" else TOL_INT8
    prompt = [5, 17, 123, 42, 7, 250]
    want, toks = greedy(cpu, prompt, 8)
    hyb.reset()
    got = [hyb.prefill(prompt)] + [hyb.prefill([t]) for t in toks]
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, tol, f"{device} {dtype} step {i}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_info_names_the_format_and_prices_a_plan(lattice, dtype):
    from powerinfer_rs.info import report

    model = load_model(lattice(dtype, "relu"))
    out = report(model, 2**20, "rtx4090", 256)
    assert re.search(rf"ffn_gate\s+{dtype}\s", out), out
    assert re.search(r"GPU\s+[\d.]+ (B|KiB|MiB):", out), out
