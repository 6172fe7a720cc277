"""Make a plan: build the problem, solve it (HiGHS, greedy fallback), record the result."""

from __future__ import annotations

import json
import time

import numpy as np

from ..errors import PlanError, UnsupportedError, VramBudgetError
from ..formats.plan import Plan
from ..formats.profile import Profile
from ..loading.types import LoadedModel
from .accounting import placement_allocation, total_bytes
from .cost_model import evaluate
from .greedy import solve_greedy
from .hardware_profile import HardwareProfile
from .ilp import DEFAULT_MIP_GAP, solve_ilp
from .model_shape import ModelShape
from .placement import Placement
from .predictor_size import PredictorSizes, default_predictor_sizes, fixed_predictor_sizes
from .problem import PlacementProblem, build_problem
from .sizes import format_bytes
from .solve_result import SolveResult

SOLVERS = ("auto", "highs", "greedy")
#: How a mixture of experts' plan places its experts: "neurons" (the integer program over the
#: flattened neurons, hot experts and hot neurons inside warm experts), "n-cpu-moe" (llama.cpp's
#: ``--n-cpu-moe``, :func:`n_cpu_moe`).
MOE_POLICIES = ("neurons", "n-cpu-moe")


def solve(
    problem: PlacementProblem,
    *,
    solver: str = "auto",
    time_limit: float = 10.0,
    mip_gap: float = DEFAULT_MIP_GAP,
    log: bool = False,
) -> SolveResult:
    """Solve ``problem``: ``"highs"`` (the ILP, warm-started from greedy), ``"greedy"``, or
    ``"auto"`` (HiGHS, falling back to greedy when highspy is missing or HiGHS fails).

    The result is always feasible under exact accounting: an ILP answer that rounding pushed
    over the budget is replaced by the greedy one (and says so in ``note``).
    """
    if solver not in SOLVERS:
        raise PlanError(f"solver {solver!r}: choose one of {', '.join(SOLVERS)}")
    greedy = solve_greedy(problem)
    if solver == "greedy":
        return greedy
    try:
        res = solve_ilp(
            problem, time_limit=time_limit, mip_rel_gap=mip_gap, start=greedy.placement, log=log
        )
    except UnsupportedError:
        if solver == "highs":
            raise
        greedy.note = "highspy is not installed: greedy fallback"
        return greedy
    except PlanError as e:
        if solver == "highs":
            raise
        greedy.note = f"HiGHS failed ({e}): greedy fallback"
        return greedy
    ev = evaluate(problem, res.placement)
    if not ev.feasible:
        greedy.note = f"HiGHS answer infeasible after rounding ({ev.reason}): greedy fallback"
        return greedy
    return res


def default_sparsity(shape: ModelShape) -> str:
    """The mode a plan is for when none is named: predictor, or for a mixture of experts
    exact-relu with ReLU experts (SmallThinker's ReGLU), else dense."""
    if shape.moe:
        return "exact-relu" if shape.config.activation == "relu" else "dense"
    return "predictor"


