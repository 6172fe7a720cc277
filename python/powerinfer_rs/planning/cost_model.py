"""Objective coefficients and the exact evaluation of a placement.

The ILP (:mod:`.ilp`) is built from :func:`mass_weights` and :func:`time_terms`; :func:`evaluate`
computes bytes, activation mass and predicted time of any placement directly (no linearisation),
which is what the greedy fallback, the report and the brute-force tests use. The two agree on
every feasible placement (tests check it).

Mass ("served activation mass", PowerInfer's objective, extended to the dense parts): a bucket
weighs the expected number of its neurons active per token (counts / tokens); a dense component
(attention weights, predictor, output head) is read in full every token, so it weighs as many
always-active neurons as its bytes are worth (``bytes / neuron_read``). The objective is the
weighted share placed on the GPU, in [0, 1]. The *FFN mass share* reported beside it counts
neurons only.

Time (seconds per token, decode): per layer, attention then predictor run on their device, then
the FFN runs on both at once (``max`` of GPU and CPU parts; the CPU's cold neurons at its
measured rows-by-index rates, its dense parts at its dense rate), plus a sync and PCIe transfer when
the layer is split between devices; plus the output head and one embedding row. A mixture of
experts' layer also routes on the CPU (its router's bytes), so it is split whenever the GPU holds
any part of it, and a bucket's mass is what it reads per token (routed neurons' rows, not just
firing ones: dense experts read every row of a routed expert).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .accounting import kv_element_bytes
from .placement import Placement
from .problem import PlacementProblem


@dataclass
class MassWeights:
    """Unnormalised mass weights; divide by ``total`` for shares."""

    buckets: list[np.ndarray]
    attention: list[float]
    predictor: list[float]
    output: float
    total: float


@dataclass
class TimeTerms:
    """Seconds per token of each choice (see the module docstring)."""

    attn_gpu: list[float]
    attn_cpu: list[float]
    pred_gpu: list[float]
    pred_cpu: list[float]
    bucket_gpu: list[np.ndarray]  #: per bucket, expected GPU read time when hot
    bucket_cpu: list[np.ndarray]  #: per bucket, expected CPU read time when cold
    ffn_launch: float  #: GPU FFN launch latency (paid when the layer has hot neurons)
    sync: float  #: cost of a split layer
    router: list[float]  #: per layer, routing on the CPU (a mixture of experts; 0 otherwise)
    out_gpu: float
    out_cpu: float
    constant: float  #: embedding row read


def mass_weights(p: PlacementProblem) -> MassWeights:
    """Mass weights of every variable."""
    buckets = [
        (bucket_read(lt) / lt.neuron_read if lt.moe else lt.mass).astype(np.float64)
        for lt in p.layers
    ]
    attn = [lt.attn_weight_read / lt.neuron_read for lt in p.layers]
    pred = [lt.pred_read / lt.neuron_read for lt in p.layers]
    mean_r = float(np.mean([lt.neuron_read for lt in p.layers]))
    out = p.output_read / mean_r
    total = sum(float(b.sum()) for b in buckets) + sum(attn) + sum(pred) + out
    return MassWeights(buckets, attn, pred, out, total)


def bucket_read(lt) -> np.ndarray:
    """Expected weight bytes each bucket of a layer reads per token: its active neurons' rows,
    and the rows its mode reads whether a neuron fires (``neuron_fixed``) of every neuron (of
    every neuron whose expert is routed, in a mixture of experts: ``routed``)."""
    fired, fixed = bucket_read_parts(lt)
    return fired + fixed


def bucket_read_parts(lt) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bucket_read` in its two parts, which the CPU reads at different rates: the rows of
    neurons that fire (scattered, by index) and the rows read whether they fire (streamed)."""
    f = lt.neuron_fixed
    return lt.mass * (lt.neuron_read - f), lt.routed * float(f)


