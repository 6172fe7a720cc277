"""Speculative decoding (runtime/speculative.py, runtime/draft.py): the output is the model's.

Greedy decoding gives token for token (and logprob for logprob) what it gives without
speculation, on SmolLM2 and on synthetic models in every sparse mode, a mixture of experts and
a gpu-sim plan, with lookup drafts, a scripted drafter that proposes the right continuation
with planted wrong tokens (so both acceptance and rollback run) and a draft model. Sampling
keeps the distribution: a chi-square test of the first two sampled tokens against the exact
probabilities, with deliberately bad drafts (one-hot, drawn from a wrong q, and a draft model
of other weights). After rollbacks the context and the KV cache agree and the next call gives
what a fresh engine gives; a draft model of another vocabulary is a typed error; constrained
decoding is unchanged and drafts the grammar forbids are never verified; the command line and
both server APIs take the options.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import tokenizers

from powerinfer_rs import Engine
from powerinfer_rs.errors import ShapeError, TokenError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime import speculative as spec
from powerinfer_rs.runtime.draft import DraftMismatchError
from powerinfer_rs.runtime.sampling import PositionDraws, SamplingParams, distribution, sample
from powerinfer_rs.runtime.speculative import (
    DEFAULT_SPECULATIVE,
    Draft,
    DraftLength,
    PromptLookup,
    SamplingState,
    accept_or_replace,
    decode_many,
)
from powerinfer_rs.runtime.tokenizer import Tokenizer

from _helpers import small_moe

PROMPT = [3, 17, 41, 99, 150, 7]
#: Greedy tokens compared per synthetic case.
STEPS = 40
#: A chi-square p-value below this fails a distribution test (each test checks a few).
ALPHA = 1e-3
#: SmolLM2 prompts: one whose answer copies its input (lookup drafts are accepted), one that
#: does not.
COPY = (
    "Repeat this JSON exactly.\n"
    '{"name": "Ada Lovelace", "born": 1815, "field": "mathematics", "known_for": '
    '"the first published algorithm", "city": "London"}'
)
FREE = "Write a short poem about the sea."


# -- helpers -----------------------------------------------------------------------------------


class Scripted:
    """A drafter that proposes ``reference`` (the whole greedy sequence, prompt first) from
    where the history ends, every ``wrong``-th proposed token replaced by another one (so some
    drafts are accepted and some rejected); it records the rewinds it is told."""

    def __init__(self, reference: list[int], vocab: int, wrong: int = 3):
        self.reference, self.vocab, self.wrong = reference, vocab, wrong
        self.proposed = 0
        self.rewinds: list[int] = []

    def propose(self, history, k, state):
        n = len(history)
        if list(history) != self.reference[:n]:
            return Draft([], [])
        tokens = []
        for t in self.reference[n : n + k]:
            self.proposed += 1
            tokens.append((t + 1) % self.vocab if self.proposed % self.wrong == 0 else t)
        return Draft(tokens, [None] * len(tokens))

    def rewind(self, n):
        self.rewinds.append(n)


class Fixed:
    """A drafter proposing one token per call: ``pick(history, state)`` -> (token, q)."""

    def __init__(self, pick):
        self.pick = pick

    def propose(self, history, k, state):
        t, q = self.pick(history, state)
        return Draft([t], [q])

    def rewind(self, n):
        pass


def steps_of(stream) -> list[tuple]:
    """Every step of a stream (token, text, logprob, top logprobs) and how it finished."""
    out = [(s.token, s.text, s.logprob, tuple(s.top_logprobs)) for s in stream]
    return out + [(stream.stats.finish_reason, stream.stats.stop_sequence)]


def greedy_steps(eng, prompt, speculative, **kw) -> tuple[list[tuple], object]:
    kw = {"max_new_tokens": STEPS, "temperature": 0, "logprobs": 3, **kw}
    stream = eng.stream_tokens(prompt, speculative=speculative, **kw)
    got = steps_of(stream)
    assert eng.core_session.n_past == len(eng.context_ids)
    return got, stream.stats


def assert_same_greedy(eng, prompt, **kw) -> dict:
    """Greedy decoding of ``prompt`` is the same without speculation, with lookup drafts and
    with a scripted drafter (planted wrong tokens); returns each run's stats."""
    want, _ = greedy_steps(eng, prompt, "off", **kw)
    context = eng.context_ids
    tokens = [s[0] for s in want[:-1] if s[0] is not None]
    ids = eng.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    scripted = Scripted(ids + tokens, eng.config.vocab_size)
    stats = {}
    # "lookup" drafts where its policy expects a gain (timing-dependent); a PromptLookup given
    # as the drafter drafts at every step, so the lookup drafts surely go through verification.
    runs = (("lookup", "lookup"), ("eager", PromptLookup()), ("scripted", scripted))
    for name, how in runs:
        got, stats[name] = greedy_steps(eng, prompt, how, **kw)
        assert got == want, name
        assert eng.context_ids == context, name  # what the plain loop leaves
    s = stats["scripted"]
    assert s.accepted_tokens > 0 and s.drafted_tokens > s.accepted_tokens, s
    assert scripted.rewinds  # rejected drafts were rolled back
    return stats


