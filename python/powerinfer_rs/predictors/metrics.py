"""Recall / precision of a predicted mask and the per-layer threshold tuning.

Counts pool all (token, neuron) pairs of a layer: ``recall = TP / (TP + FN)`` is the share of
actual activations the predictor catches (a miss silently drops a neuron's contribution, so
recall is the quality that matters), ``precision = TP / (TP + FP)`` the share of predicted
rows that were really needed (wasted reads), ``predicted_fraction`` the share of all neurons
the engine will read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ShapeError


@dataclass
class MaskStats:
    """Pooled confusion counts of a predicted mask against the true one."""

    recall: float
    precision: float
    predicted_fraction: float
    active_fraction: float
    n: int

    def as_dict(self) -> dict[str, float]:
        """Plain dict (JSON-able)."""
        return asdict(self)


def mask_stats(pred: np.ndarray, true: np.ndarray) -> MaskStats:
    """Pooled recall, precision and active fractions of boolean ``pred`` vs ``true``."""
    pred = np.asarray(pred, dtype=bool)
    true = np.asarray(true, dtype=bool)
    if pred.shape != true.shape:
        raise ShapeError(f"mask shapes differ: {pred.shape} vs {true.shape}")
    tp = int(np.count_nonzero(pred & true))
    n_pred = int(np.count_nonzero(pred))
    n_true = int(np.count_nonzero(true))
    size = max(1, true.size)
    return MaskStats(
        recall=tp / n_true if n_true else 1.0,
        precision=tp / n_pred if n_pred else 1.0,
        predicted_fraction=n_pred / size,
        active_fraction=n_true / size,
        n=int(true.shape[0]) if true.ndim else 0,
    )


def tune_threshold(logits: np.ndarray, true: np.ndarray, recall: float) -> float:
    """The largest threshold ``t`` with pooled recall of ``logits >= t`` at least ``recall``.

    With ``P`` positives, at most ``k = floor((1 - recall) * P)`` may be missed, so ``t`` is
    the ``k``-th smallest positive logit (0-based): every positive at or above it is kept. If
    there are no positives any threshold has recall 1; the largest logit plus one is returned
    (nothing predicted). The result is rounded down to float32 so the engine, comparing in
    float32, keeps the same positives.
    """
    if not 0.0 < recall <= 1.0:
        raise ShapeError(f"recall target must lie in (0, 1], got {recall}")
    logits = np.asarray(logits, dtype=np.float32)
    true = np.asarray(true, dtype=bool)
    if logits.shape != true.shape:
        raise ShapeError(f"logits {logits.shape} and mask {true.shape} differ")
    pos = logits[true]
    if pos.size == 0:
        return float(logits.max()) + 1.0 if logits.size else 0.0
    k = int(np.floor((1.0 - recall) * pos.size + 1e-9))
    k = min(k, pos.size - 1)
    t = np.partition(pos, k)[k]
    return float(np.float32(t))
