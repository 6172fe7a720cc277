"""The speculative step of a generation (:class:`SpeculativeStep`): at each output position the
token taken (a drafted token accepted or replaced, or a plain sample), and the forward pass
after it (a plain one-token feed, or the token and the next drafts verified in one pass).
Without a drafter it is plain decoding. It runs on a :class:`~.context.Context` alone, so a
fake session and fake logits test it (tests/test_speculative_step.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .sampling import sample
from .speculative import Draft, Drafter, DraftLength, SamplingState, accept_or_replace

if TYPE_CHECKING:
    from .constrain import Constraint
    from .context import Claim, Context
    from .generation import GenerationStats
    from .stream_args import StreamArgs


class SpeculativeStep:
    """The drafts of one generation over ``ctx``: ``drafter`` (None: plain decoding) asked for
    up to ``draft_max`` tokens (the number adapts, :class:`~.speculative.DraftLength`, unless
    ``stats.speculative`` is "custom": a drafter object given is asked for ``draft_max`` every
    step), the drafts cut before the first one ``constraint`` refuses; ``stats`` counts what
    is drafted and accepted. Drafts never run past ``max_new_tokens`` output tokens nor past
    ``n_ctx`` positions.

    ``draft.tokens[pos]`` was drafted for the position being taken; ``rows`` are the last
    verification's logits (row j after draft j-1), so an accepted draft's next row is at hand
    without a pass; ``guess`` is a free drafter's guess at the next token at a plain step."""

    def __init__(
        self,
        ctx: Context,
        drafter: Drafter | None,
        draft_max: int,
        stats: GenerationStats,
        *,
        n_ctx: int,
        max_new_tokens: int,
        constraint: Constraint | None = None,
    ):
        self.ctx, self.drafter, self.stats, self.constraint = ctx, drafter, stats, constraint
        self.n_ctx, self.max_new_tokens = n_ctx, max_new_tokens
        self.length: DraftLength | None = None
        if drafter is not None:
            free = bool(getattr(drafter, "free", False))
            adaptive = stats.speculative != "custom"
            self.length = DraftLength(draft_max, free=free, adaptive=adaptive)
        self.draft = Draft([], [])
        self.pos = 0
        self.rows: np.ndarray | None = None
        self.guess: int | None = None
        self.accepted = False  # whether the last token taken was a draft accepted

    @classmethod
    def of(cls, ctx: Context, args: StreamArgs, n_ctx: int) -> SpeculativeStep:
        """The step of the stream ``args`` in ``ctx`` (``n_ctx`` positions)."""
        return cls(
            ctx,
            args.drafter,
            args.draft_max,
            args.stats,
            n_ctx=n_ctx,
            max_new_tokens=args.max_new_tokens,
            constraint=args.constraint,
        )

    def take(self, allowed: np.ndarray, state: SamplingState, i: int, claim: Claim) -> int:
        """The token of output position ``i`` from its (masked) logits ``allowed``: the draft
        there accepted or replaced (:func:`~.speculative.accept_or_replace`; at a replacement
        the context and the drafter are cut back to ``claim``'s tokens), else a plain sample."""
        length, self.accepted = self.length, False
        if self.pos < len(self.draft):
            token, self.accepted = accept_or_replace(allowed, self.draft.tokens[self.pos], state, i)
            if self.accepted:
                self.stats.accepted_tokens += 1
                if self.pos + 1 == len(self.draft) and length is not None:
                    length.update(len(self.draft), len(self.draft))
            else:
                if length is not None:
                    length.update(len(self.draft), self.pos)
                self.cut_back(claim)
                self.draft, self.pos, self.rows = Draft([], []), 0, None
        else:
            token = sample(allowed, state.params, state.draws.at(i), state.seen, state.counts)
            if self.guess is not None and length is not None:
                length.update(1, int(token == self.guess))
        self.guess = None
        return token

    def row_after(self, token: int, claim: Claim) -> np.ndarray | None:
        """The logits after ``token`` when the last verification computed them (an accepted
        draft that was fed): ``token`` joins ``claim``'s tokens, no pass needed. Else None."""
        if not (self.accepted and self.rows is not None and self.pos + 1 < len(self.rows)):
            return None
        claim.tokens.append(token)
        self.pos += 1
        return self.rows[self.pos]

    def forward(
        self, token: int, i: int, claim: Claim, state: SamplingState, others: Callable[[], int]
    ) -> np.ndarray:
        """Feed ``token``, output position ``i``, after ``claim``'s tokens (first bringing the
        context back to them when another call changed it), with the next drafts when they
        pay; the logits after it. ``others()``: the streams sharing the pass. Drafts: no more than
        tokens are left, nor than the context's room for what they verify (draft j is checked
        against the row after draft j-1); a last draft whose own row no later token could use
        is verified but not fed (if accepted, it is taken as a sampled token is)."""
        ctx, length = self.ctx, self.length
        left = self.max_new_tokens - i - 1
        room = min(self.n_ctx - len(claim.tokens), left)
        feed_max = min(self.n_ctx - len(claim.tokens) - 1, left - 1)
        history = claim.tokens + [token]
        state.position = i + 1  # what a drafter proposes now starts there
        with ctx.guarded():
            t_pass = time.perf_counter()
            proposal = self._proposal(history, room, state, others)
            if ctx.version != claim.version:  # another call used the context meanwhile
                logits = ctx.prefill(history)
                proposal, self.rows, self.guess = Draft([], []), None, None
            elif not proposal.tokens:
                t_feed = time.perf_counter()  # a free guess is not the step's
                logits, self.rows = ctx.feed([token]), None
                if length is not None:
                    length.timed(1, time.perf_counter() - t_feed)
            else:
                ids = [token] + proposal.tokens[:feed_max]
                self.rows = ctx.decode(ids)
                logits = self.rows[0]
                if length is not None:
                    length.timed(len(ids), time.perf_counter() - t_pass)
            claim.version = ctx.version
        self.draft, self.pos = proposal, 0
        if proposal.tokens:
            self.stats.verify_steps += 1
            self.stats.drafted_tokens += len(proposal)
        claim.tokens.append(token)
        return logits

    def _proposal(
        self, history: list[int], room: int, state: SamplingState, others: Callable[[], int]
    ) -> Draft:
        """The drafts to verify after ``history`` (none for a plain step, where a free drafter
        still guesses the next token, :attr:`guess`)."""
        length, drafter = self.length, self.drafter
        if length is None or drafter is None:
            return Draft([], [])
        want = length.want(others())
        if want == 0:
            length.plain_step()
            if length.free and room > 0:
                got = self._propose(history, 1, state, None)
                self.guess = got.tokens[0] if got.tokens else None
            return Draft([], [])
        if room <= 0:
            return Draft([], [])
        return self._propose(history, min(want, room), state, self.constraint)

    def _propose(
        self, history: list[int], k: int, state: SamplingState, constraint: Constraint | None
    ) -> Draft:
        """At most ``k`` drafted tokens continuing ``history``, cut before the first one
        ``constraint`` (at the state after ``history``) does not allow."""
        assert self.drafter is not None
        got = self.drafter.propose(history, k, state)
        proposal = Draft([int(t) for t in got.tokens[:k]], list(got.q[:k]))
        if constraint is not None and proposal.tokens:
            proposal = proposal.cut(constraint.valid_prefix(proposal.tokens))
        return proposal

    def cut_back(self, claim: Claim) -> None:
        """Drop the drafts past ``claim``'s tokens from the drafter and from the context (when
        the context is still the claim's)."""
        if self.drafter is not None:
            self.drafter.rewind(len(claim.tokens))
        self.ctx.cut_back_claim(claim)

    def close(self, claim: Claim) -> None:
        """At the generation's end: drafts past the last token taken may sit in the cache."""
        if self.draft.tokens:
            self.cut_back(claim)