def chi2_pvalue(x: float, df: int) -> float:
    """Upper tail of the chi-square distribution (Wilson-Hilferty; ample for a 1e-3 test)."""
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def chi2_test(counts: dict, probs: dict, n: int) -> float:
    """p-value of ``counts`` (n draws) against ``probs``; cells expected fewer than 5 times
    are pooled (and a draw outside the support fails outright)."""
    assert set(counts) <= set(probs), set(counts) - set(probs)
    big = [c for c in probs if probs[c] * n >= 5]
    rest = [c for c in probs if probs[c] * n < 5]
    obs = [counts.get(c, 0) for c in big] + [sum(counts.get(c, 0) for c in rest)]
    exp = [probs[c] * n for c in big] + [sum(probs[c] for c in rest) * n]
    cells = [(o, e) for o, e in zip(obs, exp) if e > 0]
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return chi2_pvalue(stat, len(cells) - 1)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relu(synth_gguf):
    return load_model(synth_gguf(dtype="F32", activation="relu"))


@pytest.fixture(scope="module")
def smol_engine(smol):
    return Engine(smol, threads=2)


# -- the parts ---------------------------------------------------------------------------------


def test_prompt_lookup_drafts_what_followed_the_latest_match():
    look = PromptLookup(ngram_max=3, ngram_min=2)
    h = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    # [1 2 3] last occurred at the start (3 tokens): continue with 4 5 9.
    assert look.propose(h, 3).tokens == [4, 5, 9]
    # The history grows: [6 2 3] never occurred before, [2 3] last did before the 6 (the
    # latest occurrence, not the first).
    h2 = h + [6, 2, 3]
    assert look.propose(h2, 2).tokens == [6, 2]
    assert look.propose(h2 + [7], 3).tokens == [8, 1, 2]  # [2 3 7] beats [3 7]: the same
    assert look.propose(h2 + [5, 5], 4).tokens == []  # [5 5] and [x 5 5] never occurred
    assert look.propose([1, 2, 3], 4).tokens == []  # a suffix never matches itself
    # A history that is not an extension of the last one starts the index over.
    assert PromptLookup().propose([5, 6, 5, 6], 2).tokens == [5, 6]
    assert look.propose([8, 9, 8, 9], 3).tokens == [8, 9]


