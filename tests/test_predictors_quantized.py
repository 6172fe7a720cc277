"""Predictor files in block formats (Q8_0, Q4_0): written as the engine reads them (the rank
padded to a multiple of 32), read back with the same bytes, counted by the planner at those
bytes, and run by the engine from them."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.formats.predictors import load_predictors, save_predictors, stored_tensors
from powerinfer_rs.loading import load_model
from powerinfer_rs.planning.predictor_size import predictor_set_sizes, read_predictor_sizes
from powerinfer_rs.predictors import LayerPredictor, PredictorSet
from powerinfer_rs.predictors.model import param_bytes, stored_form

RANK = 40  # not a multiple of 32: stored at 64


@pytest.fixture(scope="module")
def relu_model(synth_hf):
    return load_model(synth_hf(dtype="f32", activation="relu", ffn=256))


def predictor_set(model, dtype: str, threshold: float = 0.05) -> PredictorSet:
    rng = np.random.default_rng(1)
    c = model.config
    layers = {
        i: LayerPredictor(
            rng.normal(size=(RANK, c.dim)).astype(np.float32) / np.sqrt(c.dim),
            rng.normal(size=(c.ffn_dim, RANK)).astype(np.float32) / np.sqrt(RANK),
            threshold,
        )
        for i in range(c.n_layers)
    }
    return PredictorSet(layers=layers, model_fingerprint=model.fingerprint, dtype=dtype)


@pytest.mark.parametrize("dtype,block", [("Q8_0", 34), ("Q4_0", 18)])
def test_a_block_format_file_holds_the_engines_bytes(relu_model, tmp_path, dtype, block):
    c = relu_model.config
    pset = predictor_set(relu_model, dtype)
    path = save_predictors(tmp_path / "p.safetensors", pset)
    back = load_predictors(path)
    assert back.dtype == dtype and sorted(back.layers) == list(range(c.n_layers))
    for i, p in back.layers.items():
        t1, t2 = p.stored
        assert (t1.dtype, t1.rows, t1.cols) == (dtype, 64, c.dim)
        assert (t2.dtype, t2.rows, t2.cols) == (dtype, c.ffn_dim, 64)
        assert t1.nbytes == 64 * c.dim // 32 * block and t2.nbytes == c.ffn_dim * 64 // 32 * block
        # the values read are the padded, rounded ones; the bytes those a fresh quantization of
        # the in-memory predictor gives
        w1, w2 = stored_form(pset.layers[i].fc1, pset.layers[i].fc2, dtype)
        np.testing.assert_array_equal(p.fc1, w1)
        np.testing.assert_array_equal(p.fc2, w2)
        fresh = stored_tensors(pset.layers[i], dtype)
        for a, b in zip(fresh, p.stored):
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
        assert sum(t.nbytes for t in p.stored) == param_bytes(RANK, c.dim, c.ffn_dim, dtype)
    # the planner prices the file and the in-memory set at the stored bytes
    sizes = read_predictor_sizes(path, c)
    want = [[t.nbytes for t in back.layers[i].stored] for i in range(c.n_layers)]
    assert sizes.allocations == want and sizes.ranks == [64] * c.n_layers
    assert predictor_set_sizes(pset, c).allocations == want
    assert param_bytes(RANK, c.dim, c.ffn_dim, dtype) < param_bytes(RANK, c.dim, c.ffn_dim, "F16")


def test_the_engine_runs_block_predictors_as_stored(relu_model, tmp_path):
    ids = list(np.random.default_rng(5).integers(0, relu_model.config.vocab_size, 12))
    pset = predictor_set(relu_model, "Q8_0")
    eng = Engine(relu_model, threads=2, sparsity="predictor", predictors=pset)
    typed = eng._sparsity_args[1]["predictors"]
    assert typed.ranks == [64] * relu_model.config.n_layers  # the padded Q8_0 matrices
    from_file = Engine(
        relu_model,
        threads=2,
        sparsity="predictor",
        predictors=load_predictors(save_predictors(tmp_path / "q.safetensors", pset)),
    )
    np.testing.assert_array_equal(eng.logits(ids), from_file.logits(ids))
    # the same predictor as floats (its dequantized values): only masks at the threshold differ
    f32 = PredictorSet(
        layers={i: LayerPredictor(p.fc1, p.fc2, p.threshold) for i, p in load_predictors(
            tmp_path / "q.safetensors").layers.items()},
        model_fingerprint=relu_model.fingerprint,
        dtype="F32",
    )  # fmt: skip
    floats = Engine(relu_model, threads=2, sparsity="predictor", predictors=f32)
    a, b = eng.logits(ids), floats.logits(ids)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) < 0.05


def test_a_malformed_block_tensor_is_a_model_file_error(relu_model, tmp_path):
    from safetensors.numpy import save_file

    path = save_predictors(tmp_path / "p.safetensors", predictor_set(relu_model, "Q8_0"))
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    tensors["blk.0.fc1"] = tensors["blk.0.fc1"][:, :-1].copy()  # not whole blocks
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ModelFileError, match="U8"):
        load_predictors(tmp_path / "bad.safetensors")


def test_the_rank_cap_of_a_block_format_counts_its_bytes_a_rank():
    """A byte budget holds about twice the rank in Q8_0 as in F16 (34 bytes a 32 values against
    64), in whole blocks of 32: the rank search is not capped at one block."""
    from powerinfer_rs.predictors.sizing import rank_cap

    budget = 0.1 * 3 * 4096 * 11008 * 0.5625  # a tenth of a 7B layer's Q4_0 FFN
    f16, q8, q4 = (rank_cap(budget, 4096, 11008, dt) for dt in ("F16", "Q8_0", "Q4_0"))
    assert q8 % 32 == 0 and q4 % 32 == 0
    for cap, size in ((q8, 34), (q4, 18)):
        assert 64 / size * f16 - 32 <= cap <= 64 / size * f16  # the F16 rank's bytes, in blocks
    fits = [param_bytes(r, 4096, 11008, "Q8_0") <= budget for r in (q8, q8 + 32)]
    assert fits == [True, False]
