"""The 2-bit lattice i-quants (IQ2_XXS, IQ2_XS, IQ2_S: 8 weights per codebook point with sign
bits, a 4-bit scale per 32 or 16 weights, in 256-weight blocks) end to end, on a file written
by llama.cpp's own quantizer functions with an importance matrix
(``testing.ggml_quantizer.quantize_gguf``; llama.cpp refuses these types without one) from a
synthetic F32 ReLU llama: the three formats in one file, rotated over the layers' matrices as
the mixed recipes (UD-Q2_K_XL, IQ2_M) mix them: each runs in attention, and IQ2_XXS and IQ2_XS
in gate/up, IQ2_XS and IQ2_S in down.

- every IQ2 tensor decodes (``_core.dequantize``) to gguf-py's values and ggml's own
  ``to_float`` bit for bit;
- the largest per-position relative logit error against the float64 reference of the same
  weights is within llama.cpp's own, for the batched and the one-token kernels;
- exact-relu decodes as dense does (the down pass reads ``down_t`` in Q8_0);
- the neuron store decodes as the resident engine, and a plan puts the IQ2 matrices on the GPU
  side as Q8_0 (converted at upload), decoding as the CPU engine.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from llamacpp_check import format_errors
from test_hybrid import DEVICES, assert_same_decode, plan_for

from powerinfer_rs import Engine, _core
from powerinfer_rs.loading import load_model

from _helpers import decode_logits, rel

llama_cpp = pytest.importorskip("llama_cpp")
gguf = pytest.importorskip("gguf")

from powerinfer_rs.testing.ggml_quantizer import ggml_dequantize, quantize_gguf  # noqa: E402

FORMATS = ("IQ2_XXS", "IQ2_XS", "IQ2_S")
#: Every matrix's rows whole 256-weight blocks; two layers (quantizing IQ2_S takes seconds).
SHAPE = dict(dim=256, ffn=256, layers=2, heads=4, kv_heads=2, vocab=300)
#: The layer matrices in the order the formats rotate over (gate and up share one: the GPU's
#: fused gate/up kernel reads one format, as the recipes keep them).
KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_down")


def rotated(name: str, shape: tuple[int, ...]) -> str | None:
    """Layer l's matrix of kind k in ``FORMATS[(k + 2l) % 3]``; embeddings and head kept F32."""
    parts = name.split(".")
    kind = "ffn_gate" if parts[-2:-1] == ["ffn_up"] else parts[-2]
    if len(shape) < 2 or parts[0] != "blk" or kind not in KINDS:
        return None
    return FORMATS[(KINDS.index(kind) + 2 * int(parts[1])) % 3]


@pytest.fixture(scope="module")
def iq2_path(synth_gguf, tmp_path_factory):
    src = synth_gguf("F32", activation="relu", seed=5, **SHAPE)
    dst = tmp_path_factory.mktemp("iq2") / "model.gguf"
    return quantize_gguf(src, dst, "IQ2_XXS", types=rotated)


@pytest.fixture(scope="module")
def iq2_model(iq2_path):
    return load_model(iq2_path)


def test_every_format_is_there_and_decodes_bit_for_bit(iq2_model):
    seen = set()
    for t in iq2_model.tensors.values():
        if t.dtype not in FORMATS:
            continue
        seen.add(t.dtype)
        raw = np.asarray(t.data).reshape(t.rows, t.row_bytes)
        got = _core.dequantize(t.dtype, raw, t.cols)
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t.dtype])
        np.testing.assert_array_equal(got, want.astype(np.float32).reshape(t.rows, t.cols))
        ggml = ggml_dequantize(t.dtype, raw.tobytes(), t.rows * t.cols)
        np.testing.assert_array_equal(got.ravel(), ggml)
    assert seen == set(FORMATS)


def test_logits_within_llama_cpps_distance_of_the_reference(iq2_path, iq2_model):
    model = iq2_model
    batched, one, theirs = format_errors(iq2_path, model)
    assert max(batched, one) <= theirs, (batched, one, theirs)


def test_exact_relu_decodes_as_dense(iq2_model):
    """Sparse decoding reads the gate/up rows by index in their IQ2 format and ``down_t`` in
    Q8_0 (no IQ2 encoder: crates/engine/src/transpose.rs): close to dense, not equal; the
    batched path is the dense function."""
    ids = list(np.random.default_rng(10).integers(0, iq2_model.config.vocab_size, 12))
    dense = Engine(iq2_model, threads=2)
    sparse = Engine(iq2_model, threads=2, sparsity="exact-relu")
    assert rel(sparse.logits(ids), dense.logits(ids)) <= 1e-5
    assert rel(decode_logits(sparse, ids), decode_logits(dense, ids)) <= 0.05


def test_the_neuron_store_decodes_as_the_resident_engine(iq2_model, tmp_path):
    resident = Engine(iq2_model, threads=2, sparsity="exact-relu")
    stored = Engine(iq2_model, threads=2, sparsity="exact-relu")
    path = stored.write_neuron_store(tmp_path / "model.neurons", cluster=4)
    per_cluster = (os.path.getsize(path) - 4096) // (SHAPE["layers"] * SHAPE["ffn"] // 4)
    stored.use_neuron_store(path, cache=3 * per_cluster, io_threads=2)
    assert_same_decode(resident, stored, [5, 17, 123, 42], 6, 1e-4, "IQ2 store")
    s = stored.neuron_store_stats(reset=True)
    assert s["misses"] > 0 and s["bytes_read"] > 0, s


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_puts_them_on_the_gpu_side_as_q8_0(iq2_model, tmp_path, device):
    """The planner counts the IQ2 matrices as the Q8_0 rows the upload converts them to (the
    engine checks the plan's bytes against its own), and the hybrid decodes as the CPU engine
    (Q8_0 exact for IQ2_XXS, within half a Q8_0 step for IQ2_XS/IQ2_S halves of two scales)."""
    assert dict(_core.GPU_UPLOAD_AS)["IQ2_S"] == "Q8_0"
    # 1.6 of the file's bytes as Q8_0 (the IQ2 matrices 4x as large there): attention, head and
    # part of the neurons.
    path = plan_for(iq2_model, tmp_path / "t.safetensors", 1.6)
    cpu = Engine(iq2_model, threads=2, sparsity="exact-relu")
    hyb = Engine(iq2_model, threads=2, sparsity="exact-relu", plan=path, device=device)
    assert all(hyb.plan.attention) and all(0 < len(h) < SHAPE["ffn"] for h in hyb.plan.hot_neurons)
    assert_same_decode(cpu, hyb, [5, 17, 123, 42, 7], 8, 2e-2, f"{device} IQ2")
