"""Speculative decoding: draft several tokens, verify them in one forward pass, keep the ones
the target model would have produced.

A *drafter* proposes up to k tokens continuing the context: :class:`PromptLookup` copies what
followed the latest earlier occurrence of the context's last n-gram (no extra model), a
:class:`~.draft.DraftModel` runs a smaller model with the same tokenizer, and any object with
the :class:`Drafter` methods can stand in (tests force bad drafts that way).
:func:`decode_many` feeds the sampled token and the drafts after the cached context in one
pass; row i holds the logits after token i, exactly as one-token steps would give them.
:func:`accept_or_replace` takes at each position the token plain decoding samples there, with
that position's own generator (:class:`~.sampling.PositionDraws`), and accepts the draft when
it is that token: for one-hot drafts (prompt lookup) the speculative sampling rule (Leviathan
et al. 2023, Chen et al. 2023) itself, and for every drafter the plain text, token for token,
greedy or seeded.
:class:`DraftLength` adapts k to what is accepted. The step that drafts, verifies and accepts is
:class:`~.speculative_step.SpeculativeStep`, run by :meth:`~.generation.Generation._stream`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..errors import UnsupportedError
from .checks import check_int
from .sampling import PositionDraws, SamplingParams, sample

#: What ``speculative="auto"`` (the default of every generation call) runs when the engine has
#: no draft model: "lookup" or "off". The benchmark (benchmarks/) decides which pays.
DEFAULT_SPECULATIVE = "lookup"
#: The most tokens drafted per verification step when none is given (k adapts up to it).
DEFAULT_DRAFT_MAX = 8
#: The modes ``speculative=`` takes by name (None means "off").
SPECULATIVE_MODES = ("auto", "lookup", "draft", "off")

#: Prompt lookup matches the last n tokens, n from the longest to the shortest of these.
NGRAM_MAX = 3
NGRAM_MIN = 2
#: Prior of the acceptance estimate, as if ``PRIOR_TRIALS`` drafted tokens had been tried:
#: drafts of one token from the first step; a free drafter's guesses checked at plain steps
#: soon replace it.
PRIOR_FREE = 0.7
PRIOR_MODEL = 0.75
PRIOR_TRIALS = 2.0
#: The weight an observation keeps per newer one.
DECAY = 0.9
#: First guess of what one drafted token adds to a verification, in plain decode steps (the
#: generation then measures it: the verification's time against the plain steps').
DRAFT_COST = 0.5
#: Passes whose median gives the plain step's time and the cost of a drafted token.
COST_WINDOW = 9
#: After this many verifications in a row, one plain step (its time is what the cost is
#: measured against; a draft model that is accepted every time would otherwise never be timed
#: against plain decoding).
PLAIN_EVERY = 16
#: A draft is made only when its expected tokens per unit of time beat plain decoding by this.
MARGIN = 1.02
#: A drafter whose proposals are not free (a draft model) probes with one token after this many
#: plain steps, so a stretch where drafts did not pay is not the end of drafting; each probe
#: that finds nothing accepted doubles the wait, up to ``PROBE_WAIT_MAX``.
PROBE_WAIT = 8
PROBE_WAIT_MAX = 128


def decode_many(session: Any, ids: Sequence[int]) -> np.ndarray:
    """Float32 logits ``(len(ids), vocab)`` of ``ids`` fed after the session's cached context:
    row i is what ``session.feed([ids[i]])[0]`` would give after the tokens before it (the
    one-token path, bit for bit), from the core's ``Session.decode`` (one pass, shared weight
    reads). On an exception the cache is rolled back to where it was (by the core)."""
    return np.asarray(session.decode([int(t) for t in ids]))


@dataclass
class SamplingState:
    """What a position's distribution depends on besides its logits: the sampling parameters,
    the tokens seen (prompt and output, for the repetition penalty) and the output tokens'
    counts (presence and frequency penalties); and the randomness: ``draws``, each output
    position's own generator, ``position`` the output position a drafter's first token is
    proposed for, ``rng`` a generator for a drafter's draws of its own."""

    params: SamplingParams
    rng: np.random.Generator
    seen: list[int]
    counts: Mapping[int, int]
    draws: PositionDraws = field(default_factory=lambda: PositionDraws(None))
    position: int = 0


@dataclass
class Draft:
    """Proposed tokens and, per token, the full-vocabulary distribution a drafter drew it from
    or None. Verification reads only the tokens (:func:`accept_or_replace`); ``q`` stays for
    drafters that report it (the Drafter protocol's shape), and the built-in ones give None."""

    tokens: list[int]
    q: list[np.ndarray | None]

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, n: int) -> Draft:
        """The first ``n`` tokens."""
        return Draft(self.tokens[:n], self.q[:n])


class Drafter(Protocol):
    """Proposes tokens to verify. ``propose(history, k, state)`` gets the context (prompt and
    output so far, the sampled token to be fed last) and returns at most ``k`` tokens;
    ``rewind(n)`` says that only the first ``n`` tokens of the history stand (drafts beyond
    were rejected); a drafter with state of its own (a draft model's KV cache) cuts it back."""

    def propose(self, history: Sequence[int], k: int, state: SamplingState) -> Draft: ...

    def rewind(self, n: int) -> None: ...


