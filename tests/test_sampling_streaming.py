"""Sampling rules and streaming helpers, on hand-made inputs (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs.errors import ShapeError
from powerinfer_rs.runtime.sampling import (
    SamplingParams,
    apply_presence_frequency,
    apply_repetition_penalty,
    log_probs,
    sample,
)
from powerinfer_rs.runtime.streaming import IncrementalDecoder, StopMatcher


def test_greedy_is_argmax():
    logits = np.array([0.1, 3.0, -1.0, 2.9], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert sample(logits, SamplingParams(temperature=0.0), rng) == 1


def test_top_k_one_is_greedy_whatever_the_temperature():
    logits = np.linspace(-2, 2, 50).astype(np.float32)
    rng = np.random.default_rng(1)
    picks = {sample(logits, SamplingParams(temperature=5.0, top_k=1), rng) for _ in range(20)}
    assert picks == {49}


def test_top_p_keeps_only_the_nucleus():
    # p = softmax([5, 5, -10, ...]) puts ~all mass on ids 0 and 1.
    logits = np.full(100, -10.0)
    logits[[0, 1]] = 5.0
    rng = np.random.default_rng(2)
    picks = {sample(logits, SamplingParams(1.0, 0, 0.9), rng) for _ in range(200)}
    assert picks <= {0, 1} and len(picks) == 2


def test_sampling_follows_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    rng = np.random.default_rng(3)
    n = 20000
    counts = np.bincount(
        [sample(logits, SamplingParams(1.0, 0, 1.0), rng) for _ in range(n)], minlength=3
    )
    assert np.allclose(counts / n, [0.5, 0.3, 0.2], atol=0.015)


def test_seed_makes_sampling_reproducible():
    logits = np.random.default_rng(4).normal(size=1000)
    a = [sample(logits, SamplingParams(), np.random.default_rng(7)) for _ in range(5)]
    b = [sample(logits, SamplingParams(), np.random.default_rng(7)) for _ in range(5)]
    assert a == b


def test_repetition_penalty_divides_positive_multiplies_negative():
    x = np.array([2.0, -2.0, 1.0])
    apply_repetition_penalty(x, [0, 1], 2.0)
    assert x.tolist() == [1.0, -4.0, 1.0]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=-1),
        SamplingParams(top_k=-1),
        SamplingParams(top_p=0.0),
        SamplingParams(repetition_penalty=0.0),
    ],
)
def test_bad_params_raise(params):
    with pytest.raises(ShapeError):
        params.validate()


def test_stop_matcher_holds_back_partial_stops():
    m = StopMatcher(["<end>"])
    out = [m.push("Hello <e"), m.push("n"), m.push("d> after")]
    assert out == ["Hello ", "", ""]
    assert m.stopped
    m2 = StopMatcher(["<end>"])
    assert m2.push("a <e") == "a "
    assert m2.push("x") == "<ex"
    assert not m2.stopped and m2.flush() == ""


def test_stop_matcher_picks_the_earliest_stop():
    m = StopMatcher(["B", "A"])
    assert m.push("xxAyyB") == "xx"


def test_incremental_decoder_waits_for_whole_characters():
    # A toy byte-level "tokenizer": each id is one UTF-8 byte.
    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    text = "héllo → wörld ✓"
    dec = IncrementalDecoder(decode)
    pieces = [dec.add(b) for b in text.encode()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_presence_and_frequency_penalties_follow_openais_rule():
    x = np.array([3.0, 3.0, 3.0, 0.0])
    apply_presence_frequency(x, {0: 1, 1: 3}, presence=0.5, frequency=0.25)
    assert x.tolist() == [3.0 - 0.75, 3.0 - 1.25, 3.0, 0.0]


def test_penalties_change_the_greedy_choice():
    logits = np.array([2.0, 1.9, 0.0])
    rng = np.random.default_rng(0)
    assert sample(logits, SamplingParams(temperature=0.0), rng, counts={0: 1}) == 0
    params = SamplingParams(temperature=0.0, presence_penalty=0.2)
    assert not params.greedy
    assert sample(logits, params, rng, counts={0: 1}) == 1
    params = SamplingParams(temperature=0.0, frequency_penalty=0.06)
    assert sample(logits, params, rng, counts={0: 1}) == 0
    assert sample(logits, params, rng, counts={0: 2}) == 1


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [2.5, -2.01, float("nan"), "1"])
def test_penalties_outside_their_range_raise(name, value):
    with pytest.raises(ShapeError, match=name):
        SamplingParams(**{name: value}).validate()


def test_log_probs_are_the_log_softmax_of_the_raw_logits():
    logits = np.random.default_rng(5).normal(size=300).astype(np.float32) * 4
    ref = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    lp, top = log_probs(logits, 7, top=5)
    assert lp == pytest.approx(ref[7], abs=1e-9)
    assert [i for i, _ in top] == np.argsort(-ref)[:5].tolist()
    assert [v for _, v in top] == pytest.approx(np.sort(ref)[::-1][:5].tolist(), abs=1e-9)
    assert log_probs(logits, 7)[1] == []
