"""Training-free predictors from the gate's weights: a low-rank map of the gate's
pre-activations, fitted to the samples' second moment, with each neuron's logit in units of
what the map misses (SVDP-like, arXiv 2603.14110; facts, not code).

In a ReLU-family FFN a neuron fires when its gate pre-activation ``h_j = g_j . x`` passes the
activation's threshold (0 for ReLU). So the best linear predictor of rank ``k`` is the one that
reproduces ``h = G x`` best on the inputs the layer sees: with ``S = E[x x^T]`` (the samples'
second moment), minimise ``E |h - Q P x|^2`` over ``Q [ffn, k]``, ``P [k, dim]``. By
Eckart-Young on the data matrix ``H = X G^T`` the answer projects ``h`` onto the top ``k``
eigenvectors ``V`` of ``G S G^T`` (``ffn x ffn``, never formed): ``Q = V``, ``P = V^T G``.
Neurons are first put in units of their own spread (``D = sqrt(diag(G S G^T))``) so a neuron
with a large gate row does not take the components a quiet one needs: the eigenvectors are
those of ``D^-1 G S G^T D^-1``, then ``Q = D V``, ``P = V^T D^-1 G``.

What the map misses, ``r_j = g_j - q_j P``, has spread ``s_j = sqrt(r_j^T S r_j)`` on the
samples; a neuron is likely to fire when ``(q_j P x - t) / s_j`` is large (``Phi`` of it, for a
Gaussian miss), so the logits are divided by ``s_j`` (folded into ``Q``'s rows) and one
threshold per layer, tuned on held-out samples, sets the recall. The map is linear; in our
(PowerInfer's) bias-free two-layer ReLU format it is written exactly as ``fc1 = [P; -P]``,
``fc2 = [Q, -Q]`` (``relu(a) - relu(-a) = a``), rank ``2k``.

Costs at the 7B layer shape (dim 4096, ffn 11008): the second moment of ``n`` samples is
``n dim^2`` multiply-adds (the bulk: blocked float32 products summed in float64), the
eigenvectors a randomized range finder (Halko et al. 2011) of a few ``ffn x dim x (k + 16)``
products; nothing is iterated over the samples.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError

#: The least spread of a neuron's miss, as a share of its pre-activation's spread: a neuron the
#: map reproduces exactly would get unbounded logits (and f16 holds at most 65504).
MISS_FLOOR = 1e-2


@dataclass
class LowRankMap:
    """``logits = q @ (p @ x)``: ``p [k, dim]``, ``q [ffn, k]`` (``q``'s rows already divided
    by ``miss``), ``miss [ffn]`` the spread of what the rank-``k`` map leaves out of each
    neuron's pre-activation on the samples."""

    p: np.ndarray
    q: np.ndarray
    miss: np.ndarray

    @property
    def rank(self) -> int:
        """The map's rank ``k`` (the ReLU form has ``2k``)."""
        return int(self.p.shape[0])

    def logits(self, x: np.ndarray) -> np.ndarray:
        """``[n, ffn]`` logits of ``x [n, dim]`` (float32)."""
        return (np.asarray(x, np.float32) @ self.p.T) @ self.q.T

    def relu_form(self) -> tuple[np.ndarray, np.ndarray]:
        """``(fc1 [2k, dim], fc2 [ffn, 2k])`` of the bias-free ReLU MLP computing the same
        logits exactly."""
        fc1 = np.concatenate([self.p, -self.p]).astype(np.float32)
        fc2 = np.concatenate([self.q, -self.q], axis=1).astype(np.float32)
        return fc1, fc2


def second_moment(batches: Iterable[np.ndarray], dim: int, block: int = 8192) -> np.ndarray:
    """``E[x x^T]`` (float64 ``[dim, dim]``) over every row of ``batches``: float32 products of
    at most ``block`` rows, summed in float64."""
    acc = np.zeros((dim, dim), np.float64)
    n = 0
    for b in batches:
        b = np.asarray(b)
        if b.ndim != 2 or b.shape[1] != dim:
            raise ShapeError(f"samples must be [n, {dim}], got {b.shape}")
        for i in range(0, b.shape[0], block):
            xb = np.ascontiguousarray(b[i : i + block], dtype=np.float32)
            acc += xb.T @ xb
            n += xb.shape[0]
    if n == 0:
        raise ShapeError("no samples to take the second moment of")
    return acc / n


