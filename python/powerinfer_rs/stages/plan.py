"""``python -m powerinfer_rs.plan``: argument parsing and the run, errors as one line."""

from __future__ import annotations

import argparse
import os
import textwrap

from ..facts import mode_refusal
from ..planning.gpu_probe import AUTO_MARGIN_BYTES, auto_budget, detect_gpu
from ..planning.hardware_profile import (
    FALLBACK_PROFILE,
    list_profiles,
    load_hardware,
    profile_for_gpu_name,
)
from ..planning.ilp import DEFAULT_MIP_GAP
from ..planning.model_shape import SPARSITIES
from ..planning.planner import MOE_POLICIES, SOLVERS
from ..planning.problem import BUCKET_SIZES, OBJECTIVES
from ..planning.sizes import format_bytes, parse_bytes
from .args import entry_point

_EPILOG = f"""\
Sizes: 8GiB, 512MiB (powers of 1024), 8GB (powers of 1000), or bytes; 0 = CPU only.
Shipped hardware profiles: {", ".join(list_profiles())}.
The model, the cost model and the sources of the profiles' numbers: planner/README.md.

Example:
  python -m powerinfer_rs.plan --model model.gguf --profile prof/ --vram-budget 8GiB \\
      --hardware rtx4090 --objective time --out PLAN.safetensors --plot plan.png
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (every option documented for ``--help``)."""
    ap = argparse.ArgumentParser(
        prog="python -m powerinfer_rs.plan",
        description=textwrap.dedent(
            """\
            Decide which weights live in GPU memory: attention (+ KV cache), predictors, the
            output head and the hottest FFN neurons in buckets, under an exact VRAM budget,
            by an integer program solved with HiGHS (greedy fallback). Writes the plan file
            (hot neuron ids per layer + placement metadata) and prints a per-layer table."""
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="model: a .gguf file or a Hugging Face model directory",
    )
    ap.add_argument(
        "--profile",
        required=True,
        metavar="DIR",
        help="activation profile directory (DIR/profile.safetensors, written by "
        "python -m powerinfer_rs.profile) or the .safetensors file itself",
    )
    ap.add_argument(
        "--vram-budget",
        required=True,
        metavar="SIZE|auto",
        help="GPU bytes the plan may allocate, e.g. 8GiB, 8GB, 512MiB, 0 (CPU "
        "only); 'auto' = free VRAM of GPU 0 minus max("
        f"{format_bytes(AUTO_MARGIN_BYTES)}, 5%%) (needs a GPU)",
    )
    ap.add_argument(
        "--hardware",
        metavar="NAME|FILE",
        default=None,
        help="hardware profile: a shipped name or a JSON file with the same keys. "
        "Default: the detected GPU's profile with this machine's CPU measured (its read "
        f"bandwidth and cores), else {FALLBACK_PROFILE} (planning for a machine other than "
        "this one is fine)",
    )
    ap.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="context length the KV cache is sized for (default: the engine's, "
        "min(4096, the model's context length))",
    )
    ap.add_argument(
        "--kv-cache",
        choices=["f16", "f32"],
        default="f16",
        help="precision of the KV cache, as the engine will hold it (Engine(kv_cache=...)): "
        "f16 (default, as llama.cpp's) or f32 (twice the bytes per GPU layer's cache)",
    )
    ap.add_argument(
        "--sparsity",
        choices=SPARSITIES,
        default=None,
        help="the FFN mode the engine will run the plan in, which sets what a neuron costs: "
        "predictor (default; for a mixture of experts exact-relu with ReLU experts, else "
        "dense: only predicted-active rows are read; the GPU holds the "
        "predictors), exact-relu (every cold neuron's gate row is read on the CPU), threshold "
        "(gate and up rows), dense. The modes without predictors reserve no predictor bytes "
        "unless --predictors or --predictor-bytes says otherwise",
    )
    ap.add_argument(
        "--moe-policy",
        choices=MOE_POLICIES,
        default="neurons",
        help="mixture-of-experts models only: neurons (default: the integer program places "
        "hot experts and hot neurons inside warm experts, from the profile's routing counts); "
        "n-cpu-moe (llama.cpp's --n-cpu-moe as a baseline: attention, KV caches, shared "
        "experts and the output head on the GPU, then every routed expert of the last layers "
        "while the budget holds them, the rest on the CPU). Both route on the CPU",
    )
    ap.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="time",
        help="time: minimise the predicted time per token from the hardware profile (also "
        "solves mass and keeps that plan where it is rated faster); mass: maximise the "
        "activation mass the GPU serves (PowerInfer's; dense parts count as always-active "
        "neurons) (default time)",
    )
    ap.add_argument(
        "--bucket",
        type=int,
        choices=BUCKET_SIZES,
        default=64,
        help="neurons per GPU bucket, the granularity of the hot set (default 64)",
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        default=10.0,
        metavar="S",
        help="HiGHS time limit in seconds (default 10); the best placement found "
        "is used and its MIP gap reported",
    )
    ap.add_argument(
        "--mip-gap",
        type=float,
        default=DEFAULT_MIP_GAP,
        metavar="G",
        help=f"relative MIP gap at which HiGHS stops (default {DEFAULT_MIP_GAP})",
    )
    ap.add_argument(
        "--min-neurons",
        type=int,
        default=None,
        metavar="N",
        help="hot neurons a layer needs before it uses the GPU for its FFN "
        "(default: per layer, the fewest whose saving pays for a sync and PCIe "
        "transfer, from the hardware profile; 0 = no minimum)",
    )
    pg = ap.add_mutually_exclusive_group()
    pg.add_argument(
        "--predictors",
        metavar="FILE",
        default=None,
        help="predictors .safetensors (blk.{i}.fc1, blk.{i}.fc2) whose sizes are "
        "counted; default: an f16 estimate at rank max(64, ffn_dim/64 rounded up "
        "to 64)",
    )
    pg.add_argument(
        "--predictor-bytes",
        metavar="SIZE",
        default=None,
        help="bytes of each layer's predictor instead of the estimate",
    )
    ap.add_argument(
        "--solver",
        choices=SOLVERS,
        default="auto",
        help="auto: HiGHS, greedy if highspy is missing or fails; highs; greedy",
    )
    ap.add_argument(
        "--out",
        default="PLAN.safetensors",
        metavar="PLAN",
        help="plan file to write (default PLAN.safetensors)",
    )
    ap.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="also write a PNG of per-layer GPU share and bytes (needs matplotlib)",
    )
    ap.add_argument(
        "--ignore-fingerprint",
        action="store_true",
        help="accept a profile recorded on another model of the same shape",
    )
    ap.add_argument(
        "--ram-budget",
        metavar="SIZE",
        default=None,
        help="plan a RAM tier too (models bigger than RAM): of the neurons the GPU does not "
        "hold, the hottest stay resident in RAM within SIZE (with everything else the process "
        "keeps: attention, embeddings, KV caches, predictors, 256 MiB for itself) and the rest "
        "are read from storage through the neuron store (Engine.use_neuron_store(path, "
        "plan=...)). Predictor and exact-relu modes (a mixture of experts: dense or "
        "exact-relu, over its routed experts' neurons)",
    )
    ap.add_argument(
        "--store-cluster",
        type=int,
        default=1,
        metavar="N",
        help="neurons per neuron-store cluster the RAM tier plans for (as "
        "Engine.write_neuron_store(cluster=N); default 1)",
    )
    ap.add_argument(
        "--probe-storage",
        metavar="FILE",
        default=None,
        help="measure the storage holding FILE (the model file, or the neuron store: at least "
        "64 MiB; its pages are dropped from the page cache) for the RAM tier's read cost: "
        "random reads of a store cluster's size and 1 MiB reads, 8 in flight, a few seconds. "
        "Without it the hardware profile's storage_* numbers are used, if it has them",
    )
    ap.add_argument("--quiet", action="store_true", help="print only the summary lines")
    ap.add_argument("--verbose", action="store_true", help="show the HiGHS log")
    return ap


