"""Greedy fallback: fill the budget by gain per byte.

Used when highspy is missing or HiGHS fails, and shown beside the ILP in the benchmark. Items
are the dense components (attention + KV, predictor per layer; the output head) and, per layer,
the next bucket in frequency order; the first FFN item of a layer is its first ``m_l`` neurons'
buckets together (plus ``ffn_norm``), so the per-layer minimum holds by construction. The item
with the best gain per byte that still fits is taken until none fits. Gains are the mass weights
(objective "mass") or the time saved ignoring the per-layer max of the CPU and GPU parts
(objective "time"); the result is then measured exactly by :func:`.cost_model.evaluate`. Parts
the GPU cannot hold (``attn_gpu``, ``ffn_gpu``, ``output_gpu`` false) are never items.
"""

from __future__ import annotations

import heapq
import time

from .cost_model import evaluate, mass_weights, time_terms
from .placement import Placement
from .problem import PlacementProblem
from .solve_result import SolveResult


def _bucket_gains(p: PlacementProblem):
    if p.objective == "mass":
        mw = mass_weights(p)
        return (
            mw.buckets,
            mw.attention,
            mw.predictor,
            mw.output,
            [0.0] * len(p.layers),
        )
    tt = time_terms(p)
    buckets = [c - g for c, g in zip(tt.bucket_cpu, tt.bucket_gpu)]
    attn = [c - g for c, g in zip(tt.attn_cpu, tt.attn_gpu)]
    pred = [c - g for c, g in zip(tt.pred_cpu, tt.pred_gpu)]
    first_cost = [tt.ffn_launch + tt.sync] * len(p.layers)
    return buckets, attn, pred, tt.out_cpu - tt.out_gpu, first_cost


def solve_greedy(p: PlacementProblem) -> SolveResult:
    """Greedy placement of ``p`` (always feasible; may be CPU only)."""
    t0 = time.perf_counter()
    L = len(p.layers)
    pl = Placement.cpu_only(L)
    bucket_gain, attn_gain, pred_gain, out_gain, first_cost = _bucket_gains(p)
    heap: list[tuple[float, int, tuple]] = []
    seq = 0

    def push(gain: float, nbytes: int, item: tuple) -> None:
        nonlocal seq
        if gain > 0 and nbytes > 0:
            heapq.heappush(heap, (-gain / nbytes, seq, (gain, nbytes, item)))
            seq += 1

    for i, lt in enumerate(p.layers):
        if lt.attn_gpu:
            push(attn_gain[i], lt.attn_bytes, ("attn", i))
        # A layer's predictor goes on the GPU only after some of its neurons (it serves them).
        if lt.ffn_gpu:
            k0 = lt.min_buckets
            gain = float(bucket_gain[i][:k0].sum()) - first_cost[i]
            push(gain, lt.ffn_fixed_bytes + k0 * lt.slab_bytes, ("ffn", i, k0))
    if p.output_gpu:
        push(out_gain, p.output_bytes, ("out",))

    used = 0
    while heap:
        _, _, (_gain, nbytes, item) = heapq.heappop(heap)
        extra = nbytes + (0 if used else p.scratch_bytes)
        if used + extra > p.budget:
            continue
        used += extra
        kind = item[0]
        if kind == "attn":
            pl.attention[item[1]] = True
        elif kind == "pred":
            pl.predictor[item[1]] = True
        elif kind == "out":
            pl.output = True
        else:
            i, k = item[1], item[2]
            if pl.ffn_buckets[i] == 0:
                push(pred_gain[i], p.layers[i].pred_bytes, ("pred", i))
            pl.ffn_buckets[i] = k
            lt = p.layers[i]
            if k < lt.n_buckets:
                push(float(bucket_gain[i][k]), lt.slab_bytes, ("ffn", i, k + 1))
    ev = evaluate(p, pl)
    return SolveResult(
        placement=pl,
        solver="greedy",
        status="greedy",
        objective=ev.objective(p.objective),
        mip_gap=None,
        solve_time_s=time.perf_counter() - t0,
    )


__all__ = ["solve_greedy"]
