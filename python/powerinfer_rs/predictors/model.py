"""The predictor of one layer and a set of them.

A predictor is PowerInfer's bias-free two-layer MLP: ``logits = fc2 @ relu(fc1 @ x)`` with
``fc1: [rank, dim]`` and ``fc2: [ffn, rank]`` (row-major, one output feature per row, the same
layout as ``torch.nn.Linear.weight``), and neuron ``j`` is predicted active when
``logits[j] >= threshold`` -- the raw logit, no sigmoid (PowerInfer compares the raw ``fc2``
output with ``sparse_pred_threshold``; see :mod:`powerinfer_rs.loading.powerinfer_gguf`).

``input`` says which vector ``x`` is: ``"ffn_norm"`` (the FFN input after the layer's RMSNorm,
what our profiler samples and our trainer fits) or ``"ffn_inp"`` (the residual stream before
that norm, what PowerInfer's own predictors take).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError

PREDICTOR_INPUTS: tuple[str, ...] = ("ffn_norm", "ffn_inp")
#: The float formats a predictor file stores its matrices in, by name.
STORAGE_DTYPES: dict[str, Any] = {"F16": np.float16, "F32": np.float32}
#: The block formats (ggml's, 32 values a block): stored as the engine reads them, a quarter or
#: an eighth of F16's bytes more or less; a row's length (``dim`` for ``fc1``, the rank for
#: ``fc2``) must be a multiple of 32, so ranks are padded up to one (zero rows, exact).
BLOCK_DTYPES: tuple[str, ...] = ("Q8_0", "Q4_0")
#: Every format a predictor may be stored in.
PREDICTOR_DTYPES: tuple[str, ...] = (*STORAGE_DTYPES, *BLOCK_DTYPES)
BLOCK = 32


@dataclass
class LayerPredictor:
    """One layer's predictor: ``fc1 [rank, dim]``, ``fc2 [ffn, rank]`` (float32 arrays holding
    exactly the values stored, e.g. already rounded to f16), ``threshold`` on the raw logit,
    and the training/validation ``stats``."""

    fc1: np.ndarray
    fc2: np.ndarray
    threshold: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    #: ``(fc1, fc2)`` as a file stores them in a block format (``TensorData``, e.g. PowerInfer's
    #: Q4_0 predictors), handed to the engine as they are: a token then reads those bytes, not
    #: the float copies'.  ``fc1``/``fc2`` hold their dequantized values.
    stored: tuple[Any, Any] | None = None

    def __post_init__(self) -> None:
        self.fc1 = np.ascontiguousarray(self.fc1, dtype=np.float32)
        self.fc2 = np.ascontiguousarray(self.fc2, dtype=np.float32)
        if self.fc1.ndim != 2 or self.fc2.ndim != 2 or 0 in self.fc1.shape + self.fc2.shape:
            raise ShapeError(
                f"predictor fc1 {self.fc1.shape} and fc2 {self.fc2.shape} must be non-empty 2-D"
            )
        if self.fc2.shape[1] != self.fc1.shape[0]:
            raise ShapeError(
                f"predictor rank mismatch: fc1 {self.fc1.shape} [rank, dim] vs fc2 "
                f"{self.fc2.shape} [ffn, rank]"
            )
        self.threshold = float(self.threshold)

    @property
    def rank(self) -> int:
        """Hidden width of the MLP."""
        return int(self.fc1.shape[0])

    @property
    def dim(self) -> int:
        """Input width (the model's hidden size)."""
        return int(self.fc1.shape[1])

    @property
    def ffn(self) -> int:
        """Output width (the layer's FFN neurons)."""
        return int(self.fc2.shape[0])

    def nbytes(self, dtype: str = "F16") -> int:
        """Bytes of ``fc1`` + ``fc2`` stored as ``dtype`` (one of :data:`PREDICTOR_DTYPES`)."""
        return param_bytes(self.rank, self.dim, self.ffn, dtype)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Raw logits ``[n, ffn]`` (or ``[ffn]`` for a 1-D ``x``), computed in float32."""
        x = np.asarray(x, dtype=np.float32)
        if x.shape[-1] != self.dim or x.ndim not in (1, 2):
            raise ShapeError(f"predictor input must be [..., {self.dim}], got {x.shape}")
        h = x @ self.fc1.T
        np.maximum(h, 0.0, out=h)
        return h @ self.fc2.T

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Boolean active mask: ``logits >= threshold``."""
        return self.logits(x) >= np.float32(self.threshold)


def _check_dtype(dtype: str) -> None:
    if dtype not in PREDICTOR_DTYPES:
        raise ShapeError(f"predictor dtype must be one of {PREDICTOR_DTYPES}, got {dtype!r}")


def stored_rank(rank: int, dtype: str) -> int:
    """The rank a predictor of ``rank`` is stored with in ``dtype`` (block formats: padded up
    to a multiple of 32)."""
    _check_dtype(dtype)
    return -(-rank // BLOCK) * BLOCK if dtype in BLOCK_DTYPES else rank


def matrix_bytes(rows: int, cols: int, dtype: str) -> int:
    """Bytes of a ``[rows, cols]`` matrix stored in ``dtype``."""
    from ..loading.types import row_bytes

    _check_dtype(dtype)
    return rows * row_bytes(dtype, cols)


def param_bytes(rank: int, dim: int, ffn: int, dtype: str = "F16") -> int:
    """Bytes of a rank-``rank`` predictor's two matrices in ``dtype`` (at its stored rank)."""
    r = stored_rank(rank, dtype)
    return matrix_bytes(r, dim, dtype) + matrix_bytes(ffn, r, dtype)


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to the storage ``dtype`` and back to float32 (a block format: through the
    engine's own quantizer, so the values are those the engine will compute with)."""
    if dtype in BLOCK_DTYPES:
        return np.asarray(dequantize_matrix(quantize_matrix(a, dtype), dtype, a.shape[1]))
    _check_dtype(dtype)
    return np.asarray(a, dtype=STORAGE_DTYPES[dtype]).astype(np.float32)


def quantize_matrix(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a [rows, cols]`` in block format ``dtype``: ``uint8 [rows, row bytes]``."""
    from .. import _core

    if a.shape[1] % BLOCK:
        raise ShapeError(f"{dtype} rows must hold a multiple of {BLOCK} values, got {a.shape[1]}")
    return _core.quantize(dtype, np.ascontiguousarray(a, dtype=np.float32))


def dequantize_matrix(q: np.ndarray, dtype: str, cols: int) -> np.ndarray:
    """float32 ``[rows, cols]`` of block-format bytes ``q``."""
    from .. import _core

    return np.asarray(_core.dequantize(dtype, np.ascontiguousarray(q), cols), dtype=np.float32)


def padded(fc1: np.ndarray, fc2: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(fc1, fc2)`` at the rank ``dtype`` stores (:func:`stored_rank`): zero rows of ``fc1``
    and zero columns of ``fc2`` added, which add nothing to a logit."""
    rank = fc1.shape[0]
    pad = stored_rank(rank, dtype) - rank
    if pad:
        fc1 = np.concatenate([fc1, np.zeros((pad, fc1.shape[1]), np.float32)])
        fc2 = np.concatenate([fc2, np.zeros((fc2.shape[0], pad), np.float32)], axis=1)
    return fc1, fc2


def stored_form(fc1: np.ndarray, fc2: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(fc1, fc2)`` as ``dtype`` stores them, as float32: :func:`padded`, then rounded."""
    return tuple(round_to(w, dtype) for w in padded(fc1, fc2, dtype))


@dataclass
class PredictorSet:
    """Predictors by layer index, with what they were made for.

    ``input`` is one of :data:`PREDICTOR_INPUTS`; ``recall_target`` is ``None`` for imported
    predictors whose training target is unknown. A mixture of experts has ``experts`` instead
    of ``layers``: a predictor per ``(layer, expert)`` over that expert's neurons, for the
    experts where one pays (the others run exact-relu).
    """

    layers: dict[int, LayerPredictor]
    model_fingerprint: str | None = None
    recall_target: float | None = None
    input: str = "ffn_norm"
    dtype: str = "F16"
    metadata: dict[str, Any] = field(default_factory=dict)
    experts: dict[tuple[int, int], LayerPredictor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input not in PREDICTOR_INPUTS:
            raise ShapeError(f"predictor input must be one of {PREDICTOR_INPUTS}, got {self.input}")
        if self.layers and self.experts:
            raise ShapeError("a predictor set holds per-layer or per-expert predictors, not both")
        dims = {p.dim for p in (*self.layers.values(), *self.experts.values())}
        if len(dims) > 1:
            raise ShapeError(f"predictors disagree on the input width: {sorted(dims)}")

    def __getitem__(self, layer: int) -> LayerPredictor:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers) + len(self.experts)

    def nbytes(self) -> int:
        """Total bytes of all predictors in the storage dtype."""
        every = (*self.layers.values(), *self.experts.values())
        return sum(p.nbytes(self.dtype) for p in every)