class PromptLookup:
    """Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
    history's last n-gram (n from :data:`NGRAM_MAX` down to :data:`NGRAM_MIN`); nothing when
    no n-gram recurs. An index of every n-gram seen (n-gram -> where its latest continuation
    starts) grows with the history, so a proposal costs O(new tokens), not O(context): it is
    *free* (:class:`DraftLength` checks its guesses at plain steps too)."""

    free = True

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN):
        self.sizes = range(ngram_max, ngram_min - 1, -1)
        self._hist: list[int] = []
        self._at: dict[tuple[int, ...], int] = {}
        self._done = 0  # continuation starts indexed: 1.._done

    def _sync(self, history: Sequence[int]) -> None:
        n = len(self._hist)
        if len(history) < n or (n and history[n - 1] != self._hist[-1]):
            self._hist, self._at, self._done = [], {}, 0  # not an extension: start over
            n = 0
        self._hist.extend(int(t) for t in history[n:])

    def propose(self, history: Sequence[int], k: int, state: SamplingState | None = None) -> Draft:
        self._sync(history)
        h = self._hist
        end = len(h)
        # Index every n-gram that has a continuation (it ends before the last token), so
        # the history's own suffix never matches itself.
        for e in range(self._done + 1, end):
            for n in self.sizes:
                if e >= n:
                    self._at[tuple(h[e - n : e])] = e
        self._done = max(self._done, end - 1)
        if k <= 0:
            return Draft([], [])
        for n in self.sizes:
            if end >= n:
                start = self._at.get(tuple(h[end - n :]))
                if start is not None:
                    tokens = h[start : start + k]
                    return Draft(list(tokens), [None] * len(tokens))
        return Draft([], [])

    def rewind(self, n: int) -> None:
        """Nothing to do: the index holds only tokens of the history, which never shrinks
        within a generation."""


def accept_or_replace(
    logits: np.ndarray, draft: int, state: SamplingState, position: int
) -> tuple[int, bool]:
    """The token of output position ``position`` given a draft token there: the token plain
    decoding samples at that position (:func:`~.sampling.sample` of ``logits``, penalties as of
    this position, with the position's own generator ``state.draws.at(position)``), accepted
    when it is the draft (``(token, token == draft)``).

    For a one-hot draft (prompt lookup) that is the speculative sampling rule itself: the
    draft is accepted with probability p(draft), else the token is p without it. For a draft
    model it gives up some acceptance against the rule's ``min(1, p/q)`` (the draft model draws
    its tokens with the same positions' generators, so where q is close to p the two draws
    mostly agree), and in return the text is the plain decoding's, token for token under a
    seed, whatever was drafted: how many tokens are drafted follows measured timings, and
    with the rule's own draws the text would follow the machine's load."""
    token = sample(logits, state.params, state.draws.at(position), state.seen, state.counts)
    return token, token == draft


