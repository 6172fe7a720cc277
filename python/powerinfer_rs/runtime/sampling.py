"""Next-token choice from logits: repetition penalty, temperature, top-k, top-p (numpy)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .checks import check_int, check_real


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    repetition_penalty: float = 1.0

    def validate(self) -> None:
        """Raise ShapeError, naming the argument, for values of the wrong type or outside
        their ranges."""
        for name in ("temperature", "top_p", "repetition_penalty"):
            check_real(name, getattr(self, name))
        check_int("top_k", self.top_k)
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ShapeError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ShapeError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ShapeError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (self.repetition_penalty > 0.0):
            raise ShapeError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


def apply_repetition_penalty(logits: np.ndarray, seen: Iterable[int], penalty: float) -> None:
    """Penalise tokens already seen, in place (CTRL paper rule: divide positive, multiply
    negative logits by ``penalty``)."""
    if penalty == 1.0:
        return
    ids = np.fromiter(set(seen), dtype=np.int64)
    if ids.size == 0:
        return
    vals = logits[ids]
    logits[ids] = np.where(vals > 0, vals / penalty, vals * penalty)


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    seen: Iterable[int] = (),
) -> int:
    """Pick one token id from a 1-D logits vector."""
    if params.temperature == 0.0 and params.repetition_penalty == 1.0:
        if np.ndim(logits) != 1:
            raise ShapeError(f"sample() takes one row of logits, got shape {np.shape(logits)}")
        return int(np.argmax(logits))  # greedy: no copy on the hot path
    x = np.asarray(logits, dtype=np.float64).copy()
    if x.ndim != 1:
        raise ShapeError(f"sample() takes one row of logits, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x))[:5].tolist()
        raise ShapeError(f"logits hold non-finite values (token ids {bad}...)")
    apply_repetition_penalty(x, seen, params.repetition_penalty)
    if params.temperature == 0.0:
        return int(np.argmax(x))
    x /= params.temperature
    ids = np.arange(x.size)
    if 0 < params.top_k < x.size:
        keep = np.argpartition(-x, params.top_k - 1)[: params.top_k]
        ids, x = keep, x[keep]
    order = np.argsort(-x)
    ids, x = ids[order], x[order]
    p = np.exp(x - x[0])
    p /= p.sum()
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), params.top_p)) + 1
        ids, p = ids[:cut], p[:cut] / p[:cut].sum()
    return int(ids[rng.choice(p.size, p=p)])