def test_draft_length_follows_acceptance_and_cost():
    n = DraftLength(8)
    assert n.want() == 1  # the prior: a = 0.7 at half a step per drafted token
    assert DraftLength(8, free=False).want() >= 1
    n.update(1, 0)
    assert n.want() == 0  # a failure: not worth a draft until guesses come true
    for _ in range(12):  # guesses that come true: drafts pay, longer as the estimate grows
        n.update(1, 1)
    k = n.want()
    assert 1 < k <= 8 and n.gain(k) > spec.MARGIN
    n.update(8, 8)
    assert n.want() >= k
    n.timed(9, 0.018)  # a verification and no plain step timed yet: the next step is plain
    assert n.want() == 0
    n.timed(1, 0.010)  # plain steps of 10 ms, verifications of 9 tokens in 18 ms: c = 0.1
    for _ in range(spec.PLAIN_EVERY - 1):
        n.timed(9, 0.018)
    assert abs(n.cost - 0.1) < 0.02
    assert n.want() == 8  # cheap drafted tokens: the longest draft
    n.timed(9, 0.018)
    assert n.want() == 0  # PLAIN_EVERY verifications in a row: a plain step to time
    n.timed(1, 0.010)
    for _ in range(12):  # drafting that costs more than it saves (a draft model as slow as
        n.timed(9, 0.200)  # the target): no draft however much is accepted
    assert n.want() == 0
    for _ in range(30):  # guesses that fail: back to plain decoding
        n.update(1, 0)
    assert n.want() == 0
    n.update(0, 0)  # no proposal: nothing changes
    assert n.acceptance < 0.1
    assert DraftLength(0).want() == 0
    # Beside other streams in a shared pass (the server's slots), a draft costs them too: it
    # needs a high acceptance there, and a drafter that is not free never probes.
    o = DraftLength(8)
    for _ in range(12):
        o.update(1, 1)
    o.update(1, 0)  # a ~ 0.9: worth drafting alone, not beside three streams
    assert o.want() > 0 and o.want(others=3) == 0
    for _ in range(40):
        o.update(1, 1)  # a ~ 1 (copying), and drafted rows cheap against the shared pass
    o.timed(1, 0.030)
    o.timed(9, 0.036)  # c = 0.025: worth it even then
    assert o.want(others=3) > 0 and o.gain(o.want(others=3), 3) >= spec.MARGIN
    p = DraftLength(4, free=False)
    for _ in range(3 * spec.PROBE_WAIT_MAX):
        assert p.want(others=1) == 0
        p.plain_step()
    assert p.want() == 1
    # A drafter that is not free probes with one token after PROBE_WAIT plain steps, the wait
    # doubling after each failure.
    m = DraftLength(4, free=False)
    m.update(3, 0)  # a draft with nothing accepted: no length pays now

    def waited() -> int:
        n = 0
        while m.want() == 0:
            m.plain_step()
            n += 1
        return n

    assert waited() == 2 * spec.PROBE_WAIT
    assert m.want() == 1
    m.update(1, 0)  # the probe fails too
    assert waited() == 4 * spec.PROBE_WAIT
    m.update(1, 1)  # a probe accepted: the wait starts over (doubled by the next failure)
    m.update(1, 0)
    assert waited() == 2 * spec.PROBE_WAIT
    # Drafting that costs more than a plain step per drafted token (a draft model as slow as
    # the target) never pays, whatever is accepted: no more probes.
    m.timed(1, 0.010)
    m.timed(2, 0.030)
    for _ in range(3 * spec.PROBE_WAIT_MAX):
        assert m.want() == 0
        m.plain_step()