def measured_cpu(profile, threads: int | None = None, ffn_format: str | None = None):
    """``profile`` with this machine's CPU: its cores, the read bandwidth the engine's threads
    reach (``_core.measure_read_bandwidth``, 256 MiB, best of 3: a second or two) and their
    start after idle (``_core.measure_dispatch``, about 50 ms), in
    place of the profile's (a shipped GPU profile assumes its server's CPU: the H200 one an
    8-channel DDR5 host at 307 GB/s, where a lent 16-core VM reached 54); and a note. With
    ``ffn_format`` (the model's FFN weight format), the CPU's bandwidth is the lower of the read
    probe and the rate its matvec reaches on that format (``_core.measure_format_bandwidth``,
    128 MiB, best of 3): where decoding the format costs more than reading it (Q4_0 on few
    cores) that is what the CPU side of a plan reaches, and what the cost model must price."""
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
    if ffn_format is not None:
        rate = float(_core.measure_format_bandwidth(ffn_format, 128 << 20, 3, cores))
        if rate < bw:
            note += f"; {ffn_format} matvec {rate:.0f} GB/s: the CPU's rate for this model"
            bw = rate
    out = dataclasses.replace(profile, cpu_mem_bw=bw, cpu_cores=cores, cpu_dispatch_us=dispatch_us)
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


