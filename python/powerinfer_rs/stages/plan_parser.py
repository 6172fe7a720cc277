"""The argument parser of ``python -m powerinfer_rs.plan`` (:func:`build_parser`), its
options in groups by concern."""

from __future__ import annotations

import argparse
import textwrap

from ..planning.gpu_probe import AUTO_MARGIN_BYTES
from ..planning.hardware_profile import FALLBACK_PROFILE, list_profiles
from ..planning.ilp import DEFAULT_MIP_GAP
from ..planning.model_shape import SPARSITIES
from ..planning.planner import MOE_POLICIES, SOLVERS
from ..planning.problem import BUCKET_SIZES, OBJECTIVES
from ..planning.sizes import format_bytes

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
    _add_target_args(ap)
    _add_pricing_args(ap)
    _add_output_args(ap)
    ap.add_argument("--quiet", action="store_true", help="print only the summary lines")
    ap.add_argument("--verbose", action="store_true", help="show the HiGHS log")
    return ap


def _add_target_args(ap: argparse.ArgumentParser) -> None:
    """What is planned: the model and its activation profile, the VRAM budget, the hardware
    it is planned for and the KV cache the GPU holds."""
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
        choices=("f16", "f32", "q8_0", "q4_0", "q4_1"),
        default="f16",
        help="precision of the KV cache, as the engine will hold it (Engine(kv_cache=...)): "
        "f16 (default, as llama.cpp's), f32 (twice the bytes per GPU layer's cache), or "
        "ggml's blocks q8_0, q4_0, q4_1 (counted at their bytes; the hybrid executor does not "
        "run them yet)",
    )


def _add_pricing_args(ap: argparse.ArgumentParser) -> None:
    """How a placement is priced and solved: the engine's FFN mode and a mixture of experts'
    policy, the objective and the bucket, the solver's limits, the predictor bytes reserved (a
    file's, or a size per layer)."""
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


def _add_output_args(ap: argparse.ArgumentParser) -> None:
    """The plan file, its plot and the profile check; the RAM tier (models bigger than RAM)
    and the storage it reads from."""
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