def test_accept_or_replace_gives_the_target_distribution():
    """The rule alone, many positions: p from a penalised, tempered, top-k logits row; drafts
    one-hot (lookup) and drawn from a wrong q (draft model); each position's token is the one
    plain sampling draws there, whatever the draft."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=12).astype(np.float32) * 1.5
    params = SamplingParams(temperature=0.9, top_k=6, top_p=1.0, repetition_penalty=1.3)
    draws = PositionDraws(11)
    state = SamplingState(params, rng, seen=[0, 1, 2], counts={}, draws=draws)
    ids, p = distribution(logits, params, state.seen, state.counts)
    probs = {int(i): float(x) for i, x in zip(ids, p)}
    draft_onehot = int(ids[1])
    q = np.zeros(12)
    q[ids[::-1]] = np.linspace(1, 2, ids.size)
    q[11 if 11 not in ids else 10] = 1.0  # a token the target never samples
    q /= q.sum()
    n = 6000
    for name, draw in (
        ("one-hot", lambda: (draft_onehot, None)),
        ("wrong q", lambda: (int(rng.choice(12, p=q)), q)),
    ):
        counts: dict[int, int] = {}
        accepted = 0
        for i in range(n):
            d, _ = draw()
            t, ok = accept_or_replace(logits, d, state, i)
            assert (t, ok) == (sample(logits, params, draws.at(i), state.seen), t == d)
            accepted += ok
            counts[t] = counts.get(t, 0) + 1
        assert 0 < accepted < n, name
        assert chi2_test(counts, probs, n) > ALPHA, (name, counts, probs)
    greedy = SamplingState(SamplingParams(temperature=0), rng, [], {})
    best = int(np.argmax(logits))
    assert accept_or_replace(logits, best, greedy, 0) == (best, True)
    assert accept_or_replace(logits, (best + 1) % 12, greedy, 1) == (best, False)


def test_decode_many_equals_one_token_steps(relu):
    a, b = Engine(relu, threads=2), Engine(relu, threads=2)
    a.prefill(PROMPT)
    b.prefill(PROMPT)
    rows = decode_many(a.core_session, [5, 9, 200])
    want = np.stack([b.prefill([t]) for t in (5, 9, 200)])
    assert rows.dtype == np.float32 and np.array_equal(rows, want)
    with pytest.raises(TokenError):
        decode_many(a.core_session, [1, 10**6])  # a bad id: the cache is rolled back
    assert a.core_session.n_past == len(PROMPT) + 3


# -- greedy: token for token -------------------------------------------------------------------


def test_smollm2_greedy_is_the_same_with_lookup(smol_engine):
    eng = smol_engine
    copy = eng.format_chat([{"role": "user", "content": COPY}])
    stats = assert_same_greedy(eng, copy, max_new_tokens=48)
    assert stats["lookup"].speculative == "lookup"
    s = stats["eager"]
    assert s.accepted_tokens >= 10, s
    assert s.tokens_per_verify_step > 1.5 and 0 < s.acceptance_rate <= 1
    free = eng.format_chat([{"role": "user", "content": FREE}])
    assert_same_greedy(eng, free, max_new_tokens=24)
    assert eng.stats()["speculative"] == "custom"


SEEDED = dict(temperature=0.9, top_p=0.95, seed=7)


def test_smollm2_a_seed_gives_the_plain_text_with_lookup_drafts(smol_engine):
    """Sampled (temperature 0.9, top-p 0.95, a seed): lookup drafts are verified and accepted,
    and the text is the one without speculation, token for token, as "auto" gives."""
    eng = smol_engine
    copy = eng.format_chat([{"role": "user", "content": COPY}])
    want = eng.generate(copy, max_new_tokens=48, speculative="off", **SEEDED)
    for how in ("auto", "lookup", PromptLookup()):
        s = eng.stream_tokens(copy, max_new_tokens=48, speculative=how, **SEEDED)
        assert "".join(step.text for step in s) == want, how
        if not isinstance(how, str):  # drafts at every step: surely verified
            assert s.stats.accepted_tokens > 0, s.stats
    free = eng.format_chat([{"role": "user", "content": FREE}])  # another seed, another text
    texts = {eng.generate(free, max_new_tokens=32, **dict(SEEDED, seed=s)) for s in (7, 8, 7)}
    assert len(texts) == 2


def test_a_seed_gives_one_text_with_every_drafter(relu, synth_gguf):
    """A draft model (the weights in Q4_0: its draws at a position are the target's, so most
    are accepted), lookup and a drafter that is always wrong: the text without speculation."""
    eng = Engine(relu, threads=2, draft=load_model(synth_gguf(dtype="Q4_0", activation="relu")))
    kw = dict(SEEDED, max_new_tokens=24, ignore_eos=True, draft_max=4)
    want = eng.generate(PROMPT, speculative="off", **kw)
    wrong = Fixed(lambda history, state: ((history[-1] + 1) % eng.config.vocab_size, None))
    for how in ("draft", eng.draft, "lookup", wrong):  # eng.draft: drafting at every step
        s = eng.stream_tokens(PROMPT, speculative=how, **kw)
        assert "".join(step.text for step in s) == want, how
        if how is eng.draft:  # most drafts pass: independent draws would pass few
            assert s.stats.accepted_tokens > s.stats.verify_steps, s.stats


def _plan(model, tmp_path) -> str:
    from test_hybrid import plan_for

    return plan_for(model, tmp_path / "plan.safetensors", 0.5)


MODES = ["dense", "exact-relu", "predictor", "threshold", "moe", "gpu-sim"]


@pytest.mark.parametrize("case", MODES)
def test_synthetic_greedy_and_seeded_are_the_same_in_every_mode(case, synth_gguf, relu, tmp_path):
    model, kw = relu, {"sparsity": case if case in ("dense", "exact-relu") else "dense"}
    if case == "predictor":
        from test_sparsity import random_predictors

        kw = {"sparsity": "predictor", "predictors": random_predictors(relu, rank=16, seed=3)}
    elif case == "threshold":
        model = load_model(synth_gguf(dtype="Q8_0", activation="silu", ffn=256, layers=3))
        kw = {"sparsity": "threshold", "thresholds": [0.01] * 3}
    elif case == "moe":
        model = small_moe(synth_gguf)
    elif case == "gpu-sim":
        kw = {"sparsity": "exact-relu", "plan": _plan(relu, tmp_path), "device": "gpu-sim"}
    eng = Engine(model, threads=2, **kw)
    assert eng.sparsity == kw["sparsity"]
    assert_same_greedy(eng, PROMPT)
    seeded = dict(SEEDED, max_new_tokens=16, ignore_eos=True)  # and sampled with a seed
    want = eng.generate(PROMPT, speculative="off", **seeded)
    vocab = eng.config.vocab_size
    always = Fixed(lambda history, state: ((history[-1] * 7 + 1) % vocab, None))  # verified
    for how in ("lookup", PromptLookup(), always):
        assert eng.generate(PROMPT, speculative=how, **seeded) == want, how
    if case == "gpu-sim":
        assert eng.gpu_info()["steps"] > 0  # the decode steps ran the plan's GPU side


def test_penalties_are_taken_as_of_each_position(relu):
    """Temperature 0 with penalties: each drafted position is judged with the penalty state
    after the tokens before it (an accepted draft counts for the next one)."""
    eng = Engine(relu, threads=2)
    assert_same_greedy(
        eng, PROMPT, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6
    )


def test_draft_model_greedy_is_the_same_and_keeps_in_step(synth_gguf, relu):
    other = load_model(synth_gguf(dtype="F32", activation="relu", seed=7))
    for draft, accepts in ((relu, True), (other, False)):
        eng = Engine(relu, threads=2, draft=draft)
        want, _ = greedy_steps(eng, PROMPT, "off")
        got, stats = greedy_steps(eng, PROMPT, "auto")  # auto: the draft model
        assert got == want and stats.speculative == "draft"
        assert stats.drafted_tokens > 0
        if accepts:  # the model drafting for itself
            assert stats.accepted_tokens > 0.9 * stats.drafted_tokens, stats
        else:
            assert stats.accepted_tokens < stats.drafted_tokens, stats
        # The draft's cache was cut back with the target's: it holds a prefix of what the
        # target left in its context, no drafts past it.
        ctx = list(eng.context_ids)
        held = eng.draft.ctx.ids
        assert eng.draft.n_past == len(held) <= len(ctx) and held == ctx[: len(held)]


# -- sampling: the distribution ------------------------------------------------------------------


def _pair_probabilities(eng, params) -> dict[tuple[int, int], float]:
    """Exact probability of each (first, second) sampled token pair after PROMPT."""
    first = eng.logits(PROMPT)[-1]
    ids1, p1 = distribution(first, params, PROMPT, {})
    out = {}
    for t1, a in zip(ids1.tolist(), p1):
        ids2, p2 = distribution(eng.logits(PROMPT + [t1])[-1], params, PROMPT + [t1], {t1: 1})
        for t2, b in zip(ids2.tolist(), p2):
            out[(t1, t2)] = float(a * b)
    return out


def test_sampling_keeps_the_distribution_with_bad_drafts(relu, synth_gguf):
    """The first two tokens sampled (temperature 1.3, top-k 4: 16 pairs), the second verified
    against a bad draft: one-hot on the second likeliest token, drawn from a q that reverses
    the target's order and puts mass outside its top-k, and a draft model (the weights in
    Q4_0, drawing from its own tempered top 4)."""
    params = SamplingParams(temperature=1.3, top_k=4, top_p=1.0)
    # The draft model: the same weights in Q4_0 (an unrelated model's top 4 seldom meets the
    # target's, so nothing would be accepted and only the residual rule would run).
    eng = Engine(relu, threads=2, draft=load_model(synth_gguf(dtype="Q4_0", activation="relu")))
    probs = _pair_probabilities(eng, params)
    second = {}
    for t1 in {a for a, _ in probs}:
        ids2, _ = distribution(eng.logits(PROMPT + [t1])[-1], params, PROMPT + [t1], {t1: 1})
        second[t1] = ids2.tolist()
    vocab = eng.config.vocab_size

    def one_hot(history, state):
        return second[history[-1]][1], None

    def wrong_q(history, state):
        q = np.zeros(vocab)
        q[second[history[-1]][::-1]] = [0.1, 0.15, 0.2, 0.25]
        q[(second[history[-1]][0] + 1) % vocab] += 0.3
        return int(state.rng.choice(vocab, p=q)), q

    n = 2500
    for name, how in (("one-hot", Fixed(one_hot)), ("wrong q", Fixed(wrong_q)), ("draft", "draft")):
        counts: dict[tuple[int, int], int] = {}
        drafted = accepted = 0
        for seed in range(n):
            s = eng.stream_tokens(
                PROMPT, max_new_tokens=2, temperature=1.3, top_k=4, top_p=1.0, seed=seed,
                speculative=how, ignore_eos=True,
            )  # fmt: skip
            pair = tuple(step.token for step in s)
            counts[pair] = counts.get(pair, 0) + 1
            drafted += s.stats.drafted_tokens
            accepted += s.stats.accepted_tokens
        assert drafted == n and 0 < accepted < n, (name, accepted)
        assert chi2_test(counts, probs, n) > ALPHA, (name, counts, probs)


# -- rollback and bookkeeping ------------------------------------------------------------------


def test_after_rejected_drafts_the_context_and_cache_agree(relu):
    eng = Engine(relu, threads=2)
    want, _ = greedy_steps(eng, PROMPT, "off")
    tokens = [s[0] for s in want[:-1]]
    scripted = Scripted(PROMPT + tokens, eng.config.vocab_size, wrong=2)
    stream = eng.stream_tokens(PROMPT, max_new_tokens=STEPS, temperature=0, speculative=scripted)
    got = []
    for step in stream:  # mid-stream too: the cache never holds what the context does not
        got.append(step.token)
        ctx = list(eng.context_ids)
        assert eng.core_session.n_past == len(ctx)
        # The tokens taken, then at most the drafts of the window being verified.
        assert ctx[: len(PROMPT) + len(got) - 1] == PROMPT + got[:-1]
        assert len(ctx) <= len(PROMPT) + len(got) + spec.DEFAULT_DRAFT_MAX
    assert got == tokens and stream.stats.drafted_tokens > stream.stats.accepted_tokens > 0
    assert list(eng.context_ids) == PROMPT + got[:-1]  # what the plain loop leaves
    # The next call gives what a fresh engine gives (sampled, so it draws from the rng too).
    kw = dict(max_new_tokens=12, temperature=0.9, seed=5, speculative="off")
    assert eng.generate([9, 8, 7, 6], **kw) == Engine(relu, threads=2).generate([9, 8, 7, 6], **kw)


@pytest.mark.parametrize("failure", ["drafter", "bad id"])
def test_a_failing_verification_leaves_the_context_consistent(relu, failure):
    """A drafter that raises, or drafts an id outside the vocabulary (the core refuses it
    within the verification pass): the error reaches the caller, the context and the cache
    agree, and the next call is a fresh engine's."""
    eng = Engine(relu, threads=2)
    calls = []

    def pick(history, state):
        calls.append(len(history))
        if len(calls) == 3:
            if failure == "drafter":
                raise KeyboardInterrupt
            return 10**6, None
        return history[-2], None

    with pytest.raises(KeyboardInterrupt if failure == "drafter" else TokenError):
        eng.generate(PROMPT, max_new_tokens=20, temperature=0, speculative=Fixed(pick))
    assert eng.core_session.n_past == len(eng.context_ids)
    kw = dict(max_new_tokens=12, temperature=0, speculative="lookup")
    assert eng.generate([9, 8, 7, 6], **kw) == Engine(relu, threads=2).generate([9, 8, 7, 6], **kw)