def run(args: argparse.Namespace) -> int:
    """Do the work for parsed ``args``; raises :class:`PowerInferError` on bad input."""
    from ..errors import PlanError
    from ..formats.plan import save_plan
    from ..formats.profile import read_profile
    from ..loading import load_model
    from ..loading.powerinfer_gguf import is_powerinfer_gguf, load_powerinfer_gguf
    from ..planning.model_shape import ModelShape
    from ..planning.planner import default_sparsity, make_plan
    from ..planning.predictor_size import (
        fixed_predictor_sizes,
        predictor_set_sizes,
        read_predictor_sizes,
    )
    from ..planning.report import format_table, plot_plan

    if args.context is not None and args.context <= 0:
        raise PlanError(f"--context must be positive, got {args.context}")
    if not args.time_limit > 0:  # NaN included; inf = no limit
        raise PlanError(f"--time-limit must be positive, got {args.time_limit}")
    if not 0 <= args.mip_gap < 1:
        raise PlanError(f"--mip-gap must be in [0, 1), got {args.mip_gap}")
    if args.min_neurons is not None and args.min_neurons < 0:
        raise PlanError(f"--min-neurons must not be negative, got {args.min_neurons}")
    auto = str(args.vram_budget).strip().lower() == "auto"
    budget = None if auto else _size("--vram-budget", args.vram_budget)
    pred_bytes = (
        None if args.predictor_bytes is None else _size("--predictor-bytes", args.predictor_bytes)
    )
    ram_budget = None if args.ram_budget is None else _size("--ram-budget", args.ram_budget)
    if args.ram_budget is None and args.probe_storage is not None:
        raise PlanError("--probe-storage prices the RAM tier: give --ram-budget too")
    own = None  # a PowerInfer file's own predictors
    if os.path.isfile(args.model) and is_powerinfer_gguf(args.model):
        pwri = load_powerinfer_gguf(args.model)
        model, own = pwri.model, pwri.predictors
    else:
        model = load_model(args.model)
    shape = ModelShape.from_model(model)
    probed: list = []
    hardware, note = _resolve_hardware(
        args.hardware, probed, shape.dtype(shape.ffn_tensor(0, "up"))
    )
    if auto:
        budget = auto_budget(probed[0] if probed else None)
        note = (note + "; " if note else "") + f"budget auto: {format_bytes(budget)}"
    # the engine's KV cache: n_ctx (default 4096) clamped to the model's context length
    context = min(args.context or 4096, shape.config.max_context)
    if args.context is not None and args.context > context:
        note = (note + "; " if note else "") + (
            f"context: the model holds {context} tokens, not {args.context}: KV cache sized "
            f"for {context}"
        )
    profile = read_profile(args.profile)
    sparsity = args.sparsity or default_sparsity(shape)
    why = mode_refusal("predictor", "moe_gpu") if shape.moe else None
    if args.predictors is not None and why:
        raise PlanError(f"{why}: plan a mixture of experts without --predictors")
    if args.predictors is not None:
        preds = read_predictor_sizes(args.predictors, shape.config)
    elif pred_bytes is not None:
        preds = fixed_predictor_sizes(shape.config, pred_bytes)
    elif sparsity != "predictor":
        preds = fixed_predictor_sizes(shape.config, 0)  # the mode reads no predictor
    elif own is not None:
        preds = predictor_set_sizes(own, shape.config)
    else:
        preds = None
    if args.probe_storage is not None:
        from ..planning.ram_tier import cluster_bytes
        from ..planning.storage_probe import probe_storage

        size = max(
            cluster_bytes(shape, i, args.store_cluster) for i in range(shape.config.n_layers)
        )
        probe = probe_storage(args.probe_storage, read_bytes=size)
        hardware = hardware.with_storage(probe)
        note = (note + "; " if note else "") + (
            f"storage measured on {args.probe_storage}: {probe.read_bw:.2f} GB/s (1 MiB reads), "
            f"{probe.iops:,.0f} reads/s of {format_bytes(size)}, {probe.depth} in flight"
            + ("" if probe.direct else " (through the page cache: O_DIRECT refused)")
        )
    plan = make_plan(
        shape,
        profile,
        hardware,
        budget,
        objective=args.objective,
        bucket=args.bucket,
        context=context,
        predictors=preds,
        min_neurons=args.min_neurons,
        kv_cache=args.kv_cache,
        sparsity=sparsity,
        moe_policy=args.moe_policy,
        solver=args.solver,
        time_limit=args.time_limit,
        mip_gap=args.mip_gap,
        check_fingerprint=not args.ignore_fingerprint,
        log=args.verbose,
        ram_budget=ram_budget,
        store_cluster=args.store_cluster,
    )
    if note:
        print(note)
    table = format_table(plan)
    print("\n".join(table.splitlines()[-4:]) if args.quiet else table)
    out = save_plan(plan, args.out)
    print(f"plan written to {out}")
    if args.plot:
        plot_plan(plan, args.plot)
        print(f"plot written to {args.plot}")
    return 0


main = entry_point(build_parser, run)