class DraftLength:
    """How many tokens to draft next (``k``): the length whose expected tokens per unit of
    time is best, 0 (decode plainly) when no length beats a plain step.

    A drafted token is accepted with probability ``a`` (estimated from every draft verified
    and, for a free drafter such as prompt lookup, from the drafter's guess at each plain
    step checked against the token then decoded: no verification needed, so text with
    nothing to copy never pays for finding that out). A draft of k tokens then gives
    ``1 + a + ... + a^k`` tokens per forward pass, at a cost of ``1 + c·k`` plain steps,
    where ``c`` (what one drafted token adds to a verification, the drafting included) is
    measured from the generation's own forward passes. Old evidence decays (:data:`DECAY`),
    so k follows the text from prose into a copied passage and back. Not ``adaptive`` (a
    drafter object the caller gave): ``draft_max`` tokens every step.

    Beside ``others`` streams decoding in the same batched pass (the server's slots), a drafted
    token costs every stream the time it adds to the pass, and a draft pays only where the
    pass's tokens per unit of time grow: ``others + 1 + a + ... + a^k`` against
    ``(others + 1)·(1 + c·k)`` (``c`` as this stream measures it: its own passes are the
    shared ones), so drafts there need a high acceptance (copying), and no probes are run."""

    def __init__(self, draft_max: int, free: bool = True, adaptive: bool = True):
        self.max = draft_max
        self.free = free
        self.adaptive = adaptive
        self.hits = (PRIOR_FREE if free else PRIOR_MODEL) * PRIOR_TRIALS
        self.trials = PRIOR_TRIALS
        self.cost = DRAFT_COST
        self._plain: list[float] = []  # recent plain steps' seconds
        self._costs: list[float] = []  # recent verifications' cost per drafted token
        self._since_plain = 0  # verifications since the last plain step was timed
        self._idle = 0  # plain steps since the last draft (drafters that are not free)
        self._wait = PROBE_WAIT  # plain steps before the next probe

    @property
    def acceptance(self) -> float:
        """The current estimate of a drafted token's acceptance probability."""
        return self.hits / self.trials

    def gain(self, k: int, others: int = 0) -> float:
        """Expected tokens per unit of time of a k-token draft, relative to plain decoding, in
        a pass shared with ``others`` streams decoding one token each."""
        a = self.acceptance
        tokens = others + sum(a**i for i in range(k + 1))
        return tokens / ((others + 1) * (1.0 + self.cost * k))

    def want(self, others: int = 0) -> int:
        """Tokens to draft now (0: decode plainly), ``others`` streams sharing the pass."""
        if self.max == 0 or not self.adaptive:
            return self.max
        if self._since_plain >= PLAIN_EVERY or (self._since_plain and not self._plain):
            return 0  # a plain step to time: the cost is relative to it
        k = max(range(1, self.max + 1), key=lambda k: self.gain(k, others))
        if self.gain(k, others) >= MARGIN:
            return k
        # A probe only where some draft could pay: with every token accepted, the longest.
        could_pay = (self.max + 1) / (1.0 + self.cost * self.max) >= MARGIN
        if not self.free and not others and self._idle >= self._wait and could_pay:
            return 1
        return 0

    def plain_step(self) -> None:
        """A token was decoded without a draft."""
        self._idle += 1

    def update(self, drafted: int, accepted: int) -> None:
        """A verification (or a plain step's free guess, ``drafted`` 1) of ``drafted`` tokens
        accepted ``accepted`` of them: ``accepted`` successes and, unless all were accepted,
        one failure (the tokens after the first rejection were never tried)."""
        if drafted == 0:
            return
        if not self.free:
            self._idle = 0
            self._wait = PROBE_WAIT if accepted else min(PROBE_WAIT_MAX, 2 * self._wait)
        trials = accepted + (accepted < drafted)
        keep = DECAY**trials
        self.hits = self.hits * keep + accepted
        self.trials = self.trials * keep + trials

    def timed(self, fed: int, seconds: float) -> None:
        """A forward pass of ``fed`` tokens took ``seconds`` (with a draft, its drafting
        included): one token, the plain step's time; more, what each token past the first adds
        (the cost ``c``)."""
        if seconds <= 0.0:
            return
        # Medians of the recent passes: one pass slowed by another process must not stop the
        # drafting (no verification then measures the cost again).
        if fed == 1:
            self._plain.append(seconds)
            del self._plain[:-COST_WINDOW]
            self._since_plain = 0
            return
        self._since_plain += 1
        if self._plain:
            per = (seconds / float(np.median(self._plain)) - 1.0) / (fed - 1)
            self._costs.append(per)
            del self._costs[:-COST_WINDOW]
            self.cost = min(2.0, max(0.02, float(np.median(self._costs))))


def resolve_speculative(
    speculative: str | Drafter | None, draft_max: int, draft_model: Any | None
) -> tuple[str, Drafter | None, int]:
    """``(mode, drafter, draft_max)`` of a generation's arguments: mode "off" (no drafter),
    "lookup" (a fresh :class:`PromptLookup`), "draft" (``draft_model``) or "custom" (a
    drafter object given). "auto" is "draft" when the engine has a draft model, else
    :data:`DEFAULT_SPECULATIVE`. Unknown modes and "draft" without a draft model are an
    :class:`UnsupportedError`; a bad ``draft_max`` a :class:`~..errors.ShapeError`."""
    draft_max = check_int("draft_max", draft_max, 0)
    if speculative is None:
        speculative = "off"
    if not isinstance(speculative, str):
        if not callable(getattr(speculative, "propose", None)):
            raise UnsupportedError(
                f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, None or a drafter "
                f"(an object with propose() and rewind()), got {speculative!r}"
            )
        return "custom", speculative, draft_max
    mode = speculative.strip().lower()
    if mode == "auto":
        mode = "draft" if draft_model is not None else DEFAULT_SPECULATIVE
    if mode not in SPECULATIVE_MODES:
        raise UnsupportedError(
            f"speculative must be one of {', '.join(SPECULATIVE_MODES)} or None, got "
            f"{speculative!r}"
        )
    if mode == "draft" and draft_model is None:
        raise UnsupportedError(
            "speculative='draft' needs a draft model: Engine.from_pretrained(..., draft=PATH)"
        )
    if mode == "off" or draft_max == 0:
        return "off", None, draft_max
    if mode == "lookup":
        return mode, PromptLookup(), draft_max
    return mode, draft_model, draft_max


def mode_of_flag(value: str) -> str:
    """The mode of a ``--speculative`` value: a mode name as it is, a draft model's path
    "draft"."""
    return value if value in SPECULATIVE_MODES else "draft"


def merged_counts(counts: Mapping[int, int], extra: Iterable[int]) -> dict[int, int]:
    """``counts`` with each token of ``extra`` counted once more (a copy)."""
    out = dict(counts)
    for t in extra:
        out[t] = out.get(t, 0) + 1
    return out