@pytest.mark.parametrize("limit", ["max", "stop", "eos", "context", "closed"])
def test_every_end_is_the_same(relu, limit, monkeypatch):
    """A window of accepted drafts that runs past the end: the output, the finish reason and
    the context left are those of the plain loop."""
    eng = Engine(relu, threads=2, n_ctx=32 if limit == "context" else None)
    kw: dict = {"max_new_tokens": 100 if limit == "context" else STEPS}
    full, _ = greedy_steps(eng, PROMPT, "off", **kw)
    tokens = [s[0] for s in full[:-1]]
    if limit == "max":
        kw["max_new_tokens"] = 13
    elif limit == "stop":
        kw["stop"] = [eng.tokenizer.decode(tokens[10:12])]
    elif limit == "eos":
        monkeypatch.setattr(eng.tokenizer, "eos_ids", [tokens[11], *eng.tokenizer.eos_ids])
    want, _ = greedy_steps(eng, PROMPT, "off", **kw)
    context = eng.context_ids
    if limit == "closed":  # the consumer stops reading: the generation ends where it was
        stream = eng.stream_tokens(
            PROMPT, temperature=0, speculative=Scripted(PROMPT + tokens, 300, wrong=50), **kw
        )
        for _ in range(7):
            next(stream)
        stream.close()
        assert eng.core_session.n_past == len(eng.context_ids)
        assert list(eng.context_ids) == PROMPT + tokens[:6]
        return
    drafter = Scripted(PROMPT + tokens, eng.config.vocab_size, wrong=50)
    got, stats = greedy_steps(eng, PROMPT, drafter, **kw)
    assert got == want and eng.context_ids == context
    assert stats.accepted_tokens > 0
    reason = {"max": "length", "stop": "stop", "eos": "eos", "context": "context"}[limit]
    assert want[-1][0] == reason


