"""``python -m powerinfer_rs.profile``: count how often each FFN neuron fires.

Runs the model densely over a text corpus in windows of ``--window`` tokens (a fresh context
each) while the engine's profiler -- counters in Rust, inside the forward pass -- counts per
layer and neuron the tokens in which the neuron is active. "Active" is ``act > 0`` for ReLU
models ("relu" semantics) and ``|act| >= the layer's threshold`` with ``--thresholds``
("threshold" semantics; required for SiLU/GELU models, whose activations are never exactly 0).

Writes into ``--out DIR``:

* ``profile.safetensors``: ``blk.{i}.active_count`` int64 ``[ffn]`` and metadata (model
  fingerprint, corpus, token count, semantics), read by ``python -m powerinfer_rs.plan``;
* ``activation.png``: sorted activation frequency per layer on log-log axes (the power law);
* ``summary.json``: the per-layer table printed at the end (sparsity = 1 - mean active
  fraction; share of all activations covered by the 10 % and 20 % most active neurons);
* with ``--samples``: ``samples/``, (FFN input after ffn_norm, active mask) pairs per layer
  streamed to disk with bounded memory, for ``python -m powerinfer_rs.train_predictors``.

Example::

    python -m powerinfer_rs.profile --model model.gguf --corpus notes.txt --tokens 8192 \\
        --out prof --samples
    python -m powerinfer_rs.train_predictors --model model.gguf --profile prof --out pred.st
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InternalError, PlanError
from . import args as stage_args

#: The ``--help`` description.
DESCRIPTION = (
    "Profile per layer and neuron how often each FFN neuron is active over a text corpus "
    "(dense run; counters inside the engine), write the counts, a plot of the power law "
    "and, optionally, predictor-training samples."
)

DEFAULT_TOKENS = 8192
PNG_NAME = "activation.png"
EXPERTS_PNG_NAME = "experts.png"
SUMMARY_NAME = "summary.json"


def profile_model(
    engine: Any,
    ids: Sequence[int],
    *,
    window: int = 256,
    thresholds: Sequence[float] | None = None,
    samples_to: str | os.PathLike[str] | None = None,
    sample_tokens: int | None = None,
    sample_metadata: dict[str, Any] | None = None,
    seed: int = 0,
    progress: bool = True,
    experts: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, int, int]:
    """Profile ``engine`` (run densely) over ``ids``: returns (counts int64 ``(n_layers,
    ffn)``, tokens counted, sample rows written); row i holds layer i's own neurons
    (``config.layer_routed_neurons``), zero past them where its layers differ (a mixture of
    experts' leading dense layers). With ``samples_to`` (a profile directory)
    also stream (x, mask) samples to ``samples_to/samples``: at most ``sample_tokens`` token
    rows per layer, drawn uniformly over the whole run (all rows when None). A mixture of
    experts counts its flattened neuron space (``n_expert * expert_ffn`` per layer) and, with
    ``experts`` (a list), appends each layer's tokens routed per expert to it; its samples are
    per (layer, expert), unit ``layer * n_expert + expert``: each sampled token's FFN input
    under every expert it is routed to, with the mask over that expert's neurons (samples
    metadata ``moe``). The leading dense layers of a mixture of experts (GLM-4.5's) write no
    samples: they take no predictor (predictor mode runs them exact-relu)."""
    from ..formats.samples import SampleWriter

    cfg = engine.config
    n_layers, ffn = cfg.n_layers, cfg.ffn_dim
    n_expert, ef = cfg.n_expert, cfg.expert_ffn_dim or cfg.ffn_dim
    if n_expert:
        ffn = n_expert * ef
    thr = None if thresholds is None else [float(t) for t in thresholds]
    engine.set_sparsity("dense")
    writer = None
    if samples_to is not None:
        meta = dict(sample_metadata or {})
        if not n_expert:
            writer = SampleWriter(samples_to, n_layers, cfg.dim, ffn, metadata=meta)
        else:
            # One sample unit per (layer, expert): the tokens routed to the expert, the mask over
            # its neurons. At most 256 MiB wait in memory over all units (the fullest are
            # written early, as shorter shards).
            units = n_layers * n_expert
            meta["moe"] = {"n_layers": n_layers, "n_expert": n_expert, "expert_ffn": ef}
            writer = SampleWriter(
                samples_to, units, cfg.dim, ef, metadata=meta, max_buffered=256 << 20
            )
    want = len(ids) if sample_tokens is None else min(sample_tokens, len(ids))
    # exactly `want` token positions, uniformly over the whole run
    chosen = np.zeros(len(ids), dtype=bool)
    chosen[np.random.default_rng(seed).choice(len(ids), want, replace=False)] = True
    pos = 0
    written = 0

    def on_window(n: int) -> None:
        nonlocal pos, written
        start, pos = pos, pos + n
        if writer is None:
            return
        caps = engine.take_captured()
        if caps and caps[0][0].shape[0] != n:
            raise InternalError(f"captured {caps[0][0].shape[0]} rows for a {n}-token window")
        rows = np.flatnonzero(chosen[start : start + n])
        if rows.size == 0:
            return
        for layer, cap in enumerate(caps):
            t = None if thr is None else thr[layer]
            if len(cap) == 2 and n_expert:
                continue  # a mixture of experts' leading dense layer
            if not n_expert:
                x, act = cap
                writer.add(layer, x[rows], stage_args.active_mask(act[rows], t))
                continue
            x, act, routes = cap
            x, r = x[rows], routes[rows]
            act = act[rows].reshape(rows.size, r.shape[1], ef)
            for e in np.unique(r):
                tok, slot = np.nonzero(r == e)
                unit = layer * n_expert + int(e)
                writer.add(unit, x[tok], stage_args.active_mask(act[tok, slot], t))
        written += int(rows.size)

    engine.start_profiling(thresholds=thr, capture=writer is not None)
    try:
        stage_args.feed_windows(
            engine, ids, window, on_window=on_window, desc="profile", progress=progress
        )
        counts, tokens = engine.profile_counts()
        routed = engine.profile_expert_counts()
        if experts is not None and routed is not None:
            experts.extend(np.asarray(routed, dtype=np.int64))
    finally:
        engine.stop_profiling()
        if writer is not None:
            writer.close()
    return np.asarray(counts, dtype=np.int64), int(tokens), written


def layer_table(counts: Sequence[np.ndarray], tokens: int) -> list[dict[str, float]]:
    """Per layer (each its own neurons): sparsity (1 - mean active fraction), top-10 % /
    top-20 % share of the activations, and the share of neurons never active."""
    out = []
    for i, c in enumerate(counts):
        c = np.asarray(c)
        freq = c / max(1, tokens)
        out.append(
            {
                "layer": i,
                "sparsity": float(1.0 - freq.mean()),
                "top10_share": stage_args.top_share(c, 0.10),
                "top20_share": stage_args.top_share(c, 0.20),
                "never_active": float(np.mean(c == 0)),
                "max_frequency": float(freq.max()),
            }
        )
    return out


def format_layer_table(rows: list[dict[str, float]]) -> str:
    """The table :func:`layer_table` makes, as text."""
    head = (
        f"{'layer':>5} | {'sparsity':>8} | {'top10% share':>12} | {'top20% share':>12} | "
        f"{'never active':>12} | {'max freq':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['layer']:>5} | {r['sparsity']:>8.3f} | {r['top10_share']:>12.3f} | "
            f"{r['top20_share']:>12.3f} | {r['never_active']:>12.3f} | {r['max_frequency']:>8.3f}"
        )
    mean = {k: float(np.mean([r[k] for r in rows])) for k in ("sparsity", "top10_share")}
    lines.append(f" mean | {mean['sparsity']:>8.3f} | {mean['top10_share']:>12.3f} |")
    return "\n".join(lines)


def plot_activation(
    counts: Sequence[np.ndarray], tokens: int, path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Write a log-log plot of each layer's activation frequencies (each its own neurons)
    sorted hottest first."""
    from ..planning.report import pyplot

    plt = pyplot()
    import matplotlib
    from matplotlib import cm
    from matplotlib.colors import Normalize
    from matplotlib.ticker import MaxNLocator

    n_layers, ffn = len(counts), max(np.asarray(c).size for c in counts)
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=110)
    norm = Normalize(vmin=0, vmax=max(1, n_layers - 1))
    cmap = matplotlib.colormaps["viridis"]
    rank = np.arange(1, ffn + 1)
    for i in range(n_layers):
        freq = np.sort(np.asarray(counts[i]))[::-1] / max(1, tokens)
        keep = freq > 0
        ax.plot(rank[: freq.size][keep], freq[keep], color=cmap(norm(i)), lw=1.0, alpha=0.85)
    # a 1/rank guide through the layers' mean frequency at the 10 % rank
    r0 = max(1, ffn // 10)
    at = [np.sort(np.asarray(c))[::-1][min(r0, np.asarray(c).size) - 1] for c in counts]
    f0 = float(np.mean(at)) / max(1, tokens)
    if f0 > 0:
        ax.plot(rank, np.minimum(1.0, f0 * r0 / rank), "k--", lw=0.8, label=r"$\propto$ 1/rank")
        ax.legend(loc="lower left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=max(0.3 / max(1, tokens), 1e-6))
    ax.set_xlabel("neuron rank (most active first)")
    ax.set_ylabel(f"activation frequency (share of {tokens} tokens)")
    ax.set_title(title or "FFN activation frequency per layer", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    bar = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_experts(
    routed: np.ndarray, tokens: int, path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Write a plot of each layer's expert routing frequencies (share of tokens routed to
    each expert), sorted hottest first: the skew a placement of experts can use."""
    from ..planning.report import pyplot

    plt = pyplot()
    import matplotlib

    routed = np.asarray(routed)
    n_layers, n_expert = routed.shape
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    cmap = matplotlib.colormaps["viridis"]
    rank = np.arange(1, n_expert + 1)
    for i in range(n_layers):
        share = np.sort(routed[i])[::-1] / max(1, tokens)
        ax.plot(rank, share, color=cmap(i / max(1, n_layers - 1)), lw=1.0, alpha=0.85)
    ax.set_xlabel("expert rank (most routed first)")
    ax.set_ylabel(f"routing frequency (share of {tokens} tokens)")
    ax.set_title(f"{title}: expert routing per layer".strip(": "), fontsize=9)
    ax.grid(True, alpha=0.25)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def resolve_semantics(engine: Any, thresholds_path: str | None) -> tuple[str, list[float] | None]:
    """("relu", None) for a ReLU model without thresholds, ("threshold", values) with them;
    :class:`PlanError` for a SiLU/GELU model without thresholds."""
    if thresholds_path:
        from ..formats.thresholds import load_thresholds

        return "threshold", load_thresholds(thresholds_path, engine.loaded).thresholds
    act = engine.config.activation
    if act != "relu":
        raise PlanError(
            f"this is a {act} model: its activations are never exactly 0, so 'active' needs "
            "per-layer thresholds; pass --thresholds T (python -m powerinfer_rs.calibrate "
            "writes them)"
        )
    return "relu", None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used for ``--help``)."""
    ap = stage_args.stage_parser(
        "profile",
        DESCRIPTION,
        epilog="Writes DIR/profile.safetensors, DIR/activation.png, DIR/summary.json and, "
        "with --samples, DIR/samples/.\n\nExample::" + __doc__.split("Example::", 1)[1],
    )
    stage_args.add_text_args(
        ap,
        "--corpus",
        "text to profile on: plain text files, HTML pages (tags stripped) or directories of "
        "them; read in order",
        tokens=DEFAULT_TOKENS,
        tokens_help="tokens to profile, taken from the start of the corpus",
    )
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory")
    stage_args.add_thresholds_arg(
        ap,
        "count a neuron active when |act| >= its layer's threshold; required for SiLU/GELU "
        "models, optional for ReLU models (default there: act > 0)",
    )
    ap.add_argument(
        "--samples",
        action="store_true",
        help="also write (FFN input, active mask) samples to DIR/samples for "
        "python -m powerinfer_rs.train_predictors (a mixture of experts: per layer and "
        "expert, from the tokens routed to it)",
    )
    ap.add_argument(
        "--sample-tokens",
        type=stage_args.positive_int,
        default=None,
        help="with --samples: at most this many token rows per layer, drawn uniformly over "
        "the run (default: every profiled token)",
    )
    stage_args.add_window_arg(ap, "tokens per forward window; each window starts a fresh context")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sample-row draw")
    ap.add_argument("--no-plot", action="store_true", help="do not write activation.png")
    stage_args.add_run_args(ap)
    return ap


def profile(
    model: str | os.PathLike[str],
    corpus: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    tokens: int = DEFAULT_TOKENS,
    thresholds: str | os.PathLike[str] | None = None,
    samples: bool = False,
    sample_tokens: int | None = None,
    window: int = 256,
    seed: int = 0,
    plot: bool = True,
    threads: int = 0,
    progress: bool = True,
    report: Callable[[str], None] = print,
) -> Path:
    """The profile stage as a function: profile ``model`` densely over the first ``tokens``
    of ``corpus`` (a neuron active by the threshold file ``thresholds``, or act > 0 for a ReLU
    model without one) into the directory ``out`` -- the counts, ``summary.json``, the plots
    unless not ``plot`` and, with ``samples``, predictor-training samples -- and return the
    path of the profile file written. The summary table goes to ``report`` (the CLI prints
    it); progress bars to stderr unless not ``progress``."""
    from ..formats.profile import write_profile

    engine = stage_args.load_engine(model, threads=threads)
    semantics, values = resolve_semantics(engine, None if thresholds is None else str(thresholds))
    ids, names = stage_args.corpus_ids(engine, corpus, tokens)
    if len(ids) < tokens:
        print(f"note: the corpus holds only {len(ids)} tokens", file=sys.stderr)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    cfg = engine.config
    fingerprint = engine.loaded.fingerprint
    meta = {
        "model_fingerprint": fingerprint,
        "predictor_input": "ffn_norm",
        "semantics": semantics,
        "thresholds": values,
        "corpus": names,
    }
    experts: list[np.ndarray] = []
    padded, n_tokens, rows = profile_model(
        engine, ids, window=window, thresholds=values, samples_to=d if samples else None,
        sample_tokens=sample_tokens, sample_metadata=meta, seed=seed, progress=progress,
        experts=experts,
    )  # fmt: skip
    counts = [padded[i, :w] for i, w in enumerate(cfg.layer_routed_neurons)]
    lead = cfg.dense_lead_layers if cfg.n_expert else 0
    extra = {
        "semantics": semantics,
        "activation": cfg.activation,
        "window": str(min(window, engine.n_ctx)),
    }
    if values is not None:
        extra["thresholds"] = json.dumps(values)
        extra["thresholds_file"] = os.fspath(thresholds)  # type: ignore[arg-type]
    path = write_profile(
        d, counts, n_tokens, model_fingerprint=fingerprint, corpus=names,
        extra_meta=extra, expert_counts=experts or None, dense_lead=lead,
    )  # fmt: skip
    rows_table = layer_table(counts, n_tokens)
    summary = {
        "model": os.fspath(model),
        "model_fingerprint": fingerprint,
        "semantics": semantics,
        "tokens": n_tokens,
        "corpus": names,
        "layers": rows_table,
    }
    (d / SUMMARY_NAME).write_text(json.dumps(summary, indent=1))
    name = Path(model).name
    if plot:
        title = f"{name}: FFN activation frequency ({semantics}, {n_tokens} tokens)"
        plot_activation(counts, n_tokens, d / PNG_NAME, title=title)
    if experts:
        _report_experts(cfg, np.asarray(experts), n_tokens, report)
        if plot:
            plot_experts(np.asarray(experts), n_tokens, d / EXPERTS_PNG_NAME, title=name)
    report(
        f"profiled {n_tokens} tokens, {cfg.n_layers} layers x {padded.shape[1]} neurons "
        f"({semantics})"
    )
    report(format_layer_table(rows_table))
    plots = "" if not plot else f", {d / PNG_NAME}"
    if experts and plot:
        plots += f", {d / EXPERTS_PNG_NAME}"
    report(f"wrote {path}{plots}")
    if samples:
        report(f"wrote {rows} sample rows per layer to {d / 'samples'}")
    return Path(path)


def _report_experts(cfg: Any, routed: np.ndarray, tokens: int, report: Callable[[str], None]):
    """The line on how evenly a mixture of experts routes its tokens."""
    top = np.sort(routed / max(1, tokens), axis=1)[:, ::-1]
    report(
        f"experts: {cfg.n_expert} per layer, {cfg.n_expert_used} per token; the hottest "
        f"expert takes {top[:, 0].mean():.3f} of tokens, the coldest {top[:, -1].mean():.3f}"
        " (layer means)"
    )


def _run(a: argparse.Namespace) -> int:
    """``main``'s work: :func:`profile` with the parsed arguments."""
    profile(
        a.model, a.corpus, a.out, tokens=a.tokens, thresholds=a.thresholds, samples=a.samples,
        sample_tokens=a.sample_tokens, window=a.window, seed=a.seed, plot=not a.no_plot,
        threads=a.threads, progress=not a.quiet,
    )  # fmt: skip
    return 0


main = stage_args.entry_point(build_parser, _run)
