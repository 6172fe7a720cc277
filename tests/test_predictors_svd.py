"""The gate-SVD predictor (predictors/svd.py, train_svd.py) on planted gates in numpy: exact
where the gate is low rank, at the Bayes ceiling of a low-rank rule where it is not, and the
ReLU form it is stored in computes the same logits."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from powerinfer_rs.errors import PowerInferError, ShapeError
from powerinfer_rs.predictors.metrics import mask_stats, tune_threshold
from powerinfer_rs.predictors.svd import GateMaps, firing_agreement, second_moment
from powerinfer_rs.predictors.train_svd import train_layer_from_gate

DIM, FFN, PLANTED, BIAS = 192, 520, 12, 3.0


def planted(noise: float, active: float = 0.1, seed: int = 0):
    """A gate ``[b | sqrt(1-noise) A B + sqrt(noise) N]`` over inputs with a constant channel
    0 (the synthetic models' bias channel), firing rates following a power law; and its
    low-rank part (what a rank-``PLANTED`` rule could know)."""
    rng = np.random.default_rng(seed)
    low = rng.standard_normal((FFN, PLANTED)) @ rng.standard_normal((PLANTED, DIM - 1))
    low *= np.sqrt(1 / DIM) / low.std()
    w = np.sqrt(1 - noise) * low + np.sqrt(noise) * rng.standard_normal((FFN, DIM - 1)) / np.sqrt(
        DIM
    )
    p = np.clip(active * FFN / 4 / (rng.permutation(FFN) + 1), 1e-3, 0.95)
    bias = np.sqrt((w**2).sum(1)) * np.array([NormalDist().inv_cdf(v) for v in p]) / BIAS
    gate = np.concatenate([bias[:, None], w], axis=1).astype(np.float32)
    return gate, (np.sqrt(1 - noise) * low).astype(np.float32)


def inputs(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    x[:, 0] = BIAS
    return x


def prec_at_99(scores: np.ndarray, mask: np.ndarray) -> float:
    """Precision at recall >= 0.99, the threshold tuned on the first half, measured on the rest."""
    h = len(mask) // 2
    t = tune_threshold(scores[:h], mask[:h], 0.99)
    return mask_stats(scores[h:] >= np.float32(t), mask[h:]).precision


def test_second_moment_is_the_mean_outer_product_over_every_batch():
    x = inputs(1000, 1)
    got = second_moment([x[:300], x[300:]], DIM, block=128)
    np.testing.assert_allclose(got, x.astype(np.float64).T @ x / 1000, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError):
        second_moment([x[:, :10]], DIM)
    with pytest.raises(ShapeError):
        second_moment([], DIM)


def test_an_exactly_low_rank_gate_is_predicted_exactly():
    gate, _ = planted(0.0)
    x, xb = inputs(6000, 1), inputs(4000, 2)
    m = GateMaps(gate, second_moment([x], DIM), PLANTED + 1).at(PLANTED + 1)
    truth = xb @ gate.T > 0
    assert prec_at_99(m.logits(xb), truth) > 0.97
    fc1, fc2 = m.relu_form()
    assert fc1.shape == (2 * (PLANTED + 1), DIM) and fc2.shape == (FFN, 2 * (PLANTED + 1))
    relu = np.maximum(xb @ fc1.T, 0) @ fc2.T
    want = m.logits(xb)
    np.testing.assert_allclose(relu, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    assert np.abs(want).max() < 65504  # f16 holds them


def test_a_noisy_gate_reaches_the_low_rank_ceiling():
    noise = 0.1
    gate, low = planted(noise)
    x, xb = inputs(8000, 1), inputs(8000, 2)
    truth = xb @ gate.T > 0
    m = GateMaps(gate, second_moment([x], DIM), PLANTED + 1).at(PLANTED + 1)
    got = prec_at_99(m.logits(xb), truth)
    # the Bayes rule of one who knows the bias and the low-rank part exactly
    m = np.outer(xb[:, 0], gate[:, 0]) + xb[:, 1:] @ low.T
    s = np.sqrt(noise * (xb[:, 1:] ** 2).sum(axis=1) / DIM)
    ceiling = prec_at_99(m / s[:, None], truth)
    assert 0.2 < ceiling < 0.9
    assert got > ceiling - 0.03, (got, ceiling)


def test_train_layer_from_gate_meets_the_recall_target_on_held_out_rows():
    gate, _ = planted(0.05, active=0.3)
    x = inputs(6000, 3)
    mask = x @ gate.T > 0
    assert firing_agreement(gate, x[:500], mask[:500]) == 1.0
    pred = train_layer_from_gate(x, mask, gate, recall=0.99, max_rank=128, seed=1)
    s = pred.stats
    assert s["method"] == "gate-svd" and s["met_target"] and s["recall"] >= 0.99
    assert pred.rank == s["rank"] <= 128 and pred.rank % 2 == 0
    assert [a["rank"] for a in s["attempts"]][0] == 128  # from the cap down by halves
    xb = inputs(3000, 4)
    st = mask_stats(pred.predict(xb), xb @ gate.T > 0)
    assert st.recall > 0.97 and st.precision > 0.5
    with pytest.raises(ShapeError) as e:
        train_layer_from_gate(x, mask[:, :10], gate)
    assert isinstance(e.value, PowerInferError)


def test_every_ranks_miss_is_what_the_map_leaves_out_on_the_samples():
    """GateMaps.at(r)'s misses (from the eigenvectors alone) against diag(R S R^T) of the
    residual gate R, for the leading and truncated ranks."""
    gate, _ = planted(0.2)
    s = second_moment([inputs(3000, 1)], DIM)
    maps = GateMaps(gate, s, 40)
    for r in (40, 17, 5):
        m = maps.at(r)
        resid = gate.astype(np.float64) - (m.q * m.miss[:, None]).astype(np.float64) @ m.p
        want = np.sqrt(np.einsum("ij,ij->i", resid @ s, resid))
        np.testing.assert_allclose(m.miss, np.maximum(want, 1e-2 * maps.spread), rtol=2e-3)
