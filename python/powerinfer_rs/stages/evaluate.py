"""``python -m powerinfer_rs.evaluate``: perplexity of the sparsity modes side by side, and how
well the predictors predict.

On the same token ids (windows of ``--window`` tokens, a fresh context each) it measures the
perplexity of

* ``dense`` (the exact reference),
* ``exact-relu`` (ReLU models: must equal dense),
* ``threshold`` (with ``--thresholds``),
* ``predictor`` (with ``--predictors``),
* ``input`` (with ``--input-thresholds``: every projection's small inputs skipped),

and, counted by the engine's profiler in the same passes, the share of FFN activations left
nonzero after each mode's mask ("FFN nonzero": for predictor mode, the neurons both predicted
and truly active). With ``--predictors`` it then runs the model densely with capture on (at most
``--recall-tokens`` tokens) and compares, per layer, the predictors' own predictions on the
captured FFN inputs (numpy, ``PredictorSet.layers[i].predict(x)``) with the true activity
(``act > 0`` for ReLU models, ``|act| >= threshold`` with ``--thresholds``): recall (share of
the active neurons predicted) and precision (share of the predicted ones that were active).

Example::

    python -m powerinfer_rs.evaluate --model model.gguf --predictors pred.safetensors \\
        --text held_out.txt --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PlanError
from . import args as stage_args

#: The ``--help`` description.
DESCRIPTION = (
    "Perplexity of the dense, exact-relu / threshold, predictor and input sparsity modes side "
    "by side on the same tokens, plus per-layer predictor recall and precision against the "
    "true activity."
)

DEFAULT_TOKENS = 2048


def evaluate_modes(
    engine: Any,
    ids: Sequence[int],
    *,
    window: int = 256,
    thresholds: Sequence[float] | None = None,
    predictors: Any = None,
    input_thresholds: Any = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Perplexity and mean active FFN fraction of every applicable mode on ``ids``. The
    engine is left in dense mode."""
    relu = engine.config.activation == "relu"
    modes: list[tuple[str, dict[str, Any], list[float] | None]] = [("dense", {}, None)]
    if relu:
        modes.append(("exact-relu", {}, None))
    if thresholds is not None:
        modes.append(("threshold", {"thresholds": list(thresholds)}, list(thresholds)))
    if predictors is not None:
        modes.append(("predictor", {"predictors": predictors}, None))
    if input_thresholds is not None:
        modes.append(("input", {"thresholds": input_thresholds}, None))
    n_layers = engine.config.n_layers
    out = []
    for name, kw, count_t in modes:
        engine.set_sparsity(name, **kw)
        if count_t is None and not (relu and name in ("dense", "exact-relu")):
            count_t = [stage_args.NONZERO] * n_layers  # computed = nonzero after the mode's mask
        try:
            ppl, active = stage_args.perplexity_and_activity(
                engine, ids, window=window, count_thresholds=count_t, progress=progress
            )
        finally:
            engine.set_sparsity("dense")
        out.append(
            {
                "mode": name,
                "perplexity": ppl,
                "active_fraction": float(np.mean(active)),
                "active_per_layer": [float(a) for a in active],
            }
        )
    base = out[0]["perplexity"]
    for r in out:
        r["perplexity_change"] = r["perplexity"] / base - 1.0
    return out


