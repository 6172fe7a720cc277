"""The speculative step (:class:`~powerinfer_rs.runtime.speculative_step.SpeculativeStep`) on
its own: a :class:`~powerinfer_rs.runtime.context.Context` over a fake session whose logits
say "the next token is the last one plus one", and drafters that propose given tokens. No
model, no engine: which tokens are taken, which passes run, what is cut back."""

from __future__ import annotations

import numpy as np

from powerinfer_rs.runtime.context import Claim, Context
from powerinfer_rs.runtime.generation import GenerationStats
from powerinfer_rs.runtime.sampling import PositionDraws, SamplingParams
from powerinfer_rs.runtime.speculative import Draft, SamplingState
from powerinfer_rs.runtime.speculative_step import SpeculativeStep

VOCAB = 32


def row(token: int) -> np.ndarray:
    """The fake model's logits after ``token``: ``token + 1`` is the likeliest."""
    out = np.zeros(VOCAB, dtype=np.float32)
    out[(token + 1) % VOCAB] = 10.0
    return out


class FakeSession:
    """A session that keeps its tokens and counts its passes (``feeds``, ``decodes``)."""

    n_ctx = 64

    def __init__(self):
        self.tokens: list[int] = []
        self.feeds = self.decodes = 0

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def feed(self, ids):
        self.feeds += 1
        self.tokens.extend(ids)
        return np.stack([row(ids[-1])])

    def decode(self, ids):
        self.decodes += 1
        self.tokens.extend(ids)
        return np.stack([row(t) for t in ids])

    def truncate(self, n: int) -> None:
        del self.tokens[n:]


class Given:
    """A drafter proposing ``tokens`` once; it records the rewinds it is told."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.rewinds = tokens, []

    def propose(self, history, k, state):
        got, self.tokens = self.tokens[:k], []
        return Draft(got, [None] * len(got))

    def rewind(self, n: int) -> None:
        self.rewinds.append(n)


def none() -> int:
    """No other stream shares the passes."""
    return 0


def started(drafter, max_new_tokens: int = 8):
    """A context holding the prompt [1, 2, 3], its claim, the step and a greedy state."""
    ctx = Context(FakeSession())
    logits = ctx.prefill([1, 2, 3])
    claim = Claim([1, 2, 3], ctx.version)
    stats = GenerationStats(speculative="custom")  # the drafter is asked for draft_max
    step = SpeculativeStep(ctx, drafter, 4, stats, n_ctx=64, max_new_tokens=max_new_tokens)
    state = SamplingState(SamplingParams(temperature=0.0), None, [1, 2, 3], {}, PositionDraws(0))
    return ctx, claim, step, state, logits


def run(ctx, claim, step, state, logits, n: int) -> list[int]:
    """The generation loop's use of the step for ``n`` tokens."""
    out = []
    for i in range(n):
        token = step.take(logits, state, i, claim)
        out.append(token)
        got = step.row_after(token, claim)
        logits = got if got is not None else step.forward(token, i, claim, state, none)
    return out


def test_accepted_drafts_need_no_pass_of_their_own():
    ctx, claim, step, state, logits = started(Given([5, 6, 7]))
    session = ctx.session
    passes = session.feeds + session.decodes
    assert run(ctx, claim, step, state, logits, 4) == [4, 5, 6, 7]
    # One pass: the verification that fed 4, 5, 6 and 7; each accepted draft's row was in it.
    assert session.decodes == 1 and session.feeds + session.decodes == passes + 1
    assert step.stats.drafted_tokens == 3 and step.stats.accepted_tokens == 3
    assert step.stats.verify_steps == 1
    assert claim.tokens == ctx.ids == session.tokens == [1, 2, 3, 4, 5, 6, 7]


def test_a_rejected_draft_cuts_the_context_and_the_drafter_back():
    drafter = Given([5, 9, 9])
    ctx, claim, step, state, logits = started(drafter)
    assert run(ctx, claim, step, state, logits, 3) == [4, 5, 6]
    assert step.stats.accepted_tokens == 1 and step.stats.drafted_tokens == 3
    # 9 was rejected at the third token: the cache held 4, 5, 9, 9; it is cut back to 4, 5
    # and 6 fed by a plain step.
    assert drafter.rewinds == [5]
    assert claim.tokens == ctx.ids == ctx.session.tokens == [1, 2, 3, 4, 5, 6]
    step.close(claim)
    assert ctx.ids == [1, 2, 3, 4, 5, 6]


def test_without_a_drafter_it_is_plain_decoding():
    ctx, claim, step, state, logits = started(None)
    assert run(ctx, claim, step, state, logits, 3) == [4, 5, 6]
    assert ctx.session.decodes == 0 and step.stats.drafted_tokens == 0
    assert ctx.ids == [1, 2, 3, 4, 5, 6]


def test_a_context_changed_by_another_call_is_brought_back_first():
    ctx, claim, step, state, logits = started(None)
    token = step.take(logits, state, 0, claim)
    ctx.prefill([7, 7, 7, 7])  # another generation used the context meanwhile
    logits = step.forward(token, 0, claim, state, none)
    assert ctx.ids == claim.tokens == [1, 2, 3, 4] and claim.version == ctx.version
    assert int(np.argmax(logits)) == 5


def test_drafts_stop_at_the_length_limit():
    ctx, claim, step, state, logits = started(Given([5, 6, 7]), max_new_tokens=2)
    token = step.take(logits, state, 0, claim)
    step.forward(token, 0, claim, state, none)
    # One token is left after 4: one draft verified (5, against the row after 4), none fed.
    assert step.stats.drafted_tokens == 1 and ctx.ids == [1, 2, 3, 4]