def n_cpu_moe(problem: PlacementProblem) -> SolveResult:
    """llama.cpp's ``--n-cpu-moe`` as a placement of a mixture of experts: attention with its KV
    cache, the shared expert (the hottest buckets, :mod:`.problem` puts it first) and the output
    head on the GPU wherever the GPU can hold them; then, from the last layer down, every
    routed expert of a layer while the budget holds them all (``--n-cpu-moe N`` keeps the
    experts of the first N layers on the CPU). A baseline to compare the neuron placement with
    on the same budget. :class:`VramBudgetError` when the budget cannot hold the base part."""
    t0 = time.perf_counter()
    p = problem
    shared = [p.shape.layer_shared(i) for i in range(len(p.layers))]
    base = [-(-s // p.bucket) if lt.ffn_gpu else 0 for s, lt in zip(shared, p.layers)]
    pl = Placement(
        attention=[lt.attn_gpu for lt in p.layers],
        predictor=[False] * len(p.layers),
        ffn_buckets=base,
        output=p.output_gpu,
    )
    ev = evaluate(p, pl)
    if not ev.feasible:
        raise VramBudgetError(
            f"the n-cpu-moe baseline (attention, KV caches, shared experts and the output head "
            f"on the GPU) needs {format_bytes(ev.gpu_bytes)}, more than the budget of "
            f"{format_bytes(p.budget)} ({ev.reason})"
        )
    on = 0
    for i in reversed(range(len(p.layers))):
        lt = p.layers[i]
        if not lt.ffn_gpu:
            break
        trial = Placement(
            list(pl.attention),
            list(pl.predictor),
            [lt.n_buckets if j == i else k for j, k in enumerate(pl.ffn_buckets)],
            pl.output,
        )
        if not evaluate(p, trial).feasible:
            break
        pl, on = trial, on + 1
    n_cpu = len(p.layers) - on
    return SolveResult(
        placement=pl,
        solver="n-cpu-moe",
        status=f"experts of the last {on} layers on the GPU (llama.cpp --n-cpu-moe {n_cpu})",
        objective=evaluate(p, pl).time_per_token,
        mip_gap=None,
        solve_time_s=time.perf_counter() - t0,
    )


def hot_neurons(problem: PlacementProblem, placement: Placement) -> list[np.ndarray]:
    """Per layer, the sorted ids of the neurons ``placement`` puts on the GPU."""
    out = []
    for lt, k in zip(problem.layers, placement.ffn_buckets):
        n = int(lt.sizes[:k].sum())
        out.append(np.sort(lt.order[:n]).astype(np.int64))
    return out


def plan_from_solution(problem: PlacementProblem, res: SolveResult, profile: Profile) -> Plan:
    """Assemble the :class:`Plan` of a solved problem, with bytes and predictions recorded."""
    p, pl = problem, res.placement
    refused = p.refusals()
    if refused:
        more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
        kept = f"kept on the CPU, the GPU cannot hold them: {refused[0]}{more}"
        res.note = "; ".join(n for n in (res.note, kept) if n)
    ev = evaluate(p, pl)
    allocs = placement_allocation(
        p.shape,
        pl,
        bucket=p.bucket,
        context=p.context,
        predictors=p.predictors,
        kv_cache=p.kv_cache,
    )
    gpu_total = total_bytes(allocs)
    if gpu_total != ev.gpu_bytes:  # the two accountings are one definition; never differs
        raise PlanError(f"internal accounting mismatch: {gpu_total} != {ev.gpu_bytes}")
    try:
        corpus = json.loads(profile.meta.get("corpus", "[]"))
    except (ValueError, RecursionError):
        corpus = []
    predicted = {
        "sparsity": p.sparsity,
        "tokens_per_s": ev.tokens_per_s,
        "time_per_token_s": ev.time_per_token,
        "layer_time_s": ev.layer_time,
        "output_time_s": ev.output_time,
        "cpu_time_per_token_s": ev.cpu_time_per_token,
        "layer_cpu_time_s": ev.layer_cpu_time,
        "layer_split": ev.split,
        "mass_share": ev.mass_share,
        "layer_mass_share": ev.layer_mass_share,
        "mass_objective": ev.mass_objective,
    }
    counts = p.shape.neuron_counts
    if p.shape.moe:
        predicted["moe_policy"] = "n-cpu-moe" if res.solver == "n-cpu-moe" else "neurons"
    return Plan(
        model_fingerprint=p.shape.fingerprint,
        ffn_dim=max(p.shape.neuron_counts),
        layer_neurons=None if len(set(counts)) == 1 else counts,
        gpu_neurons=hot_neurons(p, pl),
        placement=pl,
        bucket=p.bucket,
        context=p.context,
        kv_cache=p.kv_cache,
        objective=p.objective,
        budget_bytes=p.budget,
        hardware=p.hardware.to_dict(),
        predictors=p.predictors,
        bytes={
            "gpu": {
                "total": gpu_total,
                "per_layer": ev.layer_gpu_bytes,
                "global": ev.global_gpu_bytes,
            },
            "cpu": {
                "total": sum(ev.layer_cpu_bytes) + ev.global_cpu_bytes,
                "per_layer": ev.layer_cpu_bytes,
                "global": ev.global_cpu_bytes,
            },
            "alignment": 256,
        },
        predicted=predicted,
        solver=res.to_dict(),
        min_neurons=[lt.min_neurons for lt in p.layers],
        profile={
            "tokens": int(profile.tokens),
            "model_fingerprint": profile.model_fingerprint,
            "corpus": corpus,
        },
    )


def refuse_non_flat(shape: ModelShape) -> None:
    """:class:`UnsupportedError` for multi-head latent attention (a mixture of experts' leading
    dense layers, GLM-4.5's, are planned over their own neurons; gpt-oss's biased experts and
    attention sinks over its flattened experts, the biases and sinks on the GPU with them)."""
    if getattr(shape.config, "mla_kv_lora_rank", 0):
        raise UnsupportedError(
            "a plan of multi-head latent attention (DeepSeek-V2/V3): its latent KV cache and "
            "absorbed projections have no GPU side; such a model runs dense on the CPU"
        )


def make_plan(
    model: LoadedModel | ModelShape,
    profile: Profile,
    hardware: HardwareProfile,
    budget: int,
    *,
    objective: str = "time",
    bucket: int = 64,
    context: int = 4096,
    predictors: PredictorSizes | None = None,
    min_neurons: int | None = None,
    kv_cache: str = "f16",
    sparsity: str | None = None,
    moe_policy: str = "neurons",
    solver: str = "auto",
    time_limit: float = 10.0,
    mip_gap: float = DEFAULT_MIP_GAP,
    check_fingerprint: bool = True,
    log: bool = False,
    ram_budget: int | None = None,
    store_cluster: int = 1,
    ram_overhead: int | None = None,
) -> Plan:
    """Plan ``model`` (a loaded model or just its :class:`ModelShape`) on ``hardware`` within
    ``budget`` GPU bytes, from the activation ``profile``.

    ``objective``: "time" (default) minimises the cost model's time per token, and also solves
    "mass" and keeps that plan where the cost model rates it faster (the time ILP stops within
    its MIP gap); "mass" maximises the activation mass the GPU serves (PowerInfer's objective),
    which can be rated slower than the time plan. ``kv_cache``: the precision of the GPU
    layers' KV caches, "f16" (default) or "f32", as the engine that runs the plan holds it.
    ``sparsity``: the FFN mode the plan is for ("predictor", the default; "exact-relu",
    "threshold", "dense"): what a neuron costs per token in the time objective and the minimum
    of hot neurons per layer (exact-relu reads every cold neuron's gate row on the CPU); a
    mixture of experts runs "dense" or "exact-relu". ``moe_policy`` (a mixture of experts):
    "neurons" (default: the solver places hot experts and hot neurons inside warm experts) or
    "n-cpu-moe" (llama.cpp's baseline, :func:`n_cpu_moe`; the solver is not used).

    ``ram_budget`` (bytes) adds the RAM tier (:mod:`.ram_tier`): of the neurons the GPU does
    not hold, the ones resident in RAM under that budget (the neuron store's resident clusters,
    of ``store_cluster`` neurons; ``ram_overhead`` bytes kept for the process, default 256 MiB)
    and the rest read from storage, priced with ``hardware``'s measured storage.

    Raises :class:`PlanError` when the profile was made on another model (unless
    ``check_fingerprint`` is False), :class:`ShapeError` when it does not fit the model's shape,
    :class:`VramBudgetError` for a budget the hardware cannot hold, and
    :class:`UnsupportedError` for gpt-oss's biased experts or latent attention.
    """
    shape = ModelShape.coerce(model)
    refuse_non_flat(shape)
    if (
        check_fingerprint
        and profile.model_fingerprint
        and shape.fingerprint
        and profile.model_fingerprint != shape.fingerprint
    ):
        raise PlanError(
            f"the activation profile was made on model {profile.model_fingerprint}, not on this "
            f"one ({shape.fingerprint}); profile this model (or pass --ignore-fingerprint)"
        )
    if sparsity is None:
        sparsity = default_sparsity(shape)
    if moe_policy not in MOE_POLICIES:
        raise PlanError(f"moe_policy {moe_policy!r}: choose one of {', '.join(MOE_POLICIES)}")
    if moe_policy != "neurons" and not shape.moe:
        raise PlanError(f"moe_policy {moe_policy!r} is for mixture-of-experts models")
    if predictors is not None:
        preds = predictors
    elif shape.moe:
        preds = fixed_predictor_sizes(shape.config, 0)  # experts run without predictors
    else:
        preds = default_predictor_sizes(shape.config)
    if moe_policy == "n-cpu-moe":
        problem = build_problem(
            shape,
            profile,
            hardware,
            budget,
            objective="time",
            bucket=bucket,
            context=context,
            predictors=preds,
            min_neurons=0 if min_neurons is None else min_neurons,
            kv_cache=kv_cache,
            sparsity=sparsity,
        )
        return _with_ram(
            plan_from_solution(problem, n_cpu_moe(problem), profile),
            shape,
            profile,
            hardware,
            ram_budget,
            store_cluster,
            ram_overhead,
        )

    def solved(kind: str) -> tuple[PlacementProblem, SolveResult]:
        problem = build_problem(
            shape,
            profile,
            hardware,
            budget,
            objective=kind,
            bucket=bucket,
            context=context,
            predictors=preds,
            min_neurons=min_neurons,
            kv_cache=kv_cache,
            sparsity=sparsity,
        )
        return problem, solve(
            problem, solver=solver, time_limit=time_limit, mip_gap=mip_gap, log=log
        )

    problem, res = solved(objective)
    if objective == "time":
        problem, res = _faster(problem, res, *solved("mass"))
    plan = plan_from_solution(problem, res, profile)
    return _with_ram(plan, shape, profile, hardware, ram_budget, store_cluster, ram_overhead)


def _with_ram(
    plan: Plan,
    shape: ModelShape,
    profile: Profile,
    hardware: HardwareProfile,
    ram_budget: int | None,
    cluster: int,
    overhead: int | None,
) -> Plan:
    """``plan`` with its RAM tier under ``ram_budget`` (unchanged without one)."""
    if ram_budget is None:
        return plan
    if shape.moe and shape.config.expert_bias:
        raise UnsupportedError(
            "a RAM tier for gpt-oss's biased experts: the neuron store holds no expert biases; "
            "plan without --ram-budget"
        )
    if len(set(shape.neuron_counts)) > 1:
        raise UnsupportedError(
            "a RAM tier for a mixture of experts with leading dense layers (GLM-4.5's "
            "first_k_dense_replace): the RAM tier's planner counts one neuron space for every "
            "layer; plan without --ram-budget (the neuron store itself takes such a model)"
        )
    from .ram_tier import DEFAULT_OVERHEAD, plan_ram_tier

    plan.ram_neurons, plan.ram = plan_ram_tier(
        shape,
        profile,
        plan.placement,
        plan.gpu_neurons,
        ram_budget,
        sparsity=str(plan.predicted.get("sparsity", "predictor")),
        context=plan.context,
        kv_cache=plan.kv_cache,
        predictors=plan.predictors,
        hardware=hardware,
        cluster=cluster,
        overhead=DEFAULT_OVERHEAD if overhead is None else overhead,
    )
    plan.validate()
    return plan


def _faster(
    problem: PlacementProblem, res: SolveResult, alt: PlacementProblem, alt_res: SolveResult
) -> tuple[PlacementProblem, SolveResult]:
    """The time objective's plan, or the mass objective's where the cost model rates it faster
    (the time ILP stops within its MIP gap, or at its time limit, or fell back to greedy): the
    time objective never yields a plan its own cost model rates slower than the alternative."""
    t, t_alt = evaluate(problem, res.placement), evaluate(alt, alt_res.placement)
    if not t_alt.time_per_token < t.time_per_token:
        return problem, res
    alt_res.note = "; ".join(
        n
        for n in (
            alt_res.note,
            f"objective time: the mass objective's plan is rated faster "
            f"({t_alt.tokens_per_s:.3f} vs {t.tokens_per_s:.3f} tokens/s) and was kept",
        )
        if n
    )
    return alt, alt_res


__all__ = [
    "MOE_POLICIES",
    "SOLVERS",
    "default_sparsity",
    "hot_neurons",
    "make_plan",
    "n_cpu_moe",
    "plan_from_solution",
    "solve",
]