def bucket_cpu_time(p: PlacementProblem, lt) -> np.ndarray:
    """Seconds per token each bucket costs the CPU when cold: its firing rows at the CPU's
    rows-by-index rate, its streamed rows at the gate rate (each the dense rate where the
    profile has no measured one)."""
    fired, fixed = bucket_read_parts(lt)
    return fired / p.cpu_rows_bw + fixed / p.cpu_gate_bw


def time_terms(p: PlacementProblem) -> TimeTerms:
    """Time coefficients of every choice."""
    g, c, lam = p.gpu_bw, p.cpu_bw, p.launch
    return TimeTerms(
        attn_gpu=[lt.attn_read / g + lam for lt in p.layers],
        attn_cpu=[lt.attn_read / c for lt in p.layers],
        pred_gpu=[lt.pred_read / g + lam for lt in p.layers],
        pred_cpu=[lt.pred_read / c for lt in p.layers],
        bucket_gpu=[bucket_read(lt) / g for lt in p.layers],
        bucket_cpu=[bucket_cpu_time(p, lt) for lt in p.layers],
        ffn_launch=lam,
        sync=p.sync_cost(),
        router=[lt.router_read / c for lt in p.layers],
        out_gpu=p.output_read / g + lam + 4 * p.shape.config.vocab_size / p.pcie_bw,
        out_cpu=p.output_read / c,
        constant=p.embed_read / c,
    )


@dataclass
class Evaluation:
    """A placement measured against a problem."""

    feasible: bool
    reason: str
    gpu_bytes: int
    layer_gpu_bytes: list[int]
    global_gpu_bytes: int
    layer_cpu_bytes: list[int]
    global_cpu_bytes: int
    mass_objective: float  #: weighted GPU share, dense parts included
    mass_share: float  #: FFN activation mass on the GPU / all FFN activation mass
    layer_mass_share: list[float]
    layer_time: list[float]
    output_time: float
    time_per_token: float
    split: list[bool] = field(default_factory=list)
    #: Per layer, the CPU's part of its time: attention and predictor where they run on the
    #: CPU, routing, and the cold neurons' reads (what ``bench_hybrid.py --project`` measures).
    layer_cpu_time: list[float] = field(default_factory=list)
    output_on_gpu: bool = False

    @property
    def cpu_time_per_token(self) -> float:
        """The CPU side's predicted seconds per token (its layers' parts and the head when the
        CPU holds it)."""
        return sum(self.layer_cpu_time) + (0.0 if self.output_on_gpu else self.output_time)

    @property
    def tokens_per_s(self) -> float:
        """Predicted decode speed."""
        return 1.0 / self.time_per_token if self.time_per_token > 0 else float("inf")

    def objective(self, kind: str) -> float:
        """The value the named objective optimises (mass: maximise; time: minimise)."""
        return self.mass_objective if kind == "mass" else self.time_per_token


