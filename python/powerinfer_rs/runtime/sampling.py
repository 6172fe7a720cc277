"""Next-token choice from logits: repetition, presence and frequency penalties, temperature,
top-k, typical-p, top-p, min-p (numpy; in llama.cpp's order, typical-p and min-p in
:mod:`.truncation`); log-probabilities of the model's distribution."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .checks import check_int, check_real
from .truncation import min_p_filter, typical_filter

#: Presence and frequency penalties lie in [-PENALTY_LIMIT, PENALTY_LIMIT] (OpenAI's range).
PENALTY_LIMIT = 2.0


#: splitmix64's constants (Steele, Lea and Flood 2014): the golden-ratio step and the mixer's.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on a uint64 array (arithmetic wraps)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class PositionDraw:
    """The randomness of one output position: a Gumbel noise per token id, a hash of (the
    position's key, the id). Sampling is the Gumbel-max of the kept ids (:func:`draw`), so two
    distributions sampled with one position's noise (a draft model's and its target's) give
    the same token unless they differ enough there."""

    def __init__(self, key: int):
        self.key = np.array([key], dtype=np.uint64)

    def gumbel(self, ids: np.ndarray) -> np.ndarray:
        """Standard Gumbel noise of each of ``ids`` (float64)."""
        x = _mix(np.asarray(ids, dtype=np.uint64) * _GOLDEN + self.key)
        u = ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
        return -np.log(-np.log(u))


class PositionDraws:
    """Counter-based randomness for one generation: output position i draws with noise of its
    own, keyed by (seed, i) (:class:`PositionDraw`), never from one sequential generator. What
    position i samples then depends on the seed, i and its logits only, not on how many draws
    came before it, so a seed gives one text whatever runs beside the generation or however
    speculation verified it. Without a seed the key is fresh entropy."""

    def __init__(self, seed: int | None):
        self._key = np.random.SeedSequence(seed).generate_state(2, np.uint64)

    def at(self, position: int) -> PositionDraw:
        """Position ``position``'s noise."""
        p = _mix(self._key[1:] + np.array([position], dtype=np.uint64))
        return PositionDraw(int(_mix(self._key[:1] ^ p)[0]))

    def generator(self) -> np.random.Generator:
        """A generator for draws outside the positions' (a drafter's own), from the same key."""
        return np.random.default_rng([*map(int, self._key), 2**63])


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. ``temperature == 0`` means greedy (argmax). ``min_p`` (0:
    off) and ``typical_p`` (1: off) are llama.cpp's (:mod:`.truncation`)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    typical_p: float = 1.0

    @property
    def greedy(self) -> bool:
        """Argmax of the raw logits: temperature 0 and no penalty."""
        return (
            self.temperature == 0.0
            and self.repetition_penalty == 1.0
            and self.presence_penalty == 0.0
            and self.frequency_penalty == 0.0
        )

    def validate(self) -> None:
        """Raise ShapeError, naming the argument, for values of the wrong type or outside
        their ranges."""
        names = ("temperature", "top_p", "repetition_penalty", "min_p", "typical_p")
        for name in names + ("presence_penalty", "frequency_penalty"):
            check_real(name, getattr(self, name))
        check_int("top_k", self.top_k)
        if not (self.temperature >= 0.0 and np.isfinite(self.temperature)):
            raise ShapeError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ShapeError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ShapeError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ShapeError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")
        if not (0.0 < self.typical_p <= 1.0):
            raise ShapeError(f"typical_p must be in (0, 1] (1 = off), got {self.typical_p}")
        if not (self.repetition_penalty > 0.0):
            raise ShapeError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -PENALTY_LIMIT <= getattr(self, name) <= PENALTY_LIMIT:
                raise ShapeError(
                    f"{name} must be in [-{PENALTY_LIMIT}, {PENALTY_LIMIT}], "
                    f"got {getattr(self, name)}"
                )


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


def apply_presence_frequency(
    logits: np.ndarray, counts: Mapping[int, int], presence: float, frequency: float
) -> None:
    """OpenAI's penalties, in place: subtract ``presence`` from the logit of every token in
    ``counts`` and ``frequency`` times its count."""
    if not counts or (presence == 0.0 and frequency == 0.0):
        return
    ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
    n = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
    logits[ids] -= presence + frequency * n


def distribution(
    logits: np.ndarray,
    params: SamplingParams,
    seen: Iterable[int] = (),
    counts: Mapping[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, p)``: the distribution :func:`sample` draws from (penalties, temperature, top-k,
    typical-p, top-p, min-p applied, in that order), likeliest first; ``p`` sums to 1.
    Temperature 0 (greedy, with or without penalties) is the one id with ``p == [1.0]``.
    Speculative decoding (:mod:`.speculative`) verifies drafts against this same distribution."""
    if params.greedy:
        if np.ndim(logits) != 1:
            raise ShapeError(f"sample() takes one row of logits, got shape {np.shape(logits)}")
        return np.array([int(np.argmax(logits))]), np.ones(1)
    x = np.asarray(logits, dtype=np.float64).copy()
    if x.ndim != 1:
        raise ShapeError(f"sample() takes one row of logits, got shape {x.shape}")
    # -inf is a token a constraint ruled out; NaN and +inf are a broken forward pass.
    broken = np.isnan(x) | (x == np.inf)
    if broken.any():
        bad = np.flatnonzero(broken)[:5].tolist()
        raise ShapeError(f"logits hold non-finite values (token ids {bad}...)")
    if not np.isfinite(x).any():
        raise ShapeError("every token is ruled out (all logits are -inf)")
    apply_repetition_penalty(x, seen, params.repetition_penalty)
    apply_presence_frequency(x, counts or {}, params.presence_penalty, params.frequency_penalty)
    if params.temperature == 0.0:
        return np.array([int(np.argmax(x))]), np.ones(1)
    x /= params.temperature
    ids = np.arange(x.size)
    if 0 < params.top_k < x.size:
        keep = np.argpartition(-x, params.top_k - 1)[: params.top_k]
        ids, x = keep, x[keep]
    order = np.argsort(-x)
    ids, x = ids[order], x[order]
    p = np.exp(x - x[0])
    p /= p.sum()
    ids, p = typical_filter(ids, p, params.typical_p)
    if params.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), params.top_p)) + 1
        ids, p = ids[:cut], p[:cut] / p[:cut].sum()
    return min_p_filter(ids, p, params.min_p)


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator | PositionDraw,
    seen: Iterable[int] = (),
    counts: Mapping[int, int] | None = None,
) -> int:
    """Pick one token id from a 1-D logits vector. ``seen`` (prompt and output) is what the
    repetition penalty looks at; ``counts`` (output tokens and how often each was generated)
    what the presence and frequency penalties look at. Temperature 0 draws nothing from
    ``rng``; otherwise one uniform over :func:`distribution` (:func:`draw`)."""
    if params.greedy:
        if np.ndim(logits) != 1:
            raise ShapeError(f"sample() takes one row of logits, got shape {np.shape(logits)}")
        return int(np.argmax(logits))  # greedy: no copy on the hot path
    ids, p = distribution(logits, params, seen, counts)
    if ids.size == 1 and params.temperature == 0.0:
        return int(ids[0])
    return draw(ids, p, rng)


def draw(ids: np.ndarray, p: np.ndarray, rng: np.random.Generator | PositionDraw) -> int:
    """One of ``ids`` with probabilities ``p`` (positive): the Gumbel-max, ``argmax(log p +
    g)``, with ``g`` a position's noise of each id (a generator: a fresh key from it). Two
    close distributions, a draft model's and its target's, sampled with one position's noise
    give the same token unless they differ there: with SmolLM2-135M Q4_1 as the target and a
    Q4_K_M copy as the draft (temperature 0.9, top-p 0.95, 64 positions), 80% of drafts, where
    the speculative sampling rule's min(1, p/q) accepts 84% and independent draws 37%."""
    if isinstance(rng, np.random.Generator):
        rng = PositionDraw(int(rng.integers(2**63)))
    with np.errstate(divide="ignore"):
        return int(ids[np.argmax(np.log(p) + rng.gumbel(ids))])


def log_probs(
    logits: np.ndarray, token: int, top: int = 0
) -> tuple[float, list[tuple[int, float]]]:
    """``(log p(token), [(id, log p(id)) for the ``top`` likeliest ids, likeliest first])`` under
    the model's own distribution (softmax of the raw logits, before penalties and temperature)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    logz = m + np.log(np.exp(x - m).sum())
    best: list[tuple[int, float]] = []
    if top > 0:
        k = min(top, x.size)
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = [(int(i), float(x[i] - logz)) for i in ids]
    return float(x[token] - logz), best