def _top_eigvecs(apply, size: int, k: int, seed: int, power: int) -> np.ndarray:
    """The top ``k`` eigenvectors ``[size, k]`` of the symmetric PSD operator ``apply`` (a
    function of ``[size, w]`` blocks), by a seeded randomized range finder with ``power``
    subspace iterations."""
    width = min(size, k + 16)
    rng = np.random.default_rng([seed, 23])
    basis, _ = np.linalg.qr(apply(rng.standard_normal((size, width)).astype(np.float32)))
    for _ in range(power):
        basis, _ = np.linalg.qr(apply(basis.astype(np.float32)))
    small = basis.T @ apply(basis.astype(np.float32)).astype(np.float64)
    vals, vecs = np.linalg.eigh((small + small.T) / 2)
    order = np.argsort(vals)[::-1][:k]
    return (basis @ vecs[:, order]).astype(np.float32)


class GateMaps:
    """The maps of every rank up to ``k`` of ``gate [ffn, dim]``'s pre-activations under the
    second moment ``moment [dim, dim]`` (see the module doc), from one eigendecomposition:
    :meth:`at` gives the rank-``r`` one. ``balance``: neurons in units of their own spread
    first.

    The misses of every rank come from the eigenvectors alone. In balanced units
    (``B = D^-1 G S G^T D^-1``, ``W = B V``, ``M = V^T W``) the miss of neuron ``j`` at rank
    ``r`` is ``d_j^2 (B_jj - 2 (V_r W_r^T)_jj + (V_r M_r V_r^T)_jj)``, so a rank costs
    ``ffn r^2`` operations, not the ``ffn dim^2`` of ``diag(R S R^T)``."""

    def __init__(
        self,
        gate: np.ndarray,
        moment: np.ndarray,
        k: int,
        *,
        seed: int = 0,
        power: int = 3,
        balance: bool = True,
    ) -> None:
        gate = np.ascontiguousarray(gate, dtype=np.float32)
        ffn, dim = gate.shape
        if moment.shape != (dim, dim):
            raise ShapeError(f"second moment {moment.shape} does not fit a gate of width {dim}")
        self.k = max(1, min(int(k), ffn, dim))
        gs = gate @ np.ascontiguousarray(moment, dtype=np.float32)  # [ffn, dim]: G S
        spread2 = np.maximum(np.einsum("ij,ij->i", gs, gate, dtype=np.float64), 1e-30)
        self.spread = np.sqrt(spread2)
        d = self.spread.astype(np.float32) if balance else np.ones(ffn, np.float32)

        def apply(w: np.ndarray) -> np.ndarray:  # (D^-1 G S G^T D^-1) w
            return (gs @ (gate.T @ (w / d[:, None]))) / d[:, None]

        self.gate, self.d = gate, d
        self.b_diag = spread2 / d.astype(np.float64) ** 2
        self.v = _top_eigvecs(apply, ffn, self.k, seed, power)  # [ffn, k]
        self.w = apply(self.v).astype(np.float64)  # B V
        self.p_full = (self.v.T / d[None, :]) @ gate  # V^T D^-1 G  [k, dim]

    def at(self, r: int) -> LowRankMap:
        """The rank-``r`` map (``r <= k``): the leading ``r`` components."""
        r = max(1, min(int(r), self.k))
        v, w = self.v[:, :r].astype(np.float64), self.w[:, :r]
        m = v.T @ w
        unit = self.b_diag - 2 * np.einsum("ij,ij->i", v, w) + np.einsum("ij,ij->i", v @ m, v)
        miss = np.sqrt(np.maximum(unit, 0.0)) * self.d
        miss = np.maximum(miss, MISS_FLOOR * self.spread).astype(np.float32)
        q = self.v[:, :r] * (self.d / miss)[:, None]  # D V, each row over its miss
        return LowRankMap(
            np.ascontiguousarray(self.p_full[:r], np.float32), q.astype(np.float32), miss
        )


def firing_agreement(gate: np.ndarray, x: np.ndarray, mask: np.ndarray, cut: float = 0.0) -> float:
    """The share of ``(token, neuron)`` pairs where ``gate @ x > cut`` agrees with ``mask``: how
    far the samples' firing is a threshold on the gate's pre-activation (1.0 for ReLU at cut 0;
    a SiLU model's calibrated masks are not)."""
    h = np.asarray(x, np.float32) @ np.asarray(gate, np.float32).T
    return float(np.mean((h > cut) == np.asarray(mask, bool)))
