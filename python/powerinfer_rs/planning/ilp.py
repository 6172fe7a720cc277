"""The placement integer program, solved with HiGHS (highspy).

Implements the model of ``planner/README.md`` in its *one choice per layer* form: instead of the
prefix binaries ``x[l,b] >= x[l,b+1]`` it has ``y[l,k] = x[l,k-1] - x[l,k]`` = "layer ``l`` has
exactly its ``k`` hottest buckets on the GPU", one of them set per layer. The feasible sets are
the same (``x[l,b] = sum_{k>b} y[l,k]``, ``z[l] = 1 - y[l,0]``, the minimum ``m_l`` removes the
columns ``0 < k < k0_l``), but this form's LP relaxation is the convex hull of each layer's
choices, so HiGHS closes the gap at the root instead of separating thousands of cuts.

Columns, per layer: ``y[l,k]`` for the allowed ``k``, ``a[l]`` (attention + KV on GPU),
``p[l]`` (predictor on GPU) and, for the time objective, the continuous ``full[l]`` (the whole
layer on the GPU) and ``none[l]`` (none of it); then ``h`` (output head) and ``u`` (anything on
the GPU: scratch allocated). Bytes enter in MiB and time in microseconds for conditioning; the
placement is re-measured exactly by :func:`.cost_model.evaluate` afterwards. A part the GPU
cannot hold (a format without GPU kernels) has its column bounded to 0 (``a``, ``h``) or its
layer's options cut to ``k = 0``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

import numpy as np

from .._lazy import optional_import
from ..errors import PlanError
from .cost_model import mass_weights, time_terms
from .placement import Placement
from .problem import PlacementProblem
from .solve_result import SolveResult

#: Relative MIP gap at which HiGHS stops: 0.1 % of the objective (time: ~80 us of ~80 ms).
DEFAULT_MIP_GAP = 1e-3
_MIB = float(2**20)
_US = 1e6


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """File descriptor 1 to /dev/null for the block (C++ output bypasses ``sys.stdout``)."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no fd 1 (closed or embedded): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