def test_interleaved_generators_each_get_their_text(relu):
    eng = Engine(relu, threads=2)
    a_want = eng.generate(PROMPT, max_new_tokens=20, temperature=0, speculative="off")
    b_want = eng.generate([5, 6, 5, 6, 5], max_new_tokens=20, temperature=0, speculative="off")
    a = eng.stream(PROMPT, max_new_tokens=20, temperature=0, speculative="lookup")
    b = eng.stream([5, 6, 5, 6, 5], max_new_tokens=20, temperature=0, speculative="lookup")
    got_a, got_b = [], []
    for x, y in zip(a, b):
        got_a.append(x)
        got_b.append(y)
    got_a.extend(a)
    got_b.extend(b)
    assert "".join(got_a) == a_want and "".join(got_b) == b_want
    assert eng.core_session.n_past == len(eng.context_ids)


# -- arguments and the draft model -------------------------------------------------------------


def test_modes_and_bad_arguments(relu):
    eng = Engine(relu, threads=2)
    s = eng.stream_tokens(PROMPT, max_new_tokens=2)
    assert s.stats.speculative == DEFAULT_SPECULATIVE
    assert eng.stream_tokens(PROMPT, speculative=None).stats.speculative == "off"
    assert eng.stream_tokens(PROMPT, draft_max=0).stats.speculative == "off"
    with pytest.raises(UnsupportedError, match="draft model"):
        eng.stream_tokens(PROMPT, speculative="draft")
    with pytest.raises(UnsupportedError, match="speculative must be"):
        eng.stream_tokens(PROMPT, speculative="medusa")
    with pytest.raises(UnsupportedError):
        eng.stream_tokens(PROMPT, speculative=3)
    with pytest.raises(ShapeError, match="draft_max"):
        eng.stream_tokens(PROMPT, draft_max=-1)


