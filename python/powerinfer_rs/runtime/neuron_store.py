"""The neuron store methods of Engine: models bigger than RAM (PowerInfer-2's neuron cache).

A decoded token's sparse FFN (``sparsity="exact-relu"`` or ``"predictor"``) reads the rows of its
active neurons from a sidecar file laid out by cluster (one read fetches a cluster's up, down_t
and gate rows), through a cache of fixed size and a pool of reader threads, instead of from the
model's memory-mapped weights. Attention, exact-relu's gate rows and prefill's dense products
stay on the mapped weights. The logits are the all-resident engine's in the same mode.

A mixture of experts' store holds its routed experts' neurons (flattened: neuron ``e·E + j``
is row ``j`` of expert ``e``); a decoded token reads its routed experts from it, in dense mode
(whole clusters, gate rows included) or exact-relu (gates from the mapped rows, then the up
and down_t rows of the neurons that fire). Its shared expert stays with the mapped weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import _core
from ..errors import PlanError, ShapeError
from ..planning.sizes import format_bytes, parse_bytes
from .generation import locked

#: Neurons per cluster by default: the unit of a read and of the cache. One: at 10% of the
#: neurons firing, clusters of 4 read 3.4 times the bytes that fire (a third of the clusters hold
#: one that fires), more than one neuron's padding to 4 KiB costs (bench_neuron_store.py).
DEFAULT_CLUSTER = 1
#: Reader threads by default: reads in flight at once.
DEFAULT_IO_THREADS = 8
#: The most reader threads a store starts (the engine's bound).
MAX_IO_THREADS = _core.MAX_IO_THREADS
#: Share of the cache held by the resident hot clusters by default (with ``hot=``).
DEFAULT_RESIDENT_SHARE = 0.5
#: The store's cache by default (without a plan).
DEFAULT_CACHE = "256MiB"


def hot_clusters(counts, cluster: int, n: int) -> list[list[int]]:
    """The ``n`` hottest clusters of ``cluster`` neurons over all layers, by the summed
    activation ``counts`` of their neurons (per layer, one count per neuron: a profile's), as
    sorted cluster ids per layer."""
    scores = []
    for layer, c in enumerate(counts):
        c = np.asarray(c, dtype=np.float64)
        pad = (-c.size) % cluster
        per = np.pad(c, (0, pad)).reshape(-1, cluster).sum(axis=1)
        scores += [(float(v), layer, k) for k, v in enumerate(per)]
    scores.sort(key=lambda t: (-t[0], t[1], t[2]))
    out: list[list[int]] = [[] for _ in counts]
    for _v, layer, k in scores[: max(0, n)]:
        out[layer].append(k)
    return [sorted(ks) for ks in out]


def store_neurons(config) -> list[int]:
    """Each layer's neurons in a store: ``ffn_dim``, or for a layer of experts its routed
    neurons (``n_expert`` x the expert FFN; its shared expert stays with the mapped weights;
    ``config.layer_routed_neurons``: a mixture of experts' leading dense layers have
    ``ffn_dim``)."""
    return list(config.layer_routed_neurons)


class NeuronStoreMethods:
    """The neuron store methods of Engine (which sets ``_model``, ``ctx`` and ``loaded``)."""

    @locked
    def write_neuron_store(
        self, path: str | os.PathLike[str], *, cluster: int = DEFAULT_CLUSTER
    ) -> Path:
        """Write this model's neuron store to ``path`` (clusters of ``cluster`` neurons; the
        transposed down projections are built first). Returns the path. The file records the
        model's fingerprint; :meth:`use_neuron_store` checks it."""
        if isinstance(cluster, bool) or not isinstance(cluster, int) or not 1 <= cluster <= 4096:
            raise ShapeError(f"cluster must be an integer in 1..4096, got {cluster!r}")
        self._model.write_neuron_store(os.fspath(path), cluster, self.loaded.fingerprint)
        return Path(os.fsdecode(path))

    @locked
    def use_neuron_store(
        self,
        path: str | os.PathLike[str],
        *,
        cache: int | str | None = None,
        io_threads: int = DEFAULT_IO_THREADS,
        hot=None,
        resident_share: float = DEFAULT_RESIDENT_SHARE,
        read_ahead: bool = False,
        plan=None,
    ) -> dict:
        """Read the sparse FFN's neuron rows from the store at ``path`` from now on, through a
        cache of ``cache`` bytes ("256MiB", the default; an int) and ``io_threads`` readers.

        With ``hot`` (per layer one activation count per neuron: a
        :class:`~powerinfer_rs.formats.profile.Profile` or its ``counts``) the hottest clusters
        are loaded at once and stay resident, ``resident_share`` of the cache; the rest of it
        holds the most recently used. With ``read_ahead`` (predictor mode; off by default: it
        did not pay on a disk whose read rate was the limit already), the next layer's
        predictor runs on each layer's input and the clusters it names are read while this
        layer computes (a guess: it changes what is cached, never the result; ``ahead_used`` of
        ``ahead`` in the stats says how well it guessed). With ``plan`` (a
        :class:`~powerinfer_rs.formats.plan.Plan` with a RAM tier, or its file:
        ``python -m powerinfer_rs.plan --vram-budget 0 --ram-budget SIZE``) the cache is the
        plan's and its RAM neurons' clusters are resident (``cache`` and ``hot`` are not given
        then).

        Returns :meth:`neuron_store_stats`. ModelFileError for a file that is not this model's
        store; ShapeError for a cache smaller than one cluster or counts of another shape;
        PlanError for a plan without a RAM tier, for another model or cluster size, or one
        placing neurons on the GPU."""
        resident = None
        if plan is not None:
            if cache is not None or hot is not None:
                raise ShapeError("use_neuron_store: a plan sets the cache and the resident set")
            plan, size, resident = self._ram_tier(plan)
        else:
            size = parse_bytes(DEFAULT_CACHE if cache is None else cache)
            if size >= 1 << 63:  # the engine refuses any size past the machine's memory
                raise ShapeError(f"a neuron cache of {cache!r}: more than this machine has")
        if (
            isinstance(io_threads, bool)
            or not isinstance(io_threads, int)
            or not 1 <= io_threads <= MAX_IO_THREADS
        ):
            raise ShapeError(
                f"io_threads must be an integer in 1..{MAX_IO_THREADS}, got {io_threads!r}"
            )
        if not 0.0 <= resident_share < 1.0:
            raise ShapeError(f"resident_share must lie in [0, 1), got {resident_share}")
        self._model.open_neuron_store(
            os.fspath(path), size, io_threads, self.loaded.fingerprint, bool(read_ahead)
        )
        if resident is not None:
            s = self._model.neuron_store_stats(False)
            slot = max(s["cluster_bytes"])
            if s["cluster"] != plan.ram["cluster"] or slot != plan.ram["slot_bytes"]:
                self._model.close_neuron_store()
                raise PlanError(
                    f"the plan's RAM tier is for clusters of {plan.ram['cluster']} neurons in "
                    f"slots of {plan.ram['slot_bytes']} bytes; {path} has clusters of "
                    f"{s['cluster']} in slots of {slot} (plan with --store-cluster "
                    f"{s['cluster']}, or write the store with cluster={plan.ram['cluster']})"
                )
            self._model.neuron_store_load_resident(resident)
        elif hot is not None:
            counts = getattr(hot, "counts", hot)
            c = self.config
            # A mixture of experts' profile counts its routed neurons, then its shared
            # expert's, which the store does not hold.
            ns, want = store_neurons(c), list(c.layer_neurons)
            if len(counts) != c.n_layers or any(
                len(x) not in (n, w) for x, n, w in zip(counts, ns, want)
            ):
                self._model.close_neuron_store()
                shown = want[0] if len(set(want)) == 1 else want
                raise ShapeError(
                    f"hot counts must be {c.n_layers} layers of {shown} neurons, one count "
                    "per neuron (a profile of this model)"
                )
            counts = [np.asarray(x)[:n] for x, n in zip(counts, ns)]
            s = self._model.neuron_store_stats(False)
            n = int(resident_share * s["cache_slots"])
            self._model.neuron_store_load_resident(hot_clusters(counts, s["cluster"], n))
        return self.neuron_store_stats()

    def _ram_tier(self, plan) -> tuple:
        """The plan (read, where a path), and its RAM tier's cache bytes and resident clusters
        per layer, checked against this model."""
        from ..formats.plan import Plan, load_plan

        if not isinstance(plan, Plan):
            plan = load_plan(plan, self.loaded)
        elif plan.model_fingerprint != self.loaded.fingerprint:
            raise PlanError(
                f"the plan was made for model {plan.model_fingerprint or '(unknown)'}, not this "
                f"one ({self.loaded.fingerprint})"
            )
        if plan.ram_neurons is None:
            raise PlanError(
                "the plan has no RAM tier: make it with python -m powerinfer_rs.plan "
                "--ram-budget SIZE"
            )
        on_gpu = sum(int(n.size) for n in plan.gpu_neurons)
        if on_gpu:
            raise PlanError(
                f"the plan places {on_gpu} neurons on the GPU; the neuron store runs on the CPU "
                "engine: plan with --vram-budget 0"
            )
        ns = store_neurons(self.config)
        if any(ids.size and ids[-1] >= n for ids, n in zip(plan.ram_neurons, ns)):
            shown = ns[0] if len(set(ns)) == 1 else ns
            raise PlanError(f"the plan's RAM neurons go past the store's {shown} per layer")
        c = int(plan.ram["cluster"])
        resident = [sorted({int(i) // c for i in ids}) for ids in plan.ram_neurons]
        return plan, int(plan.ram["cache_bytes"]), resident

    @locked
    def use_down_t_file(self, path: str | os.PathLike[str]) -> bool:
        """Keep the transposed down projections the sparse modes read (one row per neuron) in
        the file at ``path``, memory-mapped, instead of an in-memory copy the size of every
        ``ffn_down``: for a machine whose memory that copy would not fit (the page cache holds
        and evicts the rows like the rest of the mapped model). Written once, reused while it
        matches this model. Call it before the first sparse token; False when the rows were
        already built (or the model file ships them, as PowerInfer's does)."""
        return bool(self._model.map_down_t(os.fspath(path), self.loaded.fingerprint))

    def close_neuron_store(self) -> None:
        """Read the neuron rows from the resident weights again."""
        with self.ctx.lock:
            self._model.close_neuron_store()

    def neuron_store_stats(self, *, reset: bool = False) -> dict:
        """The store's counts since it was opened (or last reset): ``hits`` and ``misses``
        (clusters), ``bytes_read``, ``read_s`` (seconds waiting for reads), ``ahead`` (clusters
        read ahead of their layer; counted in ``bytes_read``, their use as hits) and
        ``ahead_used`` (of those, the ones used), ``read_ahead``, ``hit_rate``,
        ``cache_slots``, ``resident_slots``, ``cluster``, ``direct`` (reads bypass the page
        cache) and ``file_bytes``; ``{}`` without a store."""
        s = self._model.neuron_store_stats(reset)
        if s is None:
            return {}
        total = s["hits"] + s["misses"]
        s["hit_rate"] = s["hits"] / total if total else 0.0
        s["file"] = format_bytes(s["file_bytes"])
        return s


__all__ = [
    "DEFAULT_CLUSTER",
    "DEFAULT_IO_THREADS",
    "DEFAULT_RESIDENT_SHARE",
    "NeuronStoreMethods",
    "hot_clusters",
    "store_neurons",
]
