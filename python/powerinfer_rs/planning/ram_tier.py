"""The plan's RAM tier: which of the CPU's FFN neurons stay resident in RAM and which are read
from storage through the neuron store (PowerInfer-2's third tier; ``Engine.use_neuron_store``).

It runs after the GPU placement, over the neurons the GPU does not hold, under a RAM budget:

1. **Base.** What the process keeps in RAM besides the store: every tensor but the FFN's
   gate/up/down rows (a mixture of experts' routed experts; its router and shared expert stay),
   less the attention and output head the GPU holds, exact-relu's gate matrices (it reads every
   gate row per token, or every routed expert's), the CPU layers' KV caches at ``context``
   positions (f32 on the CPU whatever the precision), the predictors the GPU does not hold,
   and ``overhead`` for the process itself.
2. **The store's cache**, the rest of the budget, in slots of the store's largest cluster
   (:func:`cluster_bytes`, the same formula as the engine's file layout):
   - a *working set* of LRU slots: a layer's clusters are pinned together while it computes,
     and the next layer's are read ahead meanwhile, so it holds ``WORKING_FACTOR`` times the
     most storage clusters a layer touches per token on average, plus ``WORKING_SPARE``;
   - *resident* slots for the rest: clusters by firing probability per byte, highest first (a
     knapsack whose items all cost one slot: sorting is exact). A cluster fires when any of its
     neurons does (independence assumed: ``1 - prod(1 - p)``); a mixture of experts' neuron in
     dense mode is read whenever its expert is routed (:func:`store_frequencies`).
3. **Storage cost**: per token, every non-resident cluster that fires is read (LRU hits are not
   counted: a bound), whole, or in exact-relu its up and down part alone, at the measured
   storage's cost per read (:meth:`~.hardware_profile.HardwareProfile.storage_seconds`).

The result is recorded in the plan (``ram_neurons`` per layer and the ``ram`` section) and
checked byte for byte when the plan is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import PlanError, VramBudgetError
from ..facts import mode_refusal
from ..formats.profile import Profile
from ..loading.types import row_bytes
from .accounting import cpu_kv_bytes
from .model_shape import ModelShape
from .placement import Placement
from .predictor_size import PredictorSizes
from .sizes import format_bytes

#: The store's alignment of reads and of a cluster's parts (``neuron_store::ALIGN``).
STORE_ALIGN = 4096
#: RAM for the process itself (the runtime, Python, scratch) by default.
DEFAULT_OVERHEAD = 256 << 20
#: The working set: this many times a layer's expected storage clusters (the layer pinned and
#: the next one read ahead), plus this many slots.
WORKING_FACTOR = 2.5
WORKING_SPARE = 16

_FFN_MATRICES = ("ffn_gate", "ffn_up", "ffn_down")
_ATTN = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv")


def _align(n: int) -> int:
    return -(-n // STORE_ALIGN) * STORE_ALIGN


def cluster_bytes(shape: ModelShape, layer: int, cluster: int, whole: bool = True) -> int:
    """Bytes of one of ``layer``'s store clusters of ``cluster`` neurons: their up and
    transposed down rows, padded to 4 KiB, then their gate rows, padded (a gate-less FFN's one
    input projection stands for the gate) — the engine's ``LayerLayout``; without ``whole``
    the up and down part alone (what exact-relu reads)."""
    c = shape.config
    gate_name = shape.ffn_tensor(layer, "up" if c.no_gate else "gate")
    gate = row_bytes(shape.dtype(gate_name), c.dim)
    up = 0 if c.no_gate else row_bytes(shape.dtype(shape.ffn_tensor(layer, "up")), c.dim)
    down = row_bytes(shape.down_t_dtype(layer), c.dim)
    return _align(cluster * (up + down)) + (_align(cluster * gate) if whole else 0)


def base_ram_bytes(
    shape: ModelShape,
    placement: Placement,
    *,
    sparsity: str,
    context: int,
    kv_cache: str,
    predictors: PredictorSizes,
) -> int:
    """RAM the model needs besides the store (see the module doc; ``overhead`` not included)."""
    c = shape.config
    total = 0
    for name in shape.dtypes:
        parts = name.split(".")
        kind = parts[2] if len(parts) > 2 and parts[0] == "blk" else name
        kind = kind.removesuffix("_exps")  # a mixture of experts' routed experts
        layer = int(parts[1]) if parts[0] == "blk" else None
        if kind in _FFN_MATRICES and not (kind == "ffn_gate" and sparsity == "exact-relu"):
            continue
        if layer is not None and kind in _ATTN and placement.attention[layer]:
            continue
        if name == "output" and placement.output:
            continue
        total += shape.tensor_bytes(name)
    for i in range(c.n_layers):
        if not placement.attention[i]:
            # The CPU holds f16 and f32 rows as f32 (rounded to f16 at f16), blocks as blocks.
            total += cpu_kv_bytes(shape, context, kv_cache)
        if sparsity == "predictor" and not placement.predictor[i]:
            total += predictors.layer_bytes(i)
    return total


def cluster_probabilities(
    freq: np.ndarray, cluster: int, gpu: np.ndarray, group: int = 1
) -> np.ndarray:
    """Per cluster of ``cluster`` neurons, the chance one of its non-GPU neurons is read,
    neurons independent (``1 - prod(1 - p)``) but for runs of ``group`` neurons read together
    (a routed expert's ``group`` neurons, read whole in dense mode): each run inside a cluster
    counts once (its first non-GPU neuron's chance)."""
    p = np.clip(np.asarray(freq, dtype=np.float64), 0.0, 1.0).copy()
    p[np.asarray(gpu, dtype=np.int64)] = 0.0
    idx = np.arange(p.size)
    if group > 1:
        # One chance per (cluster, group) run: the largest of the run's (GPU neurons are 0).
        run = idx // cluster * (p.size // group + 1) + idx // group
        first = np.r_[True, run[1:] != run[:-1]]
        starts = np.flatnonzero(first)
        best = np.maximum.reduceat(p, starts)
        p = np.zeros_like(p)
        p[starts] = best
    pad = (-p.size) % cluster
    q = np.pad(1.0 - p, (0, pad), constant_values=1.0).reshape(-1, cluster)
    return 1.0 - q.prod(axis=1)


def store_frequencies(shape: ModelShape, profile: Profile, layer: int, sparsity: str) -> np.ndarray:
    """How often each of ``layer``'s store neurons is read per token: its firing frequency, or
    in a mixture of experts' dense mode its expert's routing frequency (a routed expert is read
    whole). A mixture of experts' store holds its routed neurons only."""
    if not shape.moe:
        return profile.frequencies(layer)
    n = shape.routed_neurons
    if sparsity == "dense":
        if profile.expert_counts is None:
            raise PlanError("the profile has no expert routing counts: profile the model again")
        q = np.asarray(profile.expert_counts[layer], dtype=np.float64) / float(profile.tokens)
        return np.repeat(q, shape.expert_ffn)[:n]
    return profile.frequencies(layer)[:n]


def plan_ram_tier(
    shape: ModelShape,
    profile: Profile,
    placement: Placement,
    gpu_neurons: list[np.ndarray],
    ram_budget: int,
    *,
    sparsity: str,
    context: int,
    kv_cache: str,
    predictors: PredictorSizes,
    hardware,
    cluster: int = 1,
    overhead: int = DEFAULT_OVERHEAD,
) -> tuple[list[np.ndarray], dict]:
    """The RAM tier of a GPU placement: per layer the sorted ids of the neurons resident in
    RAM, and the plan's ``ram`` section (bytes, slots, the expected storage reads per token and
    their time on ``hardware``'s measured storage). :class:`VramBudgetError` when the budget
    cannot hold the base part and the store's working set; :class:`PlanError` for a mode or
    model the store does not run."""
    c = shape.config
    why = mode_refusal(sparsity, "moe_store" if shape.moe else "store")
    if why:
        raise PlanError(f"the RAM tier is for the modes a neuron store runs: {why}")
    if isinstance(cluster, bool) or not isinstance(cluster, int) or not 1 <= cluster <= 4096:
        raise PlanError(f"cluster must be an integer in 1..4096, got {cluster!r}")
    base = base_ram_bytes(
        shape,
        placement,
        sparsity=sparsity,
        context=context,
        kv_cache=kv_cache,
        predictors=predictors,
    )
    slot = max(cluster_bytes(shape, i, cluster) for i in range(c.n_layers))
    room = ram_budget - base - overhead
    probs = [
        cluster_probabilities(
            store_frequencies(shape, profile, i, sparsity),
            cluster,
            np.asarray(gpu_neurons[i])[np.asarray(gpu_neurons[i]) < shape.routed_neurons],
            group=shape.expert_ffn if shape.moe and sparsity == "dense" else 1,
        )
        for i in range(c.n_layers)
    ]
    none = [np.zeros(0, dtype=np.int64) for _ in probs]
    slots = room // slot if room > 0 else 0
    need = _working_slots(probs, none)
    if slots <= WORKING_SPARE:
        raise VramBudgetError(
            f"a RAM budget of {format_bytes(ram_budget)} holds no neuron store: the model needs "
            f"{format_bytes(base)} besides it (attention, embeddings, KV caches, predictors) plus "
            f"{format_bytes(overhead)} for the process, and the store at least "
            f"{format_bytes((WORKING_SPARE + 1) * slot)}"
        )
    take = _hottest_clusters(probs)
    # The working set, first as if nothing were resident (its largest), then for the clusters
    # the rest of the slots make resident: never smaller than what those leave to storage.
    work = min(need, slots)
    resident = take(slots - work)
    work = min(max(_working_slots(probs, resident), WORKING_SPARE + 1), slots)
    resident = take(slots - work)
    # What a read fetches: whole clusters, or exact-relu's up and down part.
    whole = sparsity != "exact-relu"
    cb = [cluster_bytes(shape, i, cluster, whole) for i in range(c.n_layers)]
    ram_neurons, reads = _resident_neurons(shape, probs, resident, gpu_neurons, cluster)
    n_res = sum(int(k.size) for k in resident)
    cache = (n_res + work) * slot
    ram = {
        "budget_bytes": int(ram_budget),
        "base_bytes": int(base),
        "overhead_bytes": int(overhead),
        "cluster": int(cluster),
        "slot_bytes": int(slot),
        "resident_slots": n_res,
        "working_slots": int(work),
        "cache_bytes": int(cache),
        "total_bytes": int(base + overhead + cache),
        "resident_clusters": [int(k.size) for k in resident],
        "storage": _storage_section(reads, cb, hardware),
    }
    return ram_neurons, ram


def _working_slots(probs: list[np.ndarray], resident: list[np.ndarray]) -> int:
    """The store's working slots with the clusters ``resident`` held: the most clusters a
    token is expected to read from storage in one layer, with a margin."""
    touched = 0.0
    for p, r in zip(probs, resident):
        rest = p.copy()
        rest[r] = 0.0
        touched = max(touched, float(rest.sum()))
    return math.ceil(WORKING_FACTOR * touched) + WORKING_SPARE


def _hottest_clusters(probs: list[np.ndarray]) -> Callable[[int], list[np.ndarray]]:
    """``take(n)``: per layer the sorted clusters among the ``n`` likeliest read over all
    layers (each costs one slot; ties by layer, then cluster). GPU-only clusters (probability
    0 because every neuron is on the GPU, or none fires) are never resident."""
    keys = [np.flatnonzero(p > 0) for p in probs]
    p_all = np.concatenate([p[k] for p, k in zip(probs, keys)])
    layer_all = np.concatenate([np.full(k.size, i) for i, k in enumerate(keys)])
    k_all = np.concatenate(keys)
    order = np.lexsort((k_all, layer_all, -p_all))  # highest first; ties by layer, cluster

    def take(n: int) -> list[np.ndarray]:
        chosen = order[: max(0, n)]
        return [np.sort(k_all[chosen[layer_all[chosen] == i]]) for i in range(len(probs))]

    return take


def _resident_neurons(
    shape: ModelShape,
    probs: list[np.ndarray],
    resident: list[np.ndarray],
    gpu_neurons: list[np.ndarray],
    cluster: int,
) -> tuple[list[np.ndarray], list[float]]:
    """Per layer the neurons the ``resident`` clusters hold in RAM (less the GPU's), and the
    clusters a token is expected to read from storage."""
    ram_neurons, reads = [], []
    for i, (p, ks) in enumerate(zip(probs, resident)):
        ids = (ks[:, None] * cluster + np.arange(cluster)[None, :]).ravel()
        ids = ids[ids < shape.routed_neurons]
        ram_neurons.append(np.setdiff1d(ids, np.asarray(gpu_neurons[i]), assume_unique=True))
        rest = p.copy()
        rest[ks] = 0.0
        reads.append(float(rest.sum()))
    return ram_neurons, reads


def _storage_section(reads: list[float], cb: list[int], hardware) -> dict:
    """The ``ram`` section's ``storage`` part: the reads and bytes a token is expected to
    fetch from storage (``reads`` per layer, of ``cb`` bytes each), and their time on
    ``hardware``'s storage (None where it has no storage numbers)."""
    storage_bytes = 0.0
    for r, b in zip(reads, cb):
        storage_bytes += r * b
    per_layer = [
        hardware.storage_seconds(r, b) if hardware is not None else None for r, b in zip(reads, cb)
    ]
    return {
        "reads_per_token": float(sum(reads)),
        "bytes_per_token": storage_bytes,
        "reads_per_layer": reads,
        "time_per_token_s": None if None in per_layer else float(sum(per_layer)),
        "read_bw_gbs": float(getattr(hardware, "storage_read_bw", 0.0)),
        "iops": float(getattr(hardware, "storage_iops", 0.0)),
    }


def check_ram_tier(
    ram_neurons: list[np.ndarray], ram: dict, gpu_neurons: list[np.ndarray], ffn_dim: int
) -> str | None:
    """Why a plan's RAM tier is inconsistent (ids, slots, bytes), or None."""
    try:
        cluster, slot = int(ram["cluster"]), int(ram["slot_bytes"])
        res, work = int(ram["resident_slots"]), int(ram["working_slots"])
        per_layer = [int(v) for v in ram["resident_clusters"]]
        base, over = int(ram["base_bytes"]), int(ram["overhead_bytes"])
        cache, total, budget = (int(ram[k]) for k in ("cache_bytes", "total_bytes", "budget_bytes"))
        st = ram["storage"]
        for k in ("reads_per_token", "bytes_per_token", "read_bw_gbs", "iops"):
            float(st[k])
        if st["time_per_token_s"] is not None:
            float(st["time_per_token_s"])
    except (KeyError, TypeError, ValueError) as e:
        return f"the ram section lacks or garbles {e}"
    if cluster < 1 or slot <= 0 or slot % STORE_ALIGN or min(res, work, base, over) < 0:
        return "cluster, slot_bytes and the counts must be positive"
    if len(ram_neurons) != len(gpu_neurons) or len(per_layer) != len(gpu_neurons):
        return f"{len(ram_neurons)} layers of RAM neurons for {len(gpu_neurons)} layers"
    for i, (ids, gpu) in enumerate(zip(ram_neurons, gpu_neurons)):
        if ids.ndim != 1 or (ids.size and (ids[0] < 0 or ids[-1] >= ffn_dim)):
            return f"blk.{i}.ram_neurons has ids outside [0, {ffn_dim})"
        if ids.size > 1 and not (np.diff(ids) > 0).all():
            return f"blk.{i}.ram_neurons is not sorted and unique"
        if np.intersect1d(ids, gpu).size:
            return f"blk.{i}: neurons both on the GPU and resident in RAM"
        if np.unique(ids // cluster).size != per_layer[i]:
            return f"blk.{i}: RAM neurons span other than the {per_layer[i]} clusters recorded"
    if sum(per_layer) != res:
        return f"resident clusters per layer sum to {sum(per_layer)}, not {res}"
    if cache != (res + work) * slot or total != base + over + cache:
        return "the cache and total bytes do not add up"
    if total > budget:
        return f"{total} bytes over the RAM budget of {budget}"
    return None


__all__ = [
    "DEFAULT_OVERHEAD",
    "STORE_ALIGN",
    "base_ram_bytes",
    "check_ram_tier",
    "cluster_bytes",
    "cluster_probabilities",
    "plan_ram_tier",
    "store_frequencies",
]