def predictor_quality(
    engine: Any,
    ids: Sequence[int],
    predictors: Any,
    *,
    thresholds: Sequence[float] | None = None,
    window: int = 256,
    progress: bool = True,
) -> list[dict[str, float]]:
    """Per layer recall / precision of ``predictors`` (numpy predictions on the FFN inputs
    captured in a dense run over ``ids``) against the true activity (``act > 0`` without
    ``thresholds``, ``|act| >= t`` with them). The predictors must take ``ffn_norm`` input.
    A mixture of experts' predictors count over the routed experts that have one (rank: the
    layer's largest; a layer where none has one reports None)."""
    if getattr(predictors, "input", "ffn_norm") != "ffn_norm":
        raise PlanError(
            f"recall needs predictors on the ffn_norm input (the captured rows); these take "
            f"{predictors.input}"
        )
    n_layers = engine.config.n_layers
    tp = np.zeros(n_layers, np.int64)
    n_pred = np.zeros(n_layers, np.int64)
    n_true = np.zeros(n_layers, np.int64)
    rows = np.zeros(n_layers, np.int64)
    size = np.zeros(n_layers, np.int64)

    moe = bool(engine.config.n_expert)
    experts = getattr(predictors, "experts", None) or {}

    def count(layer: int, pred: np.ndarray, true: np.ndarray) -> None:
        tp[layer] += np.count_nonzero(pred & true)
        n_pred[layer] += np.count_nonzero(pred)
        n_true[layer] += np.count_nonzero(true)
        size[layer] += true.size

    def on_rows(caps: list[tuple[np.ndarray, ...]]) -> None:
        for layer, cap in enumerate(caps):
            x, act = cap[0], cap[1]
            true = stage_args.active_mask(act, None if thresholds is None else thresholds[layer])
            rows[layer] += x.shape[0]
            if len(cap) == 2:
                count(layer, predictors.layers[layer].predict(x), true)
                continue
            # A mixture of experts: each routed expert that has a predictor, over its neurons.
            routes = cap[2]
            true = true.reshape(x.shape[0], routes.shape[1], -1)
            for e in np.unique(routes):
                p = experts.get((layer, int(e)))
                if p is not None:
                    tok, slot = np.nonzero(routes == e)
                    count(layer, p.predict(x[tok]), true[tok, slot])

    engine.set_sparsity("dense")
    stage_args.capture_windows(engine, ids, window, on_rows, desc="recall", progress=progress)
    out = []
    for i in range(n_layers):
        ranks = [p.rank for (layer, _), p in experts.items() if layer == i]
        rank = max(ranks, default=0) if moe else predictors.layers[i].rank
        # A layer whose routed experts have no predictor has nothing to score: None.
        scored = size[i] > 0 or not moe
        row: dict[str, Any] = {
            "layer": i,
            "recall": float(tp[i] / n_true[i]) if n_true[i] else 1.0,
            "precision": float(tp[i] / n_pred[i]) if n_pred[i] else 1.0,
            "active_fraction": float(n_true[i] / max(1, size[i])),
            "predicted_fraction": float(n_pred[i] / max(1, size[i])),
        }
        if not scored:
            row = {k: None if k != "layer" else v for k, v in row.items()}
        out.append({**row, "rank": int(rank), "tokens": int(rows[i])})
    return out


def format_modes(rows: list[dict[str, Any]], tokens: int, window: int) -> str:
    """The perplexity table as text."""
    head = f"{'mode':>10} | {'perplexity':>10} | {'vs dense':>9} | {'FFN active':>10}"
    lines = [f"perplexity on {tokens} tokens (windows of {window})", head, "-" * len(head)]
    for r in rows:
        change = stage_args.fmt_pct(r["perplexity_change"])
        active = r["active_fraction"]
        lines.append(f"{r['mode']:>10} | {r['perplexity']:>10.4f} | {change:>9} | {active:>11.3f}")
    return "\n".join(lines)


