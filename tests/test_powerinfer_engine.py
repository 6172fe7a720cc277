"""A PowerInfer GGUF (magic "PWRI", predictors and ffn_down_t inside) loads and runs in predictor
mode, matching a numpy reference of PowerInfer's semantics: neuron active iff
fc2 · ReLU(fc1 · x) >= sparse_threshold, x the residual stream before the FFN norm."""

from __future__ import annotations

import dataclasses

import numpy as np

from powerinfer_rs import Engine
from powerinfer_rs.loading import TensorData
from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf

from conftest import SMALL
from reference import reference_forward

#: engine vs float64 reference with the same predictor masks.
REF_RTOL = 1e-3


def with_down_from_down_t(model):
    """The same model with ffn_down = ffn_down_t transposed, for the reference."""
    tensors = dict(model.tensors)
    for i in range(model.config.n_layers):
        t = tensors[f"blk.{i}.ffn_down_t"]
        down_t = t.data.view(np.float32).reshape(t.rows, t.cols)
        down = np.ascontiguousarray(down_t.T)
        tensors[f"blk.{i}.ffn_down"] = TensorData(
            f"blk.{i}.ffn_down", "F32", down.shape[0], down.shape[1], down.view(np.uint8).ravel()
        )
    return dataclasses.replace(model, tensors=tensors)


def test_pwri_gguf_runs_in_predictor_mode(tmp_path):
    path = write_powerinfer_gguf(
        tmp_path / "m.powerinfer.gguf",
        ranks=[8, 12],
        sparse_threshold=0.05,
        dtype="F32",
        predictor_dtype="F16",
        **SMALL,
    )
    eng = Engine.from_pretrained(path, threads=2)
    assert eng.sparsity == "predictor"
    pwri = load_powerinfer_gguf(path)
    preds = pwri.predictors
    assert preds.input == "ffn_inp" and pwri.sparse_threshold == np.float32(0.05)

    def mask(i, h, x, a):
        p = preds.layers[i]
        logits = np.maximum(x @ p.fc1.T.astype(np.float64), 0) @ p.fc2.T.astype(np.float64)
        return logits >= p.threshold

    ids = list(np.random.default_rng(3).integers(0, 300, 24))
    ref_model = with_down_from_down_t(pwri.model)
    ref, _ = reference_forward(ref_model, ids, ffn_mask=mask)
    dense_ref, _ = reference_forward(ref_model, ids)
    got = eng.logits(ids)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= REF_RTOL
    assert np.linalg.norm(ref - dense_ref) / np.linalg.norm(dense_ref) > 10 * REF_RTOL
    # One token at a time through the sparse decode kernels: the same function.
    eng.reset()
    rows = np.stack([eng.prefill([t]) for t in ids])
    assert np.linalg.norm(rows - ref) / np.linalg.norm(ref) <= REF_RTOL
    # Dense mode of the same file uses ffn_down rebuilt from ffn_down_t.
    eng.set_sparsity("dense")
    assert np.linalg.norm(eng.logits(ids) - dense_ref) / np.linalg.norm(dense_ref) <= REF_RTOL


def test_oracle_predictors_mark_exactly_the_firing_neurons(tmp_path):
    """The benchmark's oracle predictors (bench_powerinfer.py): in an F32 file, predictor mode
    gives the dense logits (every firing neuron marked, no other), so a benchmark figure on them
    is a sparse decode of exactly the active rows; the Q4_0 file (PowerInfer's quantized
    format, predictors included) loads and runs."""
    from powerinfer_rs.testing.powerinfer_files import oracle_predictors
    from powerinfer_rs.testing.synth_model import SynthSpec

    shape = dict(dim=128, ffn=352, layers=2, heads=4, kv_heads=4, vocab=300)
    spec = SynthSpec(**shape, activation="relu", max_context=512, active=0.1)
    preds = oracle_predictors(spec, rank=160)
    ids = list(np.random.default_rng(5).integers(0, 300, 24))
    for dtype in ("F32", "Q4_0"):
        path = write_powerinfer_gguf(
            tmp_path / f"{dtype}.gguf",
            **shape,
            predictors=preds,
            dtype=dtype,
            predictor_dtype=dtype,
            max_context=512,
        )
        eng = Engine.from_pretrained(path, threads=2)
        assert eng.sparsity == "predictor"
        # Q4_0 predictors reach the engine as stored (a token reads their Q4_0 bytes)
        stored = eng.predictors.layers[0].stored
        assert (stored is None) == (dtype == "F32")
        assert stored is None or [t.dtype for t in stored] == ["Q4_0", "Q4_0"]
        got = eng.logits(ids)
        eng.set_sparsity("dense")
        dense = eng.logits(ids)
        if dtype == "F32":
            np.testing.assert_allclose(got, dense, rtol=0, atol=1e-5)
        else:  # Q4_0 predictors round idx: a few neurons near 0 flip
            assert np.abs(got - dense).max() < 0.1 * np.abs(dense).max()
    # a random predictor of the same rank would not: the oracle is what makes the test pass
    rnd = Engine.from_pretrained(
        write_powerinfer_gguf(tmp_path / "rnd.gguf", **shape, ranks=160, dtype="F32"), threads=2
    )
    got = rnd.logits(ids)
    rnd.set_sparsity("dense")
    assert np.abs(got - rnd.logits(ids)).max() > 1e-3
