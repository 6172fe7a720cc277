"""``min_p`` and ``typical_p`` against a numpy transcription of llama.cpp's samplers
(``llama_sampler_min_p_apply``, ``llama_sampler_typical_apply``, ``llama_sampler_top_p_apply``
in src/llama-sampling.cpp, min_keep 0) on fixed logits: which tokens survive, in which order,
with which renormalised probabilities (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs.errors import ShapeError
from powerinfer_rs.runtime.sampling import SamplingParams, distribution, sample

#: 12 logits with distinct probabilities, a long tail and a clear head.
LOGITS = np.array([2.0, 1.5, 1.4, 0.3, -0.2, 3.1, -1.0, 0.9, -3.0, 2.6, -0.7, 0.0])


def softmax(cands: list[tuple[int, float]]) -> list[tuple[int, float, float]]:
    """llama.cpp's softmax of candidates (id, logit): sorted by logit, each with its p."""
    cands = sorted(cands, key=lambda c: -c[1])
    m = cands[0][1]
    e = [np.exp(v - m) for _, v in cands]
    z = sum(e)
    return [(i, v, q / z) for (i, v), q in zip(cands, e)]


def ref_min_p(cands, min_p):
    """Keep the tokens whose logit is at least max_logit + log(min_p)."""
    if min_p <= 0:
        return cands
    best = max(v for _, v in cands)
    kept = [(i, v) for i, v in cands if v >= best + np.log(min_p)]
    return kept or cands


def ref_typical(cands, p):
    """Sort by |-log p - H|, keep until the running sum first exceeds p (that one included)."""
    if p >= 1.0:
        return cands
    sp = softmax(cands)
    h = -sum(q * np.log(q) for _, _, q in sp)
    order = sorted(range(len(sp)), key=lambda k: abs(-np.log(sp[k][2]) - h))
    cum, last = 0.0, len(order)
    for n, k in enumerate(order):
        cum += sp[k][2]
        if cum > p:
            last = n + 1
            break
    return [(sp[k][0], sp[k][1]) for k in order[:last]]


def ref_top_p(cands, p):
    if p >= 1.0:
        return cands
    sp = softmax(cands)
    cum = 0.0
    for n, (_, _, q) in enumerate(sp):
        cum += q
        if cum >= p:
            return [(i, v) for i, v, _ in sp[: n + 1]]
    return [(i, v) for i, v, _ in sp]


def ref_top_k(cands, k):
    return sorted(cands, key=lambda c: -c[1])[:k] if 0 < k < len(cands) else cands


def reference(logits, top_k=0, typical_p=1.0, top_p=1.0, min_p=0.0):
    """llama.cpp's chain top-k, typical, top-p, min-p, then the softmax the dist sampler uses:
    ``(ids likeliest first, their p)``."""
    cands = [(i, float(v)) for i, v in enumerate(logits)]
    cands = ref_min_p(ref_top_p(ref_typical(ref_top_k(cands, top_k), typical_p), top_p), min_p)
    sp = softmax(cands)
    return [i for i, _, _ in sp], np.array([q for _, _, q in sp])


def ours(logits, **kw):
    params = SamplingParams(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, **kw})
    ids, p = distribution(logits, params)
    return ids.tolist(), p


@pytest.mark.parametrize("min_p", [0.05, 0.2, 0.5, 0.9, 1.0])
def test_min_p_keeps_what_llama_cpp_keeps(min_p):
    want_ids, want_p = reference(LOGITS, min_p=min_p)
    ids, p = ours(LOGITS, min_p=min_p)
    assert ids == want_ids and np.allclose(p, want_p, rtol=1e-12)
    assert len(ids) < LOGITS.size  # every one of these values cuts something


def test_min_p_by_hand():
    # p_max = 0.5: 0.1 * 0.5 = 0.05 keeps 0.5, 0.3, 0.15; drops 0.04 and 0.01.
    probs = np.array([0.15, 0.5, 0.04, 0.3, 0.01])
    ids, p = ours(np.log(probs), min_p=0.1)
    assert ids == [1, 3, 0]
    assert np.allclose(p, np.array([0.5, 0.3, 0.15]) / 0.95)


@pytest.mark.parametrize("typical_p", [0.05, 0.3, 0.5, 0.8, 0.95])
def test_typical_p_keeps_what_llama_cpp_keeps(typical_p):
    want_ids, want_p = reference(LOGITS, typical_p=typical_p)
    ids, p = ours(LOGITS, typical_p=typical_p)
    assert ids == want_ids and np.allclose(p, want_p, rtol=1e-12)
    assert len(ids) < LOGITS.size


def test_typical_p_prefers_the_typical_token_over_the_likeliest():
    # A mode of 0.3 over a near-flat tail of seven near 0.1: the entropy (about 1.97 nats) is
    # nearer the tail's information (-log 0.1 = 2.30) than the mode's (1.20), so a small mass
    # keeps one tail token, not the mode (top-p would keep the mode).
    probs = np.array([0.3, 0.103, 0.102, 0.101, 0.1, 0.099, 0.098, 0.097])
    ids, p = ours(np.log(probs), typical_p=0.05)
    want_ids, _ = reference(np.log(probs), typical_p=0.05)
    assert len(ids) == 1 and ids != [0] and ids == want_ids and p.tolist() == [1.0]


@pytest.mark.parametrize(
    "kw",
    [
        dict(top_k=8, typical_p=0.9, top_p=0.9, min_p=0.1),
        dict(top_k=10, typical_p=0.7, min_p=0.3),
        dict(typical_p=0.95, top_p=0.7),
        dict(top_k=6, top_p=0.95, min_p=0.15),
    ],
)
def test_the_chain_runs_in_llama_cpps_order(kw):
    want_ids, want_p = reference(LOGITS, **kw)
    ids, p = ours(LOGITS, **kw)
    assert ids == want_ids and np.allclose(p, want_p, rtol=1e-12)


def test_off_values_change_nothing():
    a_ids, a_p = ours(LOGITS)
    b_ids, b_p = ours(LOGITS, min_p=0.0, typical_p=1.0)
    assert a_ids == b_ids == list(np.argsort(-LOGITS)) and np.array_equal(a_p, b_p)


def test_ruled_out_tokens_stay_out():
    x = LOGITS.copy()
    x[[5, 9]] = -np.inf  # a constraint's mask
    for kw in (dict(min_p=0.05), dict(typical_p=0.9), dict(typical_p=0.9, min_p=0.05)):
        ids, p = ours(x, **kw)
        assert 5 not in ids and 9 not in ids and np.isclose(p.sum(), 1.0), kw


def test_sampling_draws_only_survivors():
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5)
    picks = {sample(LOGITS, params, rng) for _ in range(300)}
    want_ids, _ = reference(LOGITS, min_p=0.5)
    assert picks == set(want_ids)


@pytest.mark.parametrize(
    "kw",
    [
        dict(min_p=-0.1),
        dict(min_p=1.5),
        dict(typical_p=0.0),
        dict(typical_p=1.2),
        dict(min_p=float("nan")),
        dict(typical_p="0.5"),
    ],  # fmt: skip
)
def test_out_of_range_values_raise_naming_the_argument(kw):
    with pytest.raises(ShapeError, match=next(iter(kw))):
        SamplingParams(**kw).validate()