def format_quality(rows: list[dict[str, float]], semantics: str) -> str:
    """The per-layer predictor table as text."""
    head = (
        f"{'layer':>5} | {'rank':>5} | {'recall':>7} | {'precision':>9} | {'active':>7} | "
        f"{'predicted':>9}"
    )
    lines = [f"predictor quality against the dense activity ({semantics})", head, "-" * len(head)]
    for r in rows:
        if r["recall"] is None:  # a mixture of experts' layer without any expert predictor
            lines.append(f"{r['layer']:>5} | {r['rank']:>5} | no expert of this layer has one")
            continue
        lines.append(
            f"{r['layer']:>5} | {r['rank']:>5} | {r['recall']:>7.4f} | {r['precision']:>9.3f} | "
            f"{r['active_fraction']:>7.3f} | {r['predicted_fraction']:>9.3f}"
        )
    scored = [r for r in rows if r["recall"] is not None]  # layers with a predictor
    if scored:
        lines.append(
            f" mean |       | {np.mean([r['recall'] for r in scored]):>7.4f} | "
            f"{np.mean([r['precision'] for r in scored]):>9.3f} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``)."""
    ap = stage_args.stage_parser(
        "evaluate",
        DESCRIPTION,
        epilog="Example::" + __doc__.split("Example::", 1)[1],
    )
    ap.add_argument(
        "--predictors",
        metavar="P",
        help="predictor file (python -m powerinfer_rs.train_predictors): adds predictor mode "
        "and the recall table",
    )
    stage_args.add_thresholds_arg(
        ap,
        "adds threshold mode, and defines 'active' (|act| >= t) for the recall of SiLU/GELU models",
    )
    ap.add_argument(
        "--input-thresholds",
        metavar="T",
        help="input threshold file (python -m powerinfer_rs.calibrate --mode input): adds the "
        "input mode",
    )
    stage_args.add_text_args(
        ap,
        "--text",
        "evaluation text: plain text files, HTML pages (tags stripped) or directories; use text "
        "the thresholds/predictors were not fitted on",
        tokens=DEFAULT_TOKENS,
        tokens_help="tokens scored, from the start of the text",
    )
    stage_args.add_window_arg(ap, "tokens per perplexity window, each a fresh context")
    ap.add_argument(
        "--recall-tokens",
        type=stage_args.positive_int,
        default=1024,
        help="tokens the recall/precision table is measured on (default 1024)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    stage_args.add_run_args(ap)
    return ap


def _run(a: argparse.Namespace) -> int:
    engine = stage_args.load_engine(a.model, threads=a.threads)
    progress = not a.quiet
    thresholds = None
    if a.thresholds:
        from ..formats.thresholds import load_thresholds

        thresholds = load_thresholds(a.thresholds, engine.loaded).thresholds
    predictors = None
    if a.predictors:
        from ..formats.predictors import predictors_for

        predictors = predictors_for(a.predictors, engine.loaded)
    input_thresholds = None
    if a.input_thresholds:
        from ..formats.input_thresholds import load_input_thresholds

        input_thresholds = load_input_thresholds(a.input_thresholds, engine.loaded)
    ids, names = stage_args.corpus_ids(engine, a.text, a.tokens)
    window = min(a.window, engine.n_ctx)
    modes = evaluate_modes(
        engine,
        ids,
        window=window,
        thresholds=thresholds,
        predictors=predictors,
        input_thresholds=input_thresholds,
        progress=progress,
    )
    report: dict[str, Any] = {
        "model": str(a.model),
        "model_fingerprint": engine.loaded.fingerprint,
        "activation": engine.config.activation,
        "text": names,
        "tokens": len(ids),
        "window": window,
        "modes": modes,
    }
    print(format_modes(modes, len(ids), window))
    if predictors is not None:
        relu = engine.config.activation == "relu"
        if relu or thresholds is not None:
            semantics = "threshold" if thresholds is not None else "relu"
            qual = predictor_quality(
                engine,
                ids[: a.recall_tokens],
                predictors,
                thresholds=thresholds,
                window=window,
                progress=progress,
            )
            report["predictor_quality"] = qual
            report["predictor_semantics"] = semantics
            print()
            print(format_quality(qual, semantics))
        else:
            print(
                f"note: no recall table: a {engine.config.activation} model needs --thresholds "
                "to say which neurons are truly active",
                file=sys.stderr,
            )
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {a.json}")
    return 0


main = stage_args.entry_point(build_parser, _run)
