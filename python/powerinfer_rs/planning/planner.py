"""Make a plan: build the problem, solve it (HiGHS, greedy fallback), record the result."""

from __future__ import annotations

import json

import numpy as np

from ..errors import PlanError, UnsupportedError
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
from .predictor_size import PredictorSizes, default_predictor_sizes
from .problem import PlacementProblem, build_problem
from .solve_result import SolveResult

SOLVERS = ("auto", "highs", "greedy")


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
    return Plan(
        model_fingerprint=p.shape.fingerprint,
        ffn_dim=p.shape.config.ffn_dim,
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
        predicted={
            "sparsity": p.sparsity,
            "tokens_per_s": ev.tokens_per_s,
            "time_per_token_s": ev.time_per_token,
            "layer_time_s": ev.layer_time,
            "output_time_s": ev.output_time,
            "layer_split": ev.split,
            "mass_share": ev.mass_share,
            "layer_mass_share": ev.layer_mass_share,
            "mass_objective": ev.mass_objective,
        },
        solver=res.to_dict(),
        min_neurons=[lt.min_neurons for lt in p.layers],
        profile={
            "tokens": int(profile.tokens),
            "model_fingerprint": profile.model_fingerprint,
            "corpus": corpus,
        },
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
    sparsity: str = "predictor",
    solver: str = "auto",
    time_limit: float = 10.0,
    mip_gap: float = DEFAULT_MIP_GAP,
    check_fingerprint: bool = True,
    log: bool = False,
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
    of hot neurons per layer (exact-relu reads every cold neuron's gate row on the CPU).

    Raises :class:`PlanError` when the profile was made on another model (unless
    ``check_fingerprint`` is False), :class:`ShapeError` when it does not fit the model's shape,
    and :class:`VramBudgetError` for a budget the hardware cannot hold.
    """
    shape = ModelShape.coerce(model)
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
    preds = predictors if predictors is not None else default_predictor_sizes(shape.config)

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
    return plan_from_solution(problem, res, profile)


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


__all__ = ["SOLVERS", "hot_neurons", "make_plan", "plan_from_solution", "solve"]