def _swapped_tokenizer(tok: Tokenizer, a: int, b: int) -> Tokenizer:
    """``tok`` with the strings of ids ``a`` and ``b`` exchanged (same size, other strings)."""
    data = json.loads(tok.inner.to_str())
    vocab = data["model"]["vocab"]
    sa = next(s for s, i in vocab.items() if i == a)
    sb = next(s for s, i in vocab.items() if i == b)
    vocab[sa], vocab[sb] = b, a
    inner = tokenizers.Tokenizer.from_str(json.dumps(data))
    return Tokenizer(inner, bos_id=tok.bos_id, eos_ids=list(tok.eos_ids), add_bos=False)


def test_a_draft_of_another_vocabulary_is_refused(synth_gguf, relu, tmp_path):
    bigger = synth_gguf(dtype="F32", activation="relu", vocab=320)
    with pytest.raises(DraftMismatchError, match="320 tokens"):
        Engine(relu, threads=2, draft=bigger)
    with pytest.raises(UnsupportedError):  # the typed error is an UnsupportedError
        Engine.from_pretrained(synth_gguf(dtype="F32", activation="relu"), draft=bigger)
    swapped = dataclasses.replace(relu, tokenizer=_swapped_tokenizer(relu.tokenizer, 200, 201))
    with pytest.raises(DraftMismatchError, match="token strings differ"):
        Engine(relu, threads=2, draft=swapped)
    ok = Engine(relu, threads=2, draft=str(synth_gguf(dtype="F32", activation="relu", seed=7)))
    assert ok.draft is not None
    ok.set_draft(None)
    assert ok.stream_tokens(PROMPT).stats.speculative == DEFAULT_SPECULATIVE


# -- constrained decoding ------------------------------------------------------------------------