def evaluate(p: PlacementProblem, pl: Placement) -> Evaluation:
    """Bytes, mass and predicted time of ``pl``; ``feasible`` False (with a reason) when it
    breaks the budget or a per-layer minimum, or puts on the GPU a part it cannot hold."""
    mw, tt = mass_weights(p), time_terms(p)
    reasons = []
    layer_gpu, layer_cpu, layer_share, layer_time, split = [], [], [], [], []
    layer_cpu_time = []
    mass = 0.0
    gpu_counts = 0
    kv_raw = 2 * p.context * p.shape.config.n_kv_heads * p.shape.config.head_dim
    kv_raw = int(kv_raw * kv_element_bytes(p.kv_cache))
    for i, lt in enumerate(p.layers):
        k = int(pl.ffn_buckets[i])
        a, pr = bool(pl.attention[i]), bool(pl.predictor[i])
        has_pred = lt.pred_bytes > 0  # none in a mode without predictors: nothing to place
        pr = pr and has_pred
        if not 0 <= k <= lt.n_buckets:
            reasons.append(f"layer {i}: {k} buckets of {lt.n_buckets}")
            k = max(0, min(k, lt.n_buckets))
        hot = int(lt.sizes[:k].sum())
        if a and not lt.attn_gpu:
            reasons.append(f"layer {i} attention on the GPU: {lt.attn_refused}")
        if k and not lt.ffn_gpu:
            reasons.append(f"layer {i} neurons on the GPU: {lt.ffn_refused}")
        if pr and k == 0:
            reasons.append(
                f"layer {i}: a predictor on the GPU without hot neurons (such a layer's FFN, "
                "predictor included, runs on the CPU)"
            )
        if 0 < hot < lt.min_neurons:
            reasons.append(f"layer {i}: {hot} hot neurons < minimum {lt.min_neurons}")
        gb = (lt.attn_bytes if a else 0) + (lt.pred_bytes if pr else 0)
        gb += (lt.ffn_fixed_bytes + k * lt.slab_bytes) if k else 0
        layer_gpu.append(gb)
        cold = int(lt.sizes[k:].sum())
        cb = cold * lt.neuron_read + (0 if a else lt.attn_weight_read + kv_raw) + lt.router_read
        cb += 0 if pr else lt.pred_read
        layer_cpu.append(cb)
        mass += float(mw.buckets[i][:k].sum()) + (mw.attention[i] if a else 0.0)
        mass += mw.predictor[i] if pr else 0.0
        lc = int(lt.counts.sum())
        gpu_counts += int(lt.counts[:k].sum())
        layer_share.append(float(lt.counts[:k].sum()) / lc if lc else 0.0)
        t = (tt.attn_gpu[i] if a else tt.attn_cpu[i]) + (tt.pred_gpu[i] if pr else tt.pred_cpu[i])
        t += tt.router[i]
        t_gpu = (tt.ffn_launch + float(tt.bucket_gpu[i][:k].sum())) if k else 0.0
        t_cpu = float(tt.bucket_cpu[i][k:].sum())
        uses_gpu = a or pr or k > 0
        uses_cpu = (not a) or (has_pred and not pr) or k < lt.n_buckets or lt.moe
        s = uses_gpu and uses_cpu
        split.append(s)
        layer_time.append(t + max(t_gpu, t_cpu) + (tt.sync if s else 0.0))
        cpu_t = (0.0 if a else tt.attn_cpu[i]) + (0.0 if pr else tt.pred_cpu[i])
        layer_cpu_time.append(cpu_t + tt.router[i] + t_cpu)
    if pl.output and not p.output_gpu:
        reasons.append(f"output head on the GPU: {p.output_refused}")
    glob = p.output_bytes if pl.output else 0
    if pl.uses_gpu():
        glob += p.scratch_bytes
    mass += mw.output if pl.output else 0.0
    gpu = sum(layer_gpu) + glob
    if gpu > p.budget:
        reasons.append(f"GPU bytes {gpu} > budget {p.budget}")
    out_t = tt.out_gpu if pl.output else tt.out_cpu
    cpu_glob = p.shape.tensor_bytes("token_embd") + (0 if pl.output else p.output_read)
    return Evaluation(
        feasible=not reasons,
        reason="; ".join(reasons),
        gpu_bytes=gpu,
        layer_gpu_bytes=layer_gpu,
        global_gpu_bytes=glob,
        layer_cpu_bytes=layer_cpu,
        global_cpu_bytes=cpu_glob,
        mass_objective=mass / mw.total if mw.total else 0.0,
        mass_share=gpu_counts / p.total_counts if p.total_counts else 0.0,
        layer_mass_share=layer_share,
        layer_time=layer_time,
        output_time=out_t,
        time_per_token=sum(layer_time) + out_t + tt.constant,
        split=split,
        layer_cpu_time=layer_cpu_time,
        output_on_gpu=bool(pl.output),
    )


__all__ = ["Evaluation", "MassWeights", "TimeTerms", "evaluate", "mass_weights", "time_terms"]
