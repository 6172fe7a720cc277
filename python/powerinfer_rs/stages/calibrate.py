"""``python -m powerinfer_rs.calibrate``: per-layer thresholds for ``sparsity="threshold"``
(``--mode threshold``, the default) or per-site input thresholds for ``sparsity="input"``
(``--mode input``; see :mod:`powerinfer_rs.stages.calibrate_input`).

Runs the model densely over the calibration part of a text corpus with the engine's capture on,
and per layer picks the threshold on ``|h| = |act(gate)·up|`` (the value the down projection
multiplies) below which the target share of (token, neuron) pairs falls -- the
``sparsity``-quantile of ``|h|`` over a bounded random sample of the layer's activations
(CATS/TEAL style), leaving out each window's first token, which threshold mode never
sparsifies (the attention sink). Writes the threshold file
(:mod:`powerinfer_rs.formats.thresholds`), then reports the cost on the held-out tail of the corpus:
perplexity dense vs threshold mode on the same token ids, and the per-layer sparsity the
threshold mode actually reaches there (earlier layers' skipped neurons shift later layers'
inputs, so it differs a little from the target).

Example::

    python -m powerinfer_rs.calibrate --model SmolLM2-135M-Instruct.Q4_1.gguf \\
        --corpus /usr/share/doc/python3.11/html --sparsity 0.5 --out smol-t50.json
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..formats.thresholds import ThresholdFile, save_thresholds
from . import args as stage_args

#: The ``--help`` description.
DESCRIPTION = (
    "Calibrate per-layer thresholds on |act(gate)·up| for the engine's threshold sparsity "
    "mode (SiLU/GELU models) to a target FFN sparsity, or (--mode input) per-site thresholds "
    "on every projection's input for the input sparsity mode, write them, and print the "
    "perplexity cost on a held-out part of the corpus."
)

DEFAULT_TOKENS = 4096
DEFAULT_SAMPLE_VALUES = 1 << 20


def calibrate_thresholds(
    engine: Any,
    ids: Sequence[int],
    sparsity: float,
    *,
    window: int = 256,
    sample_values: int = DEFAULT_SAMPLE_VALUES,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[float], list[float]]:
    """Per-layer thresholds on ``|h| = |act(gate)·up|`` that leave ``sparsity`` of the neurons
    inactive on ``ids`` (run densely, windows of ``window`` tokens, fresh context each), and the
    share of sampled activations each threshold leaves inactive. At most ``sample_values``
    values per layer are kept (a uniform random sample). The engine is left in dense mode."""
    if not 0.0 < sparsity < 1.0:
        raise ShapeError(f"sparsity must lie in (0, 1), got {sparsity}")
    n_layers = engine.config.n_layers
    engine.set_sparsity("dense")
    sampler = stage_args.ValueSampler(n_layers, sample_values, seed)

    def on_rows(caps: list[tuple[np.ndarray, ...]]) -> None:
        # Row 0 is the context's first token, which threshold mode computes densely: the
        # thresholds are quantiles over the tokens it sparsifies.
        for layer, (_x, act, *_routes) in enumerate(caps):
            sampler.add(layer, np.abs(act[1:]))

    stage_args.capture_windows(engine, ids, window, on_rows, desc="calibrate", progress=progress)
    thresholds, below = [], []
    for layer in range(n_layers):
        t = sampler.quantile(layer, sparsity)
        if t <= 0.0:  # more exact zeros than the target (ReLU): skip only the zeros
            t = stage_args.NONZERO
        thresholds.append(float(np.float32(t)))
        below.append(sampler.fraction_below(layer, thresholds[-1]))
    return thresholds, below


@dataclass
class HeldOut:
    """Perplexity cost of threshold mode on held-out tokens."""

    tokens: int
    window: int
    ppl_dense: float
    ppl_threshold: float
    sparsity: list[float] = field(default_factory=list)  # per layer, in threshold mode

    @property
    def ppl_change(self) -> float:
        """Relative perplexity change of threshold mode over dense."""
        return self.ppl_threshold / self.ppl_dense - 1.0


def held_out_cost(
    engine: Any,
    ids: Sequence[int],
    thresholds: Sequence[float],
    *,
    window: int = 256,
    progress: bool = True,
) -> HeldOut:
    """Dense and threshold-mode perplexity of ``ids`` and the per-layer sparsity threshold
    mode reaches on them. The engine is left in dense mode."""
    engine.set_sparsity("dense")
    ppl_d, _ = stage_args.perplexity_and_activity(engine, ids, window=window, progress=progress)
    engine.set_sparsity("threshold", thresholds=list(thresholds))
    try:
        ppl_t, active = stage_args.perplexity_and_activity(
            engine, ids, window=window, count_thresholds=thresholds, progress=progress
        )
    finally:
        engine.set_sparsity("dense")
    return HeldOut(len(ids), window, ppl_d, ppl_t, [float(1.0 - a) for a in active])


def split_ids(ids: list[int], heldout_fraction: float) -> tuple[list[int], list[int]]:
    """(calibration head, held-out tail) of ``ids``."""
    if not 0.0 <= heldout_fraction < 1.0:
        raise ShapeError(f"heldout fraction must lie in [0, 1), got {heldout_fraction}")
    n_held = int(round(heldout_fraction * len(ids)))
    if heldout_fraction > 0 and n_held < 2:
        n_held = 2
    cal = ids[: len(ids) - n_held]
    if len(cal) < 1:
        raise ShapeError(f"{len(ids)} tokens leave none for calibration")
    return cal, ids[len(ids) - n_held :]


def _table(thresholds: list[float], below: list[float], held: list[float] | None) -> str:
    head = f"{'layer':>5} | {'threshold':>10} | {'calib sparsity':>14} | {'held-out sparsity':>17}"
    lines = [head, "-" * len(head)]
    for i, t in enumerate(thresholds):
        h = "-" if held is None else f"{held[i]:.3f}"
        lines.append(f"{i:>5} | {t:>10.4g} | {below[i]:>14.3f} | {h:>17}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``)."""
    ap = stage_args.stage_parser(
        "calibrate",
        DESCRIPTION,
        epilog=__doc__.split("Example::", 1)[1],
    )
    stage_args.add_text_args(
        ap,
        "--corpus",
        "calibration text: plain text files, HTML pages (e.g. Debian doc packages; the tags are "
        "stripped) or directories of them; read in order",
        tokens=DEFAULT_TOKENS,
        tokens_help="tokens read from the corpus in all, calibration and held-out part together",
    )
    ap.add_argument(
        "--mode",
        choices=("threshold", "input"),
        default="threshold",
        help="threshold: one threshold per layer on |act(gate)·up| for sparsity='threshold' "
        "(default); input: per layer a threshold for each projection input (q/k/v, o, "
        "gate/up, down) for sparsity='input' (TEAL/WINA)",
    )
    stage_args.add_share_arg(
        ap,
        "--sparsity",
        0.5,
        "target share of FFN neurons inactive per token (threshold mode), or of the projection "
        "inputs skipped (input mode), in (0, 1)",
    )
    ap.add_argument(
        "--score",
        choices=("teal", "wina"),
        default="wina",
        help="input mode: score of an input entry, |x| (teal) or |x|·‖W[:, i]‖ (wina, default: "
        "on SmolLM2-135M at 25%% it cost +0.3%% perplexity against +1.7%% for teal)",
    )
    ap.add_argument(
        "--allocation",
        choices=("uniform", "greedy"),
        default="uniform",
        help="input mode: the same share at every site (uniform, default), or a share per kind "
        "of site (q/k/v input, o input, gate/up input, down input) chosen greedily by measured "
        "loss per byte saved (greedy: 16 perplexity passes over 1024 tokens first)",
    )
    ap.add_argument(
        "--output-head",
        action="store_true",
        help="input mode: also skip the output head's small inputs (the same share)",
    )
    ap.add_argument("--out", required=True, help="threshold file to write (JSON)")
    stage_args.add_share_arg(
        ap,
        "--heldout-fraction",
        0.2,
        "share of those tokens (the tail) kept out of calibration to measure the perplexity "
        "cost on; 0 skips the measurement",
    )
    stage_args.add_window_arg(
        ap, "tokens per forward window (fresh context each) for calibration and perplexity"
    )
    ap.add_argument(
        "--sample-values",
        type=stage_args.positive_int,
        default=DEFAULT_SAMPLE_VALUES,
        help="|act(gate)·up| values kept per layer for the quantile (a uniform random sample; "
        f"bounds memory; default {DEFAULT_SAMPLE_VALUES})",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the value sampling")
    stage_args.add_run_args(ap)
    return ap


def _check(a: argparse.Namespace) -> str | None:
    if not 0.0 < a.sparsity < 1.0:
        return f"--sparsity must lie in (0, 1), got {a.sparsity}"
    if not 0.0 <= a.heldout_fraction < 1.0:
        return f"--heldout-fraction must lie in [0, 1), got {a.heldout_fraction}"
    return None


def calibrate(
    model: str | os.PathLike[str],
    corpus: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    mode: str = "threshold",
    sparsity: float = 0.5,
    tokens: int = DEFAULT_TOKENS,
    score: str = "wina",
    allocation: str = "uniform",
    output_head: bool = False,
    heldout_fraction: float = 0.2,
    window: int = 256,
    sample_values: int = DEFAULT_SAMPLE_VALUES,
    seed: int = 0,
    threads: int = 0,
    progress: bool = True,
    report: Callable[[str], None] = print,
) -> Path:
    """The calibrate stage as a function: calibrate ``model`` on the first ``tokens`` of
    ``corpus`` (``mode`` "threshold": per-layer thresholds; "input": per-site input
    thresholds, with ``score``, ``allocation`` and ``output_head``), write the threshold file
    ``out`` and return its path. The held-out tail (``heldout_fraction``) measures the cost;
    the result table and summary go to ``report`` (the CLI prints them), the settings line to
    stderr, progress bars too unless not ``progress``. Bad input is a :class:`PowerInferError`."""
    engine = stage_args.load_engine(model, threads=threads)
    ids, names = stage_args.corpus_ids(engine, corpus, tokens)
    cal, held = split_ids(ids, heldout_fraction)
    run = _Calibration(engine, cal, held, names, out, sparsity, window, seed, progress, report)
    if mode == "input":
        _calibrate_inputs(run, score=score, allocation=allocation, output_head=output_head)
    else:
        _calibrate_layers(run, sample_values=sample_values)
    report(f"wrote {out}")
    return Path(out)


@dataclass
class _Calibration:
    """What both modes' calibrations work with: the engine, the calibration tokens and the
    held-out ones, the corpus names, the file to write, the target share and the settings of
    the passes, and where the report lines go."""

    engine: Any
    cal: list[int]
    held: list[int]
    names: list[str]
    out: str | os.PathLike[str]
    sparsity: float
    window: int
    seed: int
    progress: bool
    report: Callable[[str], None]


def _calibrate_layers(run: _Calibration, *, sample_values: int) -> None:
    """``mode="threshold"``: per-layer thresholds, and their held-out cost."""
    engine, cal, held, out, sparsity = run.engine, run.cal, run.held, run.out, run.sparsity
    window, progress, report = run.window, run.progress, run.report
    cfg = engine.config
    print(
        f"calibrating {cfg.n_layers} layers ({cfg.activation}, ffn {cfg.ffn_dim}) to "
        f"{sparsity:.0%} FFN sparsity on {len(cal)} tokens; {len(held)} held out",
        file=sys.stderr,
    )
    thresholds, below = calibrate_thresholds(
        engine, cal, sparsity, window=window, sample_values=sample_values, seed=run.seed,
        progress=progress,
    )  # fmt: skip
    tf = ThresholdFile(
        thresholds=thresholds,
        model_fingerprint=engine.loaded.fingerprint,
        activation=cfg.activation,
        target_sparsity=sparsity,
        measured_sparsity=below,
        corpus=run.names,
        tokens=len(cal),
        extra={"measured_on": "calibration tokens, dense activations", "window": window},
    )
    save_thresholds(out, tf)
    if held:
        ho = held_out_cost(engine, held, thresholds, window=window, progress=progress)
        tf.measured_sparsity = ho.sparsity
        tf.extra.update(
            measured_on="held-out tokens, threshold mode",
            calibration_sparsity=below,
            heldout_tokens=ho.tokens,
            perplexity_dense=ho.ppl_dense,
            perplexity_threshold=ho.ppl_threshold,
        )
        save_thresholds(out, tf)
    report(_table(thresholds, below, tf.measured_sparsity if held else None))
    mean = float(np.mean(tf.measured_sparsity or below))
    if held:
        report(
            f"held-out ({ho.tokens} tokens, windows of {min(window, engine.n_ctx)}): "
            f"perplexity dense {ho.ppl_dense:.4f}, threshold {ho.ppl_threshold:.4f} "
            f"({stage_args.fmt_pct(ho.ppl_change)}); mean FFN sparsity {mean:.3f} "
            f"(target {sparsity:.3f})"
        )
    else:
        report(f"mean FFN sparsity on the calibration sample {mean:.3f} (no held-out part)")


def _calibrate_inputs(run: _Calibration, *, score: str, allocation: str, output_head: bool) -> None:
    """``mode="input"``: per-site thresholds for the input mode, and their held-out cost."""
    from ..formats.input_thresholds import save_input_thresholds
    from .calibrate_input import calibrate_input, format_table, held_out_input_cost

    engine, cal, held, out, sparsity = run.engine, run.cal, run.held, run.out, run.sparsity
    window, progress, report = run.window, run.progress, run.report
    cfg = engine.config
    print(
        f"calibrating the input mode of {cfg.n_layers} layers ({score} scores, "
        f"{allocation} allocation) to {sparsity:.0%} of projection inputs skipped on "
        f"{len(cal)} tokens; {len(held)} held out",
        file=sys.stderr,
    )
    c = calibrate_input(
        engine, cal, sparsity, score=score, output=output_head, window=window, seed=run.seed,
        progress=progress, allocation=allocation,
    )  # fmt: skip
    tf = c.thresholds
    tf.corpus = list(run.names)
    tf.extra.update(allocation=allocation, window=window)
    save_input_thresholds(out, tf)
    dropped = None
    if held:
        ho = held_out_input_cost(engine, held, tf, window=window, progress=progress)
        dropped = ho.dropped
        tf.extra.update(
            heldout_tokens=ho.tokens,
            heldout_dropped=ho.dropped,
            perplexity_dense=ho.ppl_dense,
            perplexity_input=ho.ppl_input,
        )
        save_input_thresholds(out, tf)
    report(format_table(tf, dropped))
    if held:
        report(
            f"held-out ({ho.tokens} tokens, windows of {min(window, engine.n_ctx)}): "
            f"perplexity dense {ho.ppl_dense:.4f}, input {ho.ppl_input:.4f} "
            f"({stage_args.fmt_pct(ho.ppl_change)}); mean share of inputs skipped "
            f"{float(np.mean(ho.dropped)):.3f} (target {sparsity:.3f})"
        )


def _run(a: argparse.Namespace) -> int:
    """``main``'s work: :func:`calibrate` with the parsed arguments."""
    calibrate(
        a.model, a.corpus, a.out, tokens=a.tokens, mode=a.mode, sparsity=a.sparsity,
        score=a.score, allocation=a.allocation, output_head=a.output_head,
        heldout_fraction=a.heldout_fraction, window=a.window, sample_values=a.sample_values,
        seed=a.seed, threads=a.threads, progress=not a.quiet,
    )  # fmt: skip
    return 0


main = stage_args.entry_point(build_parser, _run, check=_check)
