"""The plan file: ``PLAN.safetensors``.

Tensors ``blk.{i}.gpu_neurons`` (int32, sorted): layer ``i``'s hot set, the neurons whose rows
live on the GPU (the neuron table; cold = the rest). Metadata (str -> str): ``format`` =
``powerinfer-rs-plan/1``, ``model_fingerprint``, ``budget_bytes``, ``gpu_bytes`` and ``plan``, a
JSON object with everything else: hardware profile, context, objective, bucket size, placement
flags per layer (attention + KV, predictor, FFN buckets) and global (output head, embeddings),
bytes per device (per layer and total), predicted time and tokens/s, the solver's status, MIP gap
and solve time, the per-layer minimum of hot neurons, and the predictor sizes counted.

A mixture of experts whose leading dense layers (GLM-4.5's) have another neuron count than its
layers of experts records each layer's in ``layer_neurons`` (``ffn_dim`` is then the widest); a
plan without it has ``ffn_dim`` neurons in every layer.

A plan with a RAM tier (``--ram-budget``, :mod:`~powerinfer_rs.planning.ram_tier`) also has
tensors ``blk.{i}.ram_neurons`` (int32, sorted): the CPU neurons resident in RAM (the rest are
read from storage through the neuron store), and a ``ram`` object in ``plan``: the RAM budget,
base, overhead and store cache bytes, its slots, and the expected storage reads per token.

The file has one reader, the engine's (``_core.read_plan``, Rust's ``PlanRecord``):
:func:`load_plan` fills :class:`Plan` from it and checks only the planner's own sections (its GPU
bytes total and the RAM tier's figures, which the engine does not read). It refuses a plan made
for another model (:class:`PlanError`) or one needing more GPU memory than a given budget
(:class:`VramBudgetError`). :func:`save_plan` is the writer.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _core
from ..errors import PlanError, VramBudgetError
from ..loading.types import LoadedModel
from ..planning.accounting import kv_types
from ..planning.model_shape import ModelShape
from ..planning.placement import Placement
from ..planning.predictor_size import PredictorSizes
from ..planning.sizes import format_bytes

PLAN_FORMAT = "powerinfer-rs-plan/1"


@dataclass
class Plan:
    """A placement made concrete: hot neuron ids per layer plus everything the file records."""

    model_fingerprint: str
    ffn_dim: int
    gpu_neurons: list[np.ndarray]
    placement: Placement
    bucket: int
    context: int
    objective: str
    budget_bytes: int
    hardware: dict
    predictors: PredictorSizes
    bytes: dict = field(default_factory=dict)
    predicted: dict = field(default_factory=dict)
    solver: dict = field(default_factory=dict)
    min_neurons: list[int] = field(default_factory=list)
    profile: dict = field(default_factory=dict)
    #: The precision of the GPU layers' KV caches: "f16" (default) or "f32" (absent from a
    #: file: f16).
    kv_cache: str = "f16"
    #: The RAM tier: per layer the CPU neurons resident in RAM (None: no RAM tier planned).
    ram_neurons: list[np.ndarray] | None = None
    #: The RAM tier's bytes, slots and storage cost ({} without one).
    ram: dict = field(default_factory=dict)
    #: Each layer's neurons where they differ (a mixture of experts' leading dense layers:
    #: GLM-4.5; JSON ``layer_neurons``, ``ffn_dim`` the widest); None: ``ffn_dim`` in each.
    layer_neurons: list[int] | None = None

    @property
    def neuron_counts(self) -> list[int]:
        """Each layer's neurons."""
        return list(self.layer_neurons or [self.ffn_dim] * self.n_layers)

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return len(self.gpu_neurons)

    @property
    def gpu_bytes(self) -> int:
        """Total GPU bytes the plan allocates."""
        return int(self.bytes.get("gpu", {}).get("total", 0))

    @property
    def tokens_per_s(self) -> float:
        """Predicted decode speed."""
        return float(self.predicted.get("tokens_per_s", 0.0))

    def is_cpu_only(self) -> bool:
        """Whether nothing is on the GPU."""
        return not self.placement.uses_gpu()

    def check_sections(self, source: str = "plan") -> None:
        """Check the planner's own sections, which the engine does not read: the GPU bytes
        total and the RAM tier's figures; :class:`PlanError` otherwise."""
        gpu = self.bytes.get("gpu", {})
        total = gpu.get("total", 0) if isinstance(gpu, dict) else None
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise PlanError(f"{source}: bytes.gpu.total must be a non-negative integer")
        if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in self.min_neurons):
            raise PlanError(f"{source}: min_neurons must be non-negative integers")
        if self.ram_neurons is not None:
            from ..planning.ram_tier import check_ram_tier

            why = check_ram_tier(self.ram_neurons, self.ram, self.gpu_neurons, self.ffn_dim)
            if why:
                raise PlanError(f"{source}: RAM tier: {why}")
        elif self.ram:
            raise PlanError(f"{source}: a ram section without ram_neurons tensors")

    def validate(self, source: str = "plan") -> None:
        """Check the neuron tables against the placement, and the planner's sections, before
        the plan is written (a file read back is checked by the engine's reader);
        :class:`PlanError` otherwise."""
        pl, n = self.placement, self.n_layers
        self.check_sections(source)
        for what, items in (
            ("placement.attention", pl.attention),
            ("placement.predictor", pl.predictor),
            ("placement.ffn_buckets", pl.ffn_buckets),
            ("predictors.allocations", self.predictors.allocations),
            ("predictors.ranks", self.predictors.ranks),
        ):
            if len(items) != n:
                raise PlanError(f"{source}: {what} has {len(items)} layers, the neuron tables {n}")
        for i, alloc in enumerate(self.predictors.allocations):
            if len(alloc) not in (1, 2) or min(alloc) < 0:
                raise PlanError(
                    f"{source}: layer {i}: predictor allocations {alloc}: expected [fc1, fc2] "
                    "or one size, non-negative"
                )
        if min(self.predictors.ranks, default=0) < 0:
            raise PlanError(f"{source}: negative predictor rank in {self.predictors.ranks}")
        try:
            kv_types(self.kv_cache)
        except PlanError as e:
            raise PlanError(f"{source}: {e}") from None
        if self.bucket <= 0 or self.context <= 0:
            raise PlanError(f"{source}: bucket and context must be positive")
        counts = self.neuron_counts
        if len(counts) != n or max(counts, default=0) != self.ffn_dim:
            raise PlanError(f"{source}: layer_neurons {counts} for {n} layers of {self.ffn_dim}")
        for i, ids in enumerate(self.gpu_neurons):
            if ids.ndim != 1 or (ids.size and (ids[0] < 0 or ids[-1] >= counts[i])):
                raise PlanError(f"{source}: blk.{i}.gpu_neurons has ids outside [0, {counts[i]})")
            if ids.size > 1 and not (np.diff(ids) > 0).all():
                raise PlanError(f"{source}: blk.{i}.gpu_neurons is not sorted and unique")
            if -(-ids.size // self.bucket) != pl.ffn_buckets[i]:
                raise PlanError(
                    f"{source}: layer {i} has {ids.size} hot neurons but {pl.ffn_buckets[i]} "
                    f"buckets of {self.bucket}"
                )

    def to_json(self) -> dict:
        """The metadata JSON object (everything but the neuron ids)."""
        pl = self.placement
        return {
            "format": PLAN_FORMAT,
            "model_fingerprint": self.model_fingerprint,
            "n_layers": self.n_layers,
            "ffn_dim": self.ffn_dim,
            **({"layer_neurons": list(self.layer_neurons)} if self.layer_neurons else {}),
            "budget_bytes": self.budget_bytes,
            "hardware": self.hardware,
            "context": self.context,
            "kv_cache": self.kv_cache,
            "objective": self.objective,
            "bucket": self.bucket,
            "placement": {
                "attention": [bool(v) for v in pl.attention],
                "kv_cache": [bool(v) for v in pl.attention],
                "predictor": [bool(v) for v in pl.predictor],
                "ffn_buckets": [int(v) for v in pl.ffn_buckets],
                "gpu_neuron_count": [int(n.size) for n in self.gpu_neurons],
                "output": bool(pl.output),
                "embeddings": False,
            },
            "bytes": self.bytes,
            "predicted": self.predicted,
            "solver": self.solver,
            "min_neurons": [int(m) for m in self.min_neurons],
            "predictors": self.predictors.to_dict(),
            "profile": self.profile,
            **({"ram": self.ram} if self.ram_neurons is not None else {}),
        }


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write ``plan`` as a safetensors file (atomically); returns the path."""
    from safetensors.numpy import save_file

    plan.validate()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"blk.{i}.gpu_neurons": np.ascontiguousarray(ids, dtype=np.int32)
        for i, ids in enumerate(plan.gpu_neurons)
    }
    for i, ids in enumerate(plan.ram_neurons or []):
        tensors[f"blk.{i}.ram_neurons"] = np.ascontiguousarray(ids, dtype=np.int32)
    meta = {
        "format": PLAN_FORMAT,
        "model_fingerprint": plan.model_fingerprint,
        "budget_bytes": str(plan.budget_bytes),
        "gpu_bytes": str(plan.gpu_bytes),
        "plan": json.dumps(plan.to_json()),
    }
    tmp = out.with_name(out.name + ".part")
    save_file(tensors, str(tmp), meta)
    os.replace(tmp, out)
    return out


#: The engine reader's placement entries, in :class:`Placement`'s order.
_PLACEMENT_KEYS = ("attention", "predictor", "ffn_buckets", "output")


def _read(path: Path) -> Plan:
    """The plan at ``path``, read by the engine's reader (``_core.read_plan``: the neuron
    tables, placement, predictor sizes and RAM tier ids, with the engine's checks and its
    PlanError texts); the planner's own sections (hardware, bytes, predicted speed, solver
    report, the RAM tier's arithmetic) taken from its JSON and checked here."""
    r = _core.read_plan(path)
    try:
        j = json.loads(r["json"])
        plan = Plan(
            model_fingerprint=r["model_fingerprint"],
            ffn_dim=r["ffn_dim"],
            gpu_neurons=list(r["gpu_neurons"]),
            placement=Placement(*(r[k] for k in _PLACEMENT_KEYS)),
            bucket=r["bucket"],
            context=r["context"],
            objective=str(j["objective"]),
            budget_bytes=r["budget_bytes"],
            hardware=dict(j["hardware"]),
            predictors=PredictorSizes(
                r["predictor_allocations"],
                r["predictor_ranks"],
                str(j["predictors"].get("source", "")),
            ),
            bytes=dict(j["bytes"]),
            predicted=dict(j["predicted"]),
            solver=dict(j["solver"]),
            min_neurons=list(j.get("min_neurons", [])),
            profile=dict(j.get("profile", {})),
            kv_cache=r["kv_cache"],
            ram_neurons=r["ram_neurons"],
            ram=dict(j["ram"]) if r["ram_neurons"] is not None else {},
            layer_neurons=list(j["layer_neurons"]) if "layer_neurons" in j else None,
        )
    except Exception as e:  # a planner section missing or of another type
        raise PlanError(f"{path}: not a readable plan file: {e!r}") from None
    plan.check_sections(str(path))
    return plan