class _Model:
    """Columns and rows (as COO triplets) collected before handing them to HiGHS."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.integer: list[bool] = []
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []

    def cols(self, cost, ub: float = 1.0, integer: bool = True) -> np.ndarray:
        """New columns in ``[0, ub]`` with the given costs; returns their indices."""
        cost = np.atleast_1d(np.asarray(cost, dtype=np.float64))
        start = len(self.cost)
        self.cost.extend(cost.tolist())
        self.lo.extend([0.0] * cost.size)
        self.hi.extend([ub] * cost.size)
        self.integer.extend([integer] * cost.size)
        return np.arange(start, start + cost.size)

    def row(self, cols, vals, lo: float, hi: float) -> None:
        """One row ``lo <= sum vals * col <= hi``."""
        cols = np.asarray(cols, dtype=np.int32).ravel()
        self.r.append(np.full(cols.size, len(self.row_lo), dtype=np.int32))
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, dtype=np.float64), cols.shape).copy())
        self.row_lo.append(lo)
        self.row_hi.append(hi)

    def to_highs(self, highspy, minimize: bool, offset: float):
        """A ``HighsLp`` with a row-wise matrix."""
        r, c, v = np.concatenate(self.r), np.concatenate(self.c), np.concatenate(self.v)
        order = np.argsort(r, kind="stable")
        m, n = len(self.row_lo), len(self.cost)
        start = np.zeros(m + 1, dtype=np.int32)
        np.cumsum(np.bincount(r, minlength=m), out=start[1:])
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, m
        lp.col_cost_ = np.asarray(self.cost)
        lp.col_lower_ = np.asarray(self.lo)
        lp.col_upper_ = np.asarray(self.hi)
        lp.row_lower_ = np.asarray(self.row_lo)
        lp.row_upper_ = np.asarray(self.row_hi)
        lp.offset_ = offset
        lp.sense_ = highspy.ObjSense.kMinimize if minimize else highspy.ObjSense.kMaximize
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = c[order]
        lp.a_matrix_.value_ = v[order]
        kint, kcont = highspy.HighsVarType.kInteger, highspy.HighsVarType.kContinuous
        lp.integrality_ = [kint if k else kcont for k in self.integer]
        return lp


def layer_options(p: PlacementProblem, i: int) -> np.ndarray:
    """The allowed bucket counts of layer ``i``: 0 and ``k0_l .. K_l`` (only 0 when the GPU
    cannot hold the layer's FFN)."""
    lt = p.layers[i]
    if not lt.ffn_gpu:
        return np.zeros(1, dtype=np.int64)
    return np.concatenate([[0], np.arange(lt.min_buckets, lt.n_buckets + 1)]).astype(np.int64)


def _undominated(ks: np.ndarray, value: np.ndarray, keep_last: bool) -> np.ndarray:
    """Mask of the options no smaller option beats (``value``: higher is better).

    Dropping option ``k`` when some ``k' < k`` is at least as good is exact: ``k'`` uses fewer
    bytes, and the only other columns a layer's choice touches (``none``/``u`` via ``k = 0``,
    ``full`` via ``k = K``) only get more room. ``k = 0`` and, when ``keep_last``, ``k = K`` are
    always kept.
    """
    keep = np.zeros(ks.size, dtype=bool)
    best = -np.inf
    for j, v in enumerate(value):
        if j == 0 or (keep_last and j == ks.size - 1) or v > best:
            keep[j] = True
        best = max(best, v)
    return keep


def _start_column_values(
    p: PlacementProblem, n_cols: int, per_layer, pl: Placement, h: int, u: int, value_of
) -> np.ndarray:
    """Column values of placement ``pl`` (the greedy start), mapped onto the kept options (the
    best kept option with at most ``pl``'s buckets: no more bytes, no worse value)."""
    x = np.zeros(n_cols)
    any_gpu = pl.output
    for i, (ks, y, a, pr, full, none) in enumerate(per_layer):
        allowed = np.flatnonzero(ks <= pl.ffn_buckets[i])
        j = allowed[np.argmax(value_of[i][allowed])]
        k = int(ks[j])
        at, pd = bool(pl.attention[i]), bool(pl.predictor[i])
        x[y[j]] = 1.0
        x[a], x[pr] = float(at), float(pd)
        if full >= 0:
            x[full] = float(at and pd and k == p.layers[i].n_buckets)
            x[none] = float(not at and not pd and k == 0)
        any_gpu = any_gpu or at or pd or k > 0
    x[h] = float(pl.output)
    x[u] = float(any_gpu)
    return x


class _Program:
    """The integer program of a :class:`PlacementProblem` as it is built: the HiGHS model,
    each layer's columns ``(ks, y, a, p, full, none)`` and option values, the budget row's
    terms, the objective's constant and the shared columns ``h`` and ``u``."""

    def __init__(self, p: PlacementProblem, inf: float) -> None:
        self.p = p
        self.inf = inf
        self.timed = p.objective == "time"
        self.md = _Model()
        self.per_layer: list[tuple] = []
        self.value_of: list[np.ndarray] = []
        self.budget_cols: list[np.ndarray] = []
        self.budget_vals: list[np.ndarray] = []
        self.offset = 0.0
        if self.timed:
            self.tt = time_terms(p)
            self.offset = self.tt.constant * _US
        else:
            self.mw = mass_weights(p)
        self.h = self.u = -1

    def option_values(self, i: int, ks: np.ndarray) -> np.ndarray:
        """Layer ``i``'s value of each bucket count in ``ks`` (higher is better): minus its
        FFN time in us, or the activation mass its buckets serve."""
        if self.timed:
            tt = self.tt
            gpu = np.concatenate([[0.0], np.cumsum(tt.bucket_gpu[i])])[ks] + tt.ffn_launch
            cpu = np.concatenate([[0.0], np.cumsum(tt.bucket_cpu[i][::-1])])[::-1][ks]
            return -np.where(ks > 0, np.maximum(gpu, cpu), cpu) * _US
        return np.concatenate([[0.0], np.cumsum(self.mw.buckets[i])])[ks] / self.mw.total

    def add_layer(self, i: int) -> None:
        """Layer ``i``'s columns, its one-choice row and its terms of the budget row."""
        lt, md, inf = self.p.layers[i], self.md, self.inf
        ks = layer_options(self.p, i)
        value = self.option_values(i, ks)
        keep = _undominated(ks, value, keep_last=self.timed)
        ks, value = ks[keep], value[keep]
        self.value_of.append(value)
        nbytes = np.where(ks > 0, lt.ffn_fixed_bytes + ks * lt.slab_bytes, 0)
        full = none = -1
        a_ub = 1.0 if lt.attn_gpu else 0.0  # refused attention stays on the CPU
        # A layer without predictor bytes (a mode without predictors) has nothing to place.
        has_pred = lt.pred_bytes > 0
        p_ub = 1.0 if has_pred else 0.0
        if self.timed:
            tt = self.tt
            y = md.cols(-value)
            a = md.cols((tt.attn_gpu[i] - tt.attn_cpu[i]) * _US, ub=a_ub)[0]
            pr = md.cols((tt.pred_gpu[i] - tt.pred_cpu[i]) * _US, ub=p_ub)[0]
            full, none = md.cols([-tt.sync * _US, -tt.sync * _US], integer=False)
            self.offset += (tt.attn_cpu[i] + tt.pred_cpu[i] + tt.sync + tt.router[i]) * _US
            self._whole_layer_rows(ks, lt, y, a, pr, full, none, has_pred)
        else:
            y = md.cols(value)
            a = md.cols(self.mw.attention[i] / self.mw.total, ub=a_ub)[0]
            pr = md.cols(self.mw.predictor[i] / self.mw.total, ub=p_ub)[0]
        md.row(y, 1.0, 1.0, 1.0)  # exactly one choice per layer
        if has_pred and ks[0] == 0:
            # A predictor on the GPU serves the layer's hot neurons: a layer without any runs
            # its FFN, predictor included, on the CPU (p <= 1 - y[0]).
            md.row([pr, y[0]], [1.0, 1.0], -inf, 1.0)
        self.per_layer.append((ks, y, a, pr, full, none))
        self.budget_cols += [y, np.array([a, pr])]
        self.budget_vals += [nbytes / _MIB, np.array([lt.attn_bytes, lt.pred_bytes]) / _MIB]

    def _whole_layer_rows(self, ks, lt, y, a, pr, full, none, has_pred: bool) -> None:
        """full <= y[K], a, p ; none <= y[0], 1 - a, 1 - p. A mixture of experts routes on
        the CPU: never wholly on the GPU."""
        md, inf = self.md, self.inf
        if ks[-1] == lt.n_buckets and not lt.moe:
            md.row([full, y[-1]], [1.0, -1.0], -inf, 0.0)
        else:
            md.row([full], [1.0], -inf, 0.0)
        md.row([full, a], [1.0, -1.0], -inf, 0.0)
        if has_pred:
            md.row([full, pr], [1.0, -1.0], -inf, 0.0)
        md.row([none, y[0]], [1.0, -1.0], -inf, 0.0)
        md.row([none, a], [1.0, 1.0], -inf, 1.0)
        md.row([none, pr], [1.0, 1.0], -inf, 1.0)

    def add_output_and_budget(self) -> None:
        """The output head's column ``h``, the anything-on-the-GPU column ``u`` (the scratch)
        with its rows, and the budget row."""
        p, md, inf = self.p, self.md, self.inf
        h_ub = 1.0 if p.output_gpu else 0.0
        if self.timed:
            self.h = md.cols((self.tt.out_gpu - self.tt.out_cpu) * _US, ub=h_ub)[0]
            self.offset += self.tt.out_cpu * _US
        else:
            self.h = md.cols(self.mw.output / self.mw.total, ub=h_ub)[0]
        u = self.u = md.cols(0.0)[0]
        for _ks, y, a, pr, _f, _n in self.per_layer:
            md.row([u, y[0]], [1.0, 1.0], 1.0, inf)  # u >= 1 - y[l,0]
            md.row([u, a], [1.0, -1.0], 0.0, inf)
            md.row([u, pr], [1.0, -1.0], 0.0, inf)
        md.row([u, self.h], [1.0, -1.0], 0.0, inf)
        self.budget_cols.append(np.array([self.h, u]))
        self.budget_vals.append(np.array([p.output_bytes, p.scratch_bytes]) / _MIB)
        cols, vals = np.concatenate(self.budget_cols), np.concatenate(self.budget_vals)
        md.row(cols, vals, -inf, p.budget / _MIB)

    def placement(self, sol: np.ndarray) -> Placement:
        """The placement of the solution's column values ``sol``."""
        per_layer = self.per_layer
        return Placement(
            attention=[bool(sol[c[2]] > 0.5) for c in per_layer],
            predictor=[bool(sol[c[3]] > 0.5) for c in per_layer],
            ffn_buckets=[int(c[0][np.argmax(sol[c[1]])]) for c in per_layer],
            output=bool(sol[self.h] > 0.5),
        )


def solve_ilp(
    p: PlacementProblem,
    *,
    time_limit: float = 10.0,
    mip_rel_gap: float = DEFAULT_MIP_GAP,
    start: Placement | None = None,
    log: bool = False,
) -> SolveResult:
    """Solve ``p`` with HiGHS, optionally warm-started from the placement ``start``.

    Raises :class:`UnsupportedError` without highspy (the ``powerinfer-rs[plan]`` extra) and
    :class:`PlanError` when HiGHS finds no feasible solution in time (callers fall back to
    greedy).
    """
    highspy = optional_import("highspy", "the ILP solver")

    t0 = time.perf_counter()
    prog = _Program(p, highspy.kHighsInf)
    for i in range(len(p.layers)):
        prog.add_layer(i)
    prog.add_output_and_budget()
    md = prog.md
    with contextlib.nullcontext() if log else _stdout_silenced():
        hs = highspy.Highs()  # the first one of a process prints HiGHS's banner on fd 1
    hs.setOptionValue("output_flag", bool(log))
    # Presolve's probing over the per-layer choice rows costs seconds (tens on 70B shapes) and
    # removes nothing here; the LP relaxation is already tight.
    hs.setOptionValue("presolve", "off")
    hs.setOptionValue("time_limit", float(time_limit))
    hs.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    hs.passModel(md.to_highs(highspy, prog.timed, prog.offset))
    if start is not None:
        sol0 = highspy.HighsSolution()
        sol0.col_value = _start_column_values(
            p, len(md.cost), prog.per_layer, start, prog.h, prog.u, prog.value_of
        )
        sol0.value_valid = True
        hs.setSolution(sol0)
    hs.run()
    status = hs.getModelStatus()
    info = hs.getInfo()
    status_s = hs.modelStatusToString(status)
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        raise PlanError(f"HiGHS found no feasible placement ({status_s})")
    obj = float(info.objective_function_value)
    label = "optimal" if status == highspy.HighsModelStatus.kOptimal else f"{status_s} (feasible)"
    return SolveResult(
        placement=prog.placement(np.asarray(hs.getSolution().col_value)),
        solver="highs",
        status=label,
        objective=obj / _US if prog.timed else obj,
        mip_gap=float(info.mip_gap),
        solve_time_s=time.perf_counter() - t0,
        note=f"{len(md.cost)} columns, {len(md.row_lo)} rows",
    )


__all__ = ["DEFAULT_MIP_GAP", "layer_options", "solve_ilp"]
