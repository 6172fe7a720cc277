"""The typed boundary into Rust: exception classes made once in the extension, sparsity modes
named once, predictors handed over as one object (fc2 transposed in Rust), plans read once."""

from __future__ import annotations

import numpy as np
import pytest

import powerinfer_rs
from powerinfer_rs import Engine, _core, errors
from powerinfer_rs.cli import build_parser
from powerinfer_rs.loading import load_model


def test_exception_classes_are_the_extensions(small_relu):
    builtin = {"VramBudgetError": MemoryError, "CudaError": RuntimeError}
    builtin["InternalError"] = RuntimeError
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert cls is getattr(_core, name) is getattr(powerinfer_rs, name)
        assert cls.__module__ == "powerinfer_rs.errors" and cls.__doc__
        if name != "PowerInferError":
            assert issubclass(cls, errors.PowerInferError)
            assert issubclass(cls, builtin.get(name, ValueError)), name
    # An error raised in Rust is caught as the Python-visible class.
    with pytest.raises(errors.UnsupportedError, match="choose dense, exact-relu"):
        Engine(small_relu, threads=1).set_sparsity("sparse")


def test_sparsity_modes_are_named_once():
    assert _core.SPARSITY_MODES == ("dense", "exact-relu", "threshold", "predictor", "input")
    assert _core.INPUT_SITES == ("attn_in", "attn_out", "ffn_in", "down_in")
    args = build_parser().parse_args(["generate", "-p", "x", "--sparsity", "exact-relu"])
    assert args.sparsity == "exact-relu"
    for mode in _core.SPARSITY_MODES:
        assert build_parser().parse_args(["chat", "--sparsity", mode]).sparsity == mode
    with pytest.raises(SystemExit):
        build_parser().parse_args(["chat", "--sparsity", "sparse"])


def test_predictors_are_one_typed_object(small_relu):
    cfg = small_relu.config
    rng = np.random.default_rng(0)
    rank = 7
    fc1 = [rng.standard_normal((rank, cfg.dim)).astype(np.float32) for _ in range(cfg.n_layers)]
    fc2 = [rng.standard_normal((cfg.ffn_dim, rank)).astype(np.float16) for _ in fc1]
    p = _core.Predictors(fc1, fc2, [0.0] * cfg.n_layers, "ffn_inp")
    assert (p.n_layers, p.ranks, p.input) == (cfg.n_layers, [rank] * cfg.n_layers, "ffn_inp")
    sess = _core.Session(Engine(small_relu, threads=1).core_model, 1, 16)
    sess.set_sparsity("predictor", predictors=p)
    assert sess.sparsity == "predictor"
    with pytest.raises(errors.PlanError):  # fc2's rank differs from fc1's
        _core.Predictors(fc1, [f[:, :-1].copy() for f in fc2], [0.0] * cfg.n_layers)
    with pytest.raises(errors.ShapeError):  # the arrays are borrowed, not copied
        _core.Predictors([f.T.T[:, ::2] for f in fc1], fc2, [0.0] * cfg.n_layers)
    with pytest.raises(errors.PlanError):  # one list short
        _core.Predictors(fc1, fc2[:-1], [0.0] * cfg.n_layers)
    with pytest.raises(errors.UnsupportedError):
        _core.Predictors([f.astype(np.float64) for f in fc1], fc2, [0.0] * cfg.n_layers)
    with pytest.raises(errors.UnsupportedError):
        _core.Predictors(fc1, fc2, [0.0] * cfg.n_layers, "residual")
    with pytest.raises(errors.PlanError):
        sess.set_sparsity("predictor")


@pytest.fixture(scope="module")
def small_relu(synth_gguf):
    return load_model(synth_gguf(dtype="F32", activation="relu"))
