"""``python -m powerinfer_rs.plan``: the plan stage as a function (:func:`plan`) and its
command (``main``: the arguments of :mod:`.plan_parser`, errors as one line)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..facts import mode_refusal
from ..planning.gpu_probe import auto_budget, detect_gpu
from ..planning.hardware_profile import FALLBACK_PROFILE, load_hardware, profile_for_gpu_name
from ..planning.ilp import DEFAULT_MIP_GAP
from ..planning.sizes import format_bytes, parse_bytes
from .args import entry_point
from .plan_parser import build_parser

__all__ = ["build_parser", "main", "measured_cpu", "plan", "run"]


def measured_cpu(profile, threads: int | None = None, ffn_format: str | None = None):
    """``profile`` with this machine's CPU: its cores, the read bandwidth the engine's threads
    reach (``_core.measure_read_bandwidth``, 256 MiB, best of 3: a second or two) and their
    start after idle (``_core.measure_dispatch``, about 50 ms), in
    place of the profile's (a shipped GPU profile assumes its server's CPU: the H200 one an
    8-channel DDR5 host at 307 GB/s, where a lent 16-core VM reached 54); and a note. With
    ``ffn_format`` (the model's FFN weight format), the CPU's bandwidth is the lower of the read
    probe and the rate its matvec reaches on that format (``_core.measure_format_bandwidth``,
    1 GiB, best of 3, in the interleaved layout the engine's dense products read): where
    decoding the format costs more than reading it (Q4_0 on few cores) that is what the CPU's
    dense parts reach. And the cold neurons' own rates (``_core.measure_rows_bandwidth``, 1 GiB
    of FFN rows read by index: firing rows at 10% listed, the gate pass with 1% firing), which
    the cost model prices the cold FFN at."""
    import dataclasses
    import os

    from .. import _core

    cores = threads or os.cpu_count() or 1
    bw = float(_core.measure_read_bandwidth(256 << 20, 3, cores))
    dispatch_us = 1e6 * float(_core.measure_dispatch(cores))
    note = (
        f"CPU measured here: {bw:.0f} GB/s with {cores} threads, their start after idle "
        f"{dispatch_us:.1f} us (the profile says {profile.cpu_mem_bw:.0f} GB/s, "
        f"{profile.cpu_cores} cores)"
    )
    rows = {}
    if ffn_format is not None:
        # 1 GiB: above the last-level cache of a big server part (480 MiB seen on a 2-core VM).
        size = 1 << 30
        rate = float(_core.measure_format_bandwidth(ffn_format, size, 3, cores))
        if rate < bw:
            note += f"; {ffn_format} matvec {rate:.0f} GB/s: the CPU's rate for this model"
            bw = rate
        # Cold neurons are read by index, not by the dense products: their own rates.
        rows = {
            k: float(_core.measure_rows_bandwidth(ffn_format, listed, fire, size, 3, cores))
            for k, listed, fire in (("cpu_rows_bw", 0.1, 1.0), ("cpu_gate_bw", 1.0, 0.01))
        }
        note += (
            f"; rows by index {rows['cpu_rows_bw']:.0f} GB/s firing, "
            f"{rows['cpu_gate_bw']:.0f} GB/s gate pass"
        )
    out = dataclasses.replace(
        profile, cpu_mem_bw=bw, cpu_cores=cores, cpu_dispatch_us=dispatch_us, **rows
    )
    return out, note


def _resolve_hardware(name: str | None, gpu_known: list, ffn_format: str | None) -> tuple:
    if name is not None:
        return load_hardware(name), None
    gpu = detect_gpu()
    gpu_known.append(gpu)
    if gpu is not None:  # planning for this machine: its own CPU
        prof = profile_for_gpu_name(gpu.name)
        if prof is not None:
            hw, cpu = measured_cpu(load_hardware(prof), ffn_format=ffn_format)
            return hw, f"hardware: detected {gpu.name} -> profile {prof}; {cpu}"
        hw, cpu = measured_cpu(load_hardware(FALLBACK_PROFILE), ffn_format=ffn_format)
        return hw, (
            f"hardware: {gpu.name} has no shipped profile; using {FALLBACK_PROFILE} "
            f"(pass --hardware FILE for exact numbers); {cpu}"
        )
    return load_hardware(FALLBACK_PROFILE), (
        f"hardware: no GPU found; planning for the {FALLBACK_PROFILE} profile"
    )


def _size(flag: str, text: str) -> int:
    """:func:`parse_bytes` of ``text``, its :class:`PlanError` naming ``flag``."""
    from ..errors import PlanError

    try:
        return parse_bytes(text)
    except PlanError as e:
        raise PlanError(f"{flag}: {e}") from None


def plan(
    model: str | os.PathLike[str],
    profile: str | os.PathLike[str],
    vram_budget: str | int,
    *,
    out: str | os.PathLike[str] = "PLAN.safetensors",
    hardware: str | None = None,
    context: int | None = None,
    kv_cache: str = "f16",
    predictors: str | os.PathLike[str] | None = None,
    predictor_bytes: str | int | None = None,
    sparsity: str | None = None,
    moe_policy: str = "neurons",
    objective: str = "time",
    bucket: int = 64,
    min_neurons: int | None = None,
    solver: str = "auto",
    time_limit: float = 10.0,
    mip_gap: float = DEFAULT_MIP_GAP,
    ram_budget: str | int | None = None,
    store_cluster: int = 1,
    probe_storage: str | os.PathLike[str] | None = None,
    plot: str | os.PathLike[str] | None = None,
    ignore_fingerprint: bool = False,
    summary_only: bool = False,
    verbose: bool = False,
    report: Callable[[str], None] = print,
) -> Path:
    """The plan stage as a function: place ``model``'s weights under ``vram_budget`` (a size,
    or "auto": GPU 0's free memory less a margin) from the activation ``profile`` (a directory
    or its ``profile.safetensors``), write the plan file ``out`` and return its path. The
    options are the command's (``--help``); ``hardware`` None plans for this machine (the
    detected GPU's profile with this CPU measured). The notes and the per-layer table go to
    ``report`` (the CLI prints them; ``summary_only``: the table's last lines), and with
    ``plot`` a PNG is written too. Bad input is a :class:`PowerInferError`."""
    from ..formats.plan import save_plan
    from ..formats.profile import read_profile
    from ..planning.model_shape import ModelShape
    from ..planning.planner import default_sparsity, make_plan
    from ..planning.report import format_table, plot_plan

    _check_limits(context, time_limit, mip_gap, min_neurons)
    auto = str(vram_budget).strip().lower() == "auto"
    budget = None if auto else _size("--vram-budget", vram_budget)
    pred_bytes = None if predictor_bytes is None else _size("--predictor-bytes", predictor_bytes)
    ram = None if ram_budget is None else _size("--ram-budget", ram_budget)
    _check_choices(predictors, predictor_bytes, ram_budget, probe_storage)
    loaded, own = _load(model)
    shape = ModelShape.from_model(loaded)
    probed: list = []
    hw, note = _resolve_hardware(hardware, probed, shape.dtype(shape.ffn_tensor(0, "up")))
    notes = [note] if note else []
    if auto:
        budget = auto_budget(probed[0] if probed else None)
        notes.append(f"budget auto: {format_bytes(budget)}")
    # the engine's KV cache: n_ctx (default 4096) clamped to the model's context length
    ctx = min(context or 4096, shape.config.max_context)
    if context is not None and context > ctx:
        notes.append(
            f"context: the model holds {ctx} tokens, not {context}: KV cache sized for {ctx}"
        )
    prof = read_profile(profile)
    mode = sparsity or default_sparsity(shape)
    preds = _predictor_sizes(shape, mode, predictors, pred_bytes, own)
    if probe_storage is not None:
        hw, note = _with_probed_storage(hw, shape, probe_storage, store_cluster)
        notes.append(note)
    made = make_plan(
        shape, prof, hw, budget, objective=objective, bucket=bucket, context=ctx,
        predictors=preds, min_neurons=min_neurons, kv_cache=kv_cache, sparsity=mode,
        moe_policy=moe_policy, solver=solver, time_limit=time_limit, mip_gap=mip_gap,
        check_fingerprint=not ignore_fingerprint, log=verbose, ram_budget=ram,
        store_cluster=store_cluster,
    )  # fmt: skip
    if notes:
        report("; ".join(notes))
    table = format_table(made)
    report("\n".join(table.splitlines()[-4:]) if summary_only else table)
    path = save_plan(made, out)
    report(f"plan written to {path}")
    if plot:
        plot_plan(made, plot)
        report(f"plot written to {plot}")
    return Path(path)


def _check_limits(
    context: int | None, time_limit: float, mip_gap: float, min_neurons: int | None
) -> None:
    """A :class:`PlanError` for a limit out of its range."""
    from ..errors import PlanError

    if context is not None and context <= 0:
        raise PlanError(f"--context must be positive, got {context}")
    if not time_limit > 0:  # NaN included; inf = no limit
        raise PlanError(f"--time-limit must be positive, got {time_limit}")
    if not 0 <= mip_gap < 1:
        raise PlanError(f"--mip-gap must be in [0, 1), got {mip_gap}")
    if min_neurons is not None and min_neurons < 0:
        raise PlanError(f"--min-neurons must not be negative, got {min_neurons}")


def _check_choices(predictors: Any, predictor_bytes: Any, ram_budget: Any, probe: Any) -> None:
    """A :class:`PlanError` for options that do not go together (the parser keeps
    ``--predictors`` and ``--predictor-bytes`` apart itself)."""
    from ..errors import PlanError

    if predictors is not None and predictor_bytes is not None:
        raise PlanError("--predictors and --predictor-bytes: give one of them")
    if ram_budget is None and probe is not None:
        raise PlanError("--probe-storage prices the RAM tier: give --ram-budget too")


def _load(model: str | os.PathLike[str]) -> tuple[Any, Any]:
    """The loaded model and, for a PowerInfer file, its own predictors (else None)."""
    from ..loading import load_model
    from ..loading.powerinfer_gguf import is_powerinfer_gguf, load_powerinfer_gguf

    if os.path.isfile(model) and is_powerinfer_gguf(model):
        pwri = load_powerinfer_gguf(model)
        return pwri.model, pwri.predictors
    return load_model(model), None


def _predictor_sizes(shape: Any, sparsity: str, predictors: Any, pred_bytes: int | None, own: Any):
    """The predictor bytes per layer the plan reserves (None: the planner's estimate)."""
    from ..errors import PlanError
    from ..planning.predictor_size import (
        fixed_predictor_sizes,
        predictor_set_sizes,
        read_predictor_sizes,
    )

    why = mode_refusal("predictor", "moe_gpu") if shape.moe else None
    if predictors is not None and why:
        raise PlanError(f"{why}: plan a mixture of experts without --predictors")
    if predictors is not None:
        return read_predictor_sizes(predictors, shape.config)
    if pred_bytes is not None:
        return fixed_predictor_sizes(shape.config, pred_bytes)
    if sparsity != "predictor":
        return fixed_predictor_sizes(shape.config, 0)  # the mode reads no predictor
    if own is not None:
        return predictor_set_sizes(own, shape.config)
    return None


def _with_probed_storage(hardware: Any, shape: Any, path: Any, cluster: int) -> tuple[Any, str]:
    """``hardware`` with the storage holding ``path`` measured for the RAM tier, and a note."""
    from ..planning.ram_tier import cluster_bytes
    from ..planning.storage_probe import probe_storage

    size = max(cluster_bytes(shape, i, cluster) for i in range(shape.config.n_layers))
    probe = probe_storage(path, read_bytes=size)
    note = (
        f"storage measured on {path}: {probe.read_bw:.2f} GB/s (1 MiB reads), "
        f"{probe.iops:,.0f} reads/s of {format_bytes(size)}, {probe.depth} in flight"
        + ("" if probe.direct else " (through the page cache: O_DIRECT refused)")
    )
    return hardware.with_storage(probe), note


def run(args: argparse.Namespace) -> int:
    """Do the work for parsed ``args`` (:func:`plan`); raises :class:`PowerInferError` on bad
    input."""
    plan(
        args.model, args.profile, args.vram_budget, out=args.out, hardware=args.hardware,
        context=args.context, kv_cache=args.kv_cache, sparsity=args.sparsity,
        moe_policy=args.moe_policy, objective=args.objective, bucket=args.bucket,
        time_limit=args.time_limit, mip_gap=args.mip_gap, min_neurons=args.min_neurons,
        solver=args.solver, predictors=args.predictors, predictor_bytes=args.predictor_bytes,
        plot=args.plot, ignore_fingerprint=args.ignore_fingerprint, ram_budget=args.ram_budget,
        store_cluster=args.store_cluster, probe_storage=args.probe_storage,
        summary_only=args.quiet, verbose=args.verbose,
    )  # fmt: skip
    return 0


main = entry_point(build_parser, run)
