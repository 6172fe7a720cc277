"""Adaptive predictor sizing (PowerInfer §5.1): how wide a layer's predictor starts and may grow.

PowerInfer sizes each layer's predictor from that layer's *sparsity* and *skewness*: a layer
where few neurons fire, and where a few hot neurons carry most activations, is easy to predict
and gets a small predictor; a dense, flat layer needs a wider one. Here that is the starting
rank; training then doubles it until the validation targets are met, never past the layer's
byte budget (:func:`rank_cap`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import PlanError
from .model import param_bytes, stored_rank


@dataclass
class LayerActivity:
    """Activation statistics of one layer's samples."""

    active_fraction: float
    top10_share: float
    top20_share: float

    def as_dict(self) -> dict[str, float]:
        """Plain dict (JSON-able)."""
        return asdict(self)


def layer_activity(mask: np.ndarray) -> LayerActivity:
    """Sparsity and skewness of ``mask [n, ffn]``: mean active fraction and the share of all
    activations the top 10% / 20% most frequent neurons account for."""
    mask = np.asarray(mask, dtype=bool)
    counts = np.sort(mask.sum(axis=0))[::-1].astype(np.float64)
    total = counts.sum()
    ffn = counts.size
    if total == 0 or ffn == 0:
        return LayerActivity(0.0, 1.0, 1.0)
    return LayerActivity(
        active_fraction=float(total / mask.size),
        top10_share=float(counts[: max(1, ffn // 10)].sum() / total),
        top20_share=float(counts[: max(1, ffn // 5)].sum() / total),
    )


def initial_rank(activity: LayerActivity, min_rank: int = 16) -> int:
    """Starting rank from sparsity and skewness: ``min_rank`` for sparse, skewed layers
    (active fraction <= 10% and the top 20% of neurons carrying >= 60% of activations), twice
    that when only one holds, four times when neither does."""
    easy = int(activity.active_fraction <= 0.10) + int(activity.top20_share >= 0.60)
    return min_rank * (1 << (2 - easy))


def rank_cap(max_bytes: float, dim: int, ffn: int, dtype: str = "F16") -> int:
    """The widest rank whose predictor fits ``max_bytes`` (a block format: a multiple of 32,
    the ranks it stores); :class:`PlanError` if not even rank 1 does."""
    step = stored_rank(1, dtype)  # 32 for a block format, whose ranks come in blocks
    per_rank = param_bytes(step, dim, ffn, dtype) / step
    cap = int(max_bytes // per_rank) // step * step
    if cap < 1:
        raise PlanError(
            f"a predictor byte budget of {max_bytes:.0f} B per layer cannot hold even a rank-1 "
            f"predictor ({per_rank} B for dim {dim}, ffn {ffn}, {dtype})"
        )
    return cap
