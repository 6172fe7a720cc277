"""Bytes of the per-layer activation predictors the plan may put on the GPU.

A predictor is PowerInfer's bias-free low-rank MLP ``x -> ReLU(fc1 x) -> fc2``: ``fc1`` is
``[rank, dim]``, ``fc2`` is ``[ffn_dim, rank]``. Sizes come from a predictors file
(``blk.{i}.fc1`` / ``blk.{i}.fc2`` tensors in a ``.safetensors`` file), from a fixed per-layer
byte count (``--predictor-bytes``), or from the default estimate: f16 weights at rank
``r = max(64, ceil(ffn_dim / 64 / 64) * 64)`` (ffn_dim / 64 rounded up to a multiple of 64; 448
for a 28,672-neuron layer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFileError, ShapeError
from ..loading.types import BLOCK_LAYOUT, ModelConfig

#: Bytes per element of safetensors dtypes a predictor may use.
_ST_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1, "F8_E4M3": 1}


@dataclass
class PredictorSizes:
    """Per layer: the predictor's GPU allocations ``[fc1_bytes, fc2_bytes]`` and its rank."""

    allocations: list[list[int]]
    ranks: list[int]
    source: str = "default"

    def layer_bytes(self, layer: int) -> int:
        """Raw bytes of layer ``layer``'s predictor (unaligned)."""
        return sum(self.allocations[layer])

    def to_dict(self) -> dict:
        """JSON-ready form (recorded in the plan)."""
        return {"allocations": self.allocations, "ranks": self.ranks, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> PredictorSizes:
        """Inverse of :meth:`to_dict`."""
        return cls(
            [[int(b) for b in a] for a in d["allocations"]],
            [int(r) for r in d["ranks"]],
            str(d.get("source", "")),
        )


def default_rank(ffn_dim: int) -> int:
    """The default predictor rank for a layer of ``ffn_dim`` neurons."""
    return max(64, -(-ffn_dim // (64 * 64)) * 64)


def default_predictor_sizes(config: ModelConfig) -> PredictorSizes:
    """The default estimate: f16 ``fc1 [r, dim]`` and ``fc2 [ffn_dim, r]`` per layer."""
    r = default_rank(config.ffn_dim)
    alloc = [2 * r * config.dim, 2 * config.ffn_dim * r]
    return PredictorSizes([list(alloc) for _ in range(config.n_layers)], [r] * config.n_layers)


def fixed_predictor_sizes(config: ModelConfig, nbytes: int) -> PredictorSizes:
    """Every layer's predictor is one allocation of ``nbytes`` (``--predictor-bytes``)."""
    if nbytes < 0:
        raise ShapeError(f"predictor bytes must not be negative, got {nbytes}")
    r = default_rank(config.ffn_dim)
    return PredictorSizes(
        [[nbytes] for _ in range(config.n_layers)], [r] * config.n_layers, f"fixed {nbytes} B"
    )


def predictor_set_sizes(predictors, config: ModelConfig) -> PredictorSizes:
    """Sizes of a loaded :class:`~powerinfer_rs.predictors.model.PredictorSet` (a PowerInfer
    file's own predictors) as the engine holds them: ``fc1`` and ``fc2`` as the file stores them
    where they come in a block format (PowerInfer's Q4_0 predictors), else in the set's storage
    dtype. Every layer must have one."""
    from ..predictors.model import matrix_bytes, stored_rank

    allocs, ranks = [], []
    dt = predictors.dtype
    for i in range(config.n_layers):
        p = predictors.layers.get(i)
        if p is None:
            raise ModelFileError(f"layer {i} has no predictor")
        if p.stored is not None:
            allocs.append([int(t.nbytes) for t in p.stored])
        else:
            r = stored_rank(p.rank, dt)
            allocs.append([matrix_bytes(r, p.dim, dt), matrix_bytes(p.ffn, r, dt)])
        ranks.append(p.stored[0].rows if p.stored is not None else stored_rank(p.rank, dt))
    return PredictorSizes(allocs, ranks, "the file's own predictors")


def read_predictor_sizes(path: str | os.PathLike[str], config: ModelConfig) -> PredictorSizes:
    """Sizes from a predictors ``.safetensors`` file with ``blk.{i}.fc1`` / ``blk.{i}.fc2``.

    Reads only the header. Raises :class:`ModelFileError` when the file or a tensor is missing
    and :class:`ShapeError` when shapes do not match the model.
    """
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"{p}: no predictors file")
    allocs, ranks = [], []
    try:
        with safe_open(str(p), framework="numpy") as f:
            names = set(f.keys())
            block = BLOCK_LAYOUT.get((f.metadata() or {}).get("dtype", ""))
            if block is not None and block[0] == 1:
                block = None  # a float format
            for i in range(config.n_layers):
                sizes = []
                shapes = []
                for part in ("fc1", "fc2"):
                    name = f"blk.{i}.{part}"
                    if name not in names:
                        raise ModelFileError(f"{p}: tensor {name} is missing")
                    sl = f.get_slice(name)
                    shape = tuple(sl.get_shape())
                    dt = sl.get_dtype()
                    if dt not in _ST_ITEMSIZE or len(shape) != 2:
                        raise ModelFileError(f"{p}: {name} is {dt} {list(shape)}, expected 2-D")
                    sizes.append(shape[0] * shape[1] * _ST_ITEMSIZE[dt])
                    if block is not None:  # U8 [rows, row bytes] of a block format
                        shape = (shape[0], shape[1] // block[1] * block[0])
                    shapes.append(shape)
                (r1, c1), (r2, c2) = shapes
                if c1 != config.dim or r2 != config.ffn_dim or c2 != r1:
                    raise ShapeError(
                        f"{p}: layer {i} predictor shapes fc1 {[r1, c1]}, fc2 {[r2, c2]} do not "
                        f"fit dim={config.dim}, ffn_dim={config.ffn_dim}"
                    )
                allocs.append(sizes)
                ranks.append(r1)
    except (ModelFileError, ShapeError):
        raise
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise ModelFileError(f"{p}: cannot read predictors: {e}") from None
    return PredictorSizes(allocs, ranks, str(p))


__all__ = [
    "PredictorSizes",
    "default_predictor_sizes",
    "default_rank",
    "fixed_predictor_sizes",
    "read_predictor_sizes",
]