def load_plan(
    path: str | os.PathLike[str],
    model: LoadedModel | ModelShape | None = None,
    budget_bytes: int | None = None,
) -> Plan:
    """Read a plan; with ``model``, refuse one made for another model; with ``budget_bytes``,
    refuse one whose GPU allocations exceed it.

    Raises :class:`PlanError` (unreadable file, another model's fingerprint or shape, byte
    accounting that disagrees with the model) and :class:`VramBudgetError` (over budget).
    """
    from ..planning.accounting import gpu_allocation, total_bytes

    p = Path(path)
    plan = _read(p)
    if model is not None:
        shape = ModelShape.coerce(model)
        if plan.model_fingerprint != shape.fingerprint:
            raise PlanError(
                f"{p} was made for model {plan.model_fingerprint or '(unknown)'}, not this one "
                f"({shape.fingerprint or '(unknown)'}); plan again for this model"
            )
        if plan.neuron_counts != shape.neuron_counts:
            raise PlanError(
                f"{p}: plan is for {plan.n_layers} layers x {_shown(plan.neuron_counts)} "
                f"neurons, the model has {shape.config.n_layers} x {_shown(shape.neuron_counts)}"
            )
        actual = total_bytes(gpu_allocation(plan, shape))
        if actual != plan.gpu_bytes:
            raise PlanError(
                f"{p}: the plan records {plan.gpu_bytes} GPU bytes but its allocations on this "
                f"model come to {actual}"
            )
    if budget_bytes is not None and plan.gpu_bytes > budget_bytes:
        raise VramBudgetError(
            f"{p} needs {format_bytes(plan.gpu_bytes)} ({plan.gpu_bytes} B) of GPU memory, more "
            f"than the budget of {format_bytes(budget_bytes)} ({budget_bytes} B)"
        )
    return plan


def _shown(counts: list[int]) -> str:
    """Layer neuron counts as a message shows them: one number when they agree."""
    return str(counts[0]) if counts and len(set(counts)) == 1 else str(counts)


__all__ = ["PLAN_FORMAT", "Plan", "load_plan", "save_plan"]