def test_constrained_output_is_the_same_with_lookup(smol_engine):
    pytest.importorskip("llguidance")
    eng = smol_engine
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "born": {"type": "integer"},
            "field": {"type": "string"},
            "known_for": {"type": "string"},
            "city": {"type": "string"},
        },
        "required": ["name", "born", "field", "known_for", "city"],
        "additionalProperties": False,
    }
    prompt = eng.format_chat([{"role": "user", "content": COPY}])
    kw = dict(max_new_tokens=60, temperature=0, json_schema=schema, logprobs=2)
    want, _ = greedy_steps(eng, prompt, "off", **kw)
    got, _ = greedy_steps(eng, prompt, "lookup", **kw)
    assert got == want
    got, stats = greedy_steps(eng, prompt, PromptLookup(), **kw)  # drafts at every step
    assert got == want and stats.accepted_tokens > 5, stats
    text = "".join(s[1] for s in got[:-1])
    assert set(json.loads(text)) == set(schema["properties"])

    # Drafts the grammar forbids are cut before verification: a drafter proposing only
    # forbidden tokens never has a token verified.
    bad = eng.tokenizer.encode("\n\n\n", add_bos=False)[0]
    got, stats = greedy_steps(eng, prompt, Fixed(lambda h, s: (bad, None)), **kw)
    assert got == want and stats.drafted_tokens == 0


# -- command line and server ---------------------------------------------------------------------


def test_command_line_flags(synth_gguf, capfd):
    from powerinfer_rs.cli import _engine_options, _gen_kwargs, build_parser, main

    path = str(synth_gguf(dtype="F32", activation="relu"))
    p = build_parser()
    a = p.parse_args(["generate", "-p", "x", "--speculative", "lookup", "--draft-max", "4"])
    assert _gen_kwargs(a)["speculative"] == "lookup" and _gen_kwargs(a)["draft_max"] == 4
    assert _engine_options(a)["draft"] is None
    a = p.parse_args(["chat", "--speculative", path])
    assert _gen_kwargs(a)["speculative"] == "draft" and _engine_options(a)["draft"] == path
    a = p.parse_args(["serve", "--speculative", "off", "--draft-max", "2"])
    assert (a.speculative, a.draft_max) == ("off", 2)
    a = p.parse_args(["generate", "-p", "x"])
    assert _gen_kwargs(a)["speculative"] == "auto"
    for bad in (["--speculative", "/no/such/model.gguf"], ["--draft-max", "-1"]):
        with pytest.raises(SystemExit):
            p.parse_args(["generate", "-p", "x", *bad])
    capfd.readouterr()
    argv = ["generate", "-m", path, "-p", "hello", "-n", "12", "--temperature", "0", "-t", "2"]
    assert main([*argv, "--speculative", "off", "-q"]) == 0
    plain = capfd.readouterr().out
    assert main([*argv, "--speculative", path]) == 0
    out = capfd.readouterr()
    assert out.out == plain and "speculative draft" in out.err


def test_server_requests_take_the_fields(server):
    pytest.importorskip("openai")
    import openai

    c = server.client()
    msgs = [{"role": "user", "content": COPY}]
    texts = {}
    for mode in ("off", "lookup"):
        r = c.chat.completions.create(
            model="smollm2", messages=msgs, temperature=0, max_tokens=24,
            extra_body={"speculative": mode, "draft_max": 4},
        )  # fmt: skip
        texts[mode] = r.choices[0].message.content
        assert server.engine.last_stats.speculative == mode
    assert texts["off"] == texts["lookup"]
    bad = (({"speculative": "draft"}, "speculative"), ({"draft_max": -1}, "draft_max"))
    for body, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smollm2", prompt="hi", max_tokens=2, extra_body=body)
        assert param in str(e.value)
    with server.http() as h:
        r = h.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": msgs, "temperature": 0,
                  "speculative": "lookup", "draft_max": 3},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        assert server.engine.last_stats.speculative == "lookup"
        r = h.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": msgs, "speculative": "bogus"},
        )
        assert r.status_code == 400 and "speculative" in r.text


def test_server_default_comes_from_serve(smol):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from powerinfer_rs.server.app import create_app

    eng = Engine(smol, threads=2)
    with pytest.raises(UnsupportedError):
        create_app(eng, model_id="m", speculative="draft")
    app = create_app(eng, model_id="m", speculative="off", draft_max=3)
    body = {"model": "m", "prompt": "1, 2, 3, 1, 2, 3, 1, 2,", "max_tokens": 6, "temperature": 0}
    with TestClient(app) as client:
        assert client.post("/v1/completions", json=body).status_code == 200
        assert eng.last_stats.speculative == "off"
        r = client.post("/v1/completions", json={**body, "speculative": "lookup"})
        assert r.status_code == 200 and eng.last_stats.speculative == "lookup"
