"""``python -m powerinfer_rs.train_predictors``: train per-layer activation predictors.

Reads the (FFN input, active mask) samples the profiler wrote to ``PROFILE/samples`` and
writes ``predictors.safetensors`` (:mod:`powerinfer_rs.formats.predictors`). Resumable: rerun the
same command after an interruption and finished layers are skipped. For a mixture of experts the
samples are per (layer, expert) and so are the predictors, each kept only where it pays
(:mod:`powerinfer_rs.predictors.experts`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import args as stage_args

#: The ``--help`` description.
DESCRIPTION = (
    "Make one low-rank activation predictor per layer (logits = fc2 . ReLU(fc1 . x), "
    "neuron active when logit >= the layer's threshold) from profiler samples. In ReLU-family "
    "layers it is built from the gate's weights (the best low-rank map of the gate's "
    "pre-activations on the samples, each neuron's logit in units of what the map misses), "
    "the largest rank within the byte budget first, halved while the recall target still "
    "holds on held-out samples and the bytes read fall; elsewhere it is trained, the rank "
    "growing (x2) from a start chosen by the layer's sparsity and skewness until the recall "
    "target holds at a threshold tuned on validation, within the byte budget. A mixture of "
    "experts gets one per (layer, expert), kept only where "
    "it meets the recall target and a routed token reads fewer bytes with it."
)


def _layers(s: str) -> list[int]:
    try:
        layers = sorted({int(t) for t in s.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layers takes comma-separated integers, got {s!r}"
        ) from None
    if not layers or layers[0] < 0:
        raise argparse.ArgumentTypeError(f"--layers takes layer indices >= 0, got {s!r}")
    return layers


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``)."""
    ap = stage_args.stage_parser(
        "train_predictors",
        DESCRIPTION,
        model_help="the model the samples came from (GGUF file or HF directory): its "
        "fingerprint is checked and its FFN bytes set the budget",
    )
    ap.add_argument(
        "--profile",
        required=True,
        help="profile directory written by `python -m powerinfer_rs.profile`; "
        "samples are read from PROFILE/samples",
    )
    ap.add_argument("--out", required=True, help="output file, e.g. predictors.safetensors")
    stage_args.add_share_arg(
        ap,
        "--recall",
        0.99,
        "share of actual activations each layer's predictor must catch on held-out samples",
        type=stage_args.share,
    )
    stage_args.add_share_arg(
        ap,
        "--max-bytes-fraction",
        0.1,
        "predictor bytes allowed per layer as a fraction of that layer's FFN (gate+up+down) "
        "bytes; the total is then within the same fraction",
        type=stage_args.positive_float,
    )
    ap.add_argument(
        "--layers",
        type=_layers,
        default=None,
        help="comma-separated layer indices to train (default: all); layers "
        "already in --out with the same settings are kept",
    )
    ap.add_argument(
        "--epochs",
        type=stage_args.positive_int,
        default=None,
        help="maximum epochs per rank tried (default 40; early stopping on "
        "validation loss usually ends sooner)",
    )
    ap.add_argument("--seed", type=int, default=0, help="random seed (splits, init, batches)")
    ap.add_argument(
        "--dtype",
        choices=["f16", "f32", "q8_0", "q4_0"],
        default="f16",
        help="storage format of fc1/fc2: the bytes a token reads and the plan counts; q8_0 "
        "and q4_0 are ggml's block formats, about 53%% and 28%% of f16's bytes, the rank "
        "padded to a multiple of 32 (default f16)",
    )
    ap.add_argument(
        "--method",
        choices=["auto", "gate-svd", "trained"],
        default="auto",
        help="how each layer's predictor is made: gate-svd builds it from the gate's weights "
        "and the samples' second moment (closed form, seconds a layer; for ReLU-family "
        "layers, whose neurons fire on the gate's sign), trained fits it with Adam on "
        "weighted cross-entropy (any activation; minutes a layer); auto (default) takes "
        "gate-svd where the samples show it applies, else trains",
    )
    ap.add_argument(
        "--max-rows",
        type=stage_args.positive_int,
        default=None,
        help="use at most this many samples per layer (bounds memory)",
    )
    stage_args.add_run_args(ap, threads=False)
    return ap


def train(
    model: str | os.PathLike[str],
    profile: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    recall: float = 0.99,
    max_bytes_fraction: float = 0.1,
    layers: Sequence[int] | None = None,
    epochs: int | None = None,
    seed: int = 0,
    dtype: str = "f16",
    max_rows: int | None = None,
    progress: bool = True,
    report: Callable[[str], None] = print,
    method: str = "auto",
) -> Path:
    """The train-predictors stage as a function: train ``model``'s predictors from the
    samples in the profile directory ``profile`` into ``out`` (resuming the layers already
    there) and return its path. The result table goes to ``report`` (the CLI prints it), the
    training log to stderr, progress bars too unless not ``progress``."""
    from ..loading import load_model
    from ..predictors import TrainConfig, format_table, train_predictors

    cfg = TrainConfig(dtype=dtype.upper())
    if epochs is not None:
        cfg.epochs = epochs
    result = train_predictors(
        profile, out, model=load_model(model), recall=recall,
        max_bytes_fraction=max_bytes_fraction, layers=None if layers is None else list(layers),
        seed=seed, config=cfg, max_rows=max_rows, progress=progress,
        log=lambda s: print(s, file=sys.stderr),
        method=method,
    )  # fmt: skip
    report(format_table(result))
    report(f"wrote {out}")
    return Path(out)


def _run(a: argparse.Namespace) -> int:
    """``main``'s work: :func:`train` with the parsed arguments."""
    train(
        a.model, a.profile, a.out, recall=a.recall, max_bytes_fraction=a.max_bytes_fraction,
        layers=a.layers, epochs=a.epochs, seed=a.seed, dtype=a.dtype, max_rows=a.max_rows,
        progress=not a.quiet, method=a.method,
    )  # fmt: skip
    return 0


main = stage_args.entry_point(build_parser, _run)
