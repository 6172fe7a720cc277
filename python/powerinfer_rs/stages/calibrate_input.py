"""Calibration of the ``input`` sparsity mode (TEAL/WINA): per layer and site, the threshold
on each entry's score below which the target share of a projection's inputs is dropped.

The engine runs densely over calibration windows with its site capture on
(:meth:`Engine.start_profiling` ``capture_sites``); per layer and site (see
:mod:`powerinfer_rs.formats.input_thresholds`) the scores of a bounded random sample of
entries (each window's first token left out: the mode keeps it dense) give the threshold as
their ``sparsity``-quantile. With ``allocation="greedy"`` the per-site shares come from
TEAL's greedy search instead: starting dense, repeatedly raise by one step the sparsity of the
site whose step costs the least output error per byte saved on a few calibration windows, until
the byte-weighted average reaches the target (the cost: the relative change of the final hidden
state against the dense one, measured on the engine itself).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..formats.input_thresholds import SITES, InputThresholds
from . import args as stage_args

#: Values kept per (layer, site) for the quantiles.
DEFAULT_SAMPLE_VALUES = 1 << 18
#: How the target is spread over the sites.
ALLOCATIONS = ("uniform", "greedy")
#: The greedy allocation's steps of a site's share.
GREEDY_STEP = 0.1
#: The highest share the greedy allocation gives a site.
GREEDY_MAX = 0.8
#: The shares a site's loss is measured at (linear in between).
GREEDY_MEASURED = (0.2, 0.4, 0.6, 0.8)
#: Calibration tokens the greedy allocation's loss is measured on.
GREEDY_TOKENS = 1024


def site_bytes(engine: Any) -> np.ndarray:
    """(n_layers, 4): the bytes of each site's matrices (what skipping its inputs saves)."""
    n = engine.config.n_layers
    names = (
        ("attn_q", "attn_k", "attn_v"),
        ("attn_output",),
        ("ffn_gate", "ffn_up"),
        ("ffn_down",),
    )
    t = engine.loaded.tensors
    out = np.zeros((n, 4))
    for i in range(n):
        for k, group in enumerate(names):
            out[i, k] = sum(int(t[f"blk.{i}.{m}"].nbytes) for m in group if f"blk.{i}.{m}" in t)
    return out


def greedy_shares(
    engine: Any,
    ids: Sequence[int],
    sampler: stage_args.ValueSampler,
    sparsity: float,
    *,
    score: str,
    window: int,
    progress: bool = True,
) -> list[list[float]]:
    """Per layer and site a share of inputs to drop, the byte-weighted mean of which is
    ``sparsity``, chosen greedily per kind of site (after TEAL's greedy allocation, over the
    four sites rather than every block): each kind's loss is measured with that kind alone
    sparsified in every layer (the others dense) at the shares :data:`GREEDY_MEASURED`, on the
    first :data:`GREEDY_TOKENS` calibration tokens, and interpolated linearly; starting from all
    dense, the step of :data:`GREEDY_STEP` with the least loss increase per byte saved is taken
    until the target. 16 perplexity passes in all.

    Per kind, not per layer: on SmolLM2-135M a per-(layer, site) search measured on one window
    (4 passes per site, interactions ignored) cost +19.7% held-out perplexity at 30% where the
    uniform share cost +0.3% at 25% and +15.9% at 35%; the kinds differ most (the FFN input at
    45% with the rest at 25%: +19.7%; the attention output: +3.2%; the down input: +2.8%)."""
    from tqdm import tqdm

    n = engine.config.n_layers
    sub = list(ids[:GREEDY_TOKENS])
    levels = np.round(np.arange(0.0, GREEDY_MAX + 1e-9, GREEDY_STEP), 6)
    nbytes = site_bytes(engine).sum(axis=0)  # per kind of site
    base = float(np.log(engine.perplexity_of_ids(sub, window=window)))
    measured = np.full((4, len(GREEDY_MEASURED)), base)
    jobs = [(k, j) for k in range(4) for j in range(len(GREEDY_MEASURED))]
    it = tqdm(jobs, desc="greedy allocation", unit="run", disable=not progress)
    try:
        for k, j in it:
            t = [[0.0] * 4 for _ in range(n)]
            for i in range(n):
                t[i][k] = float(sampler.quantile(4 * i + k, GREEDY_MEASURED[j]))
            engine.set_sparsity("input", thresholds={"thresholds": t, "score": score})
            measured[k, j] = float(np.log(engine.perplexity_of_ids(sub, window=window)))
    finally:
        engine.set_sparsity("dense")
    xs = np.concatenate([[0.0], GREEDY_MEASURED])
    loss = np.stack(
        [np.interp(levels, xs, np.concatenate([[base], measured[k]])) for k in range(4)]
    )
    step = np.zeros(4, dtype=int)
    total = float(nbytes.sum())
    saved = 0.0
    while saved < sparsity * total - 1e-9:
        best, pick = np.inf, None
        for k in range(4):
            j = step[k]
            if j + 1 >= len(levels) or nbytes[k] == 0:
                continue
            cost = max(loss[k, j + 1] - loss[k, j], 0.0) / (GREEDY_STEP * nbytes[k])
            if cost < best:
                best, pick = cost, k
        if pick is None:
            break
        step[pick] += 1
        saved += GREEDY_STEP * nbytes[pick]
    shares = [float(levels[step[k]]) for k in range(4)]
    return [list(shares) for _ in range(n)]


def site_norms(engine: Any, score: str) -> list[list[np.ndarray]] | None:
    """Per layer the four sites' WINA column norms, and the output head's last (None for
    TEAL's |x| score)."""
    if score == "teal":
        return None
    n = engine.config.n_layers
    return [engine.input_column_norms(i) for i in range(n)] + [engine.input_column_norms(n)]


def _site_scores(
    layers: Sequence[Sequence[np.ndarray]], norms: list[list[np.ndarray]] | None
) -> Iterator[tuple[int, int, np.ndarray]]:
    """``(layer, site, scores)`` of each site's captured rows of a window (the first row, the
    window's first token, left out: the mode keeps it dense): ``|x|``, times the site's column
    norms with ``norms`` (WINA)."""
    for i, four in enumerate(layers):
        for k, rows in enumerate(four):
            v = np.abs(rows[1:])
            yield i, k, (v if norms is None else v * norms[i][k])


def capture_scores(
    engine: Any,
    ids: Sequence[int],
    *,
    score: str,
    window: int,
    sample_values: int = DEFAULT_SAMPLE_VALUES,
    seed: int = 0,
    progress: bool = True,
    desc: str = "calibrate",
) -> stage_args.ValueSampler:
    """Samples of every site's scores over ``ids`` in the engine's current mode: "layer"
    ``4·i + site`` of the sampler is layer ``i``'s site, ``4·n_layers`` the output head's."""
    n = engine.config.n_layers
    norms = site_norms(engine, score)
    sampler = stage_args.ValueSampler(4 * n + 1, sample_values, seed)

    def on_window(_n: int) -> None:
        layers, out = engine.take_sites()
        for i, k, v in _site_scores(layers, norms):
            sampler.add(4 * i + k, v)
        v = np.abs(out[1:])
        if norms is not None:
            v = v * norms[n][0]
        sampler.add(4 * n, v)

    engine.start_profiling(capture_sites=True)
    try:
        stage_args.feed_windows(
            engine, ids, window, on_window=on_window, desc=desc, progress=progress
        )
    finally:
        engine.stop_profiling()
    return sampler


@dataclass
class InputCalibration:
    """Thresholds and the shares each leaves out on the calibration sample."""

    thresholds: InputThresholds
    below: list[list[float]] = field(default_factory=list)


def calibrate_input(
    engine: Any,
    ids: Sequence[int],
    sparsity: float,
    *,
    score: str = "teal",
    output: bool = False,
    window: int = 256,
    sample_values: int = DEFAULT_SAMPLE_VALUES,
    seed: int = 0,
    progress: bool = True,
    allocation: str = "uniform",
    site_sparsity: Sequence[Sequence[float]] | None = None,
) -> InputCalibration:
    """Thresholds that drop ``sparsity`` of every site's inputs (``allocation="uniform"``),
    or per layer and site the share :func:`greedy_shares` finds (``"greedy"``: the same
    share of the projections' bytes on average), or ``site_sparsity``'s own; and ``sparsity``
    of the output head's inputs when ``output``. The engine is left in dense mode."""
    if not 0.0 <= sparsity < 1.0:
        raise ShapeError(f"sparsity must lie in [0, 1), got {sparsity}")
    if allocation not in ALLOCATIONS:
        raise ShapeError(f"allocation {allocation!r} (choose {', '.join(ALLOCATIONS)})")
    n = engine.config.n_layers
    engine.set_sparsity("dense")
    sampler = capture_scores(
        engine,
        ids,
        score=score,
        window=window,
        sample_values=sample_values,
        seed=seed,
        progress=progress,
    )
    if site_sparsity is None and allocation == "greedy" and sparsity > 0:
        site_sparsity = greedy_shares(
            engine, ids, sampler, sparsity, score=score, window=window, progress=progress
        )
    thresholds, below = [], []
    for i in range(n):
        row, row_below = [], []
        for k in range(4):
            s = sparsity if site_sparsity is None else float(site_sparsity[i][k])
            t = float(np.float32(sampler.quantile(4 * i + k, s))) if s > 0 else 0.0
            row.append(max(t, 0.0))
            row_below.append(sampler.fraction_below(4 * i + k, row[-1]) if t > 0 else 0.0)
        thresholds.append(row)
        below.append(row_below)
    out_t = float(np.float32(sampler.quantile(4 * n, sparsity))) if output and sparsity else 0.0
    tf = InputThresholds(
        thresholds=thresholds,
        output=max(out_t, 0.0),
        score=score,
        model_fingerprint=getattr(engine.loaded, "fingerprint", None),
        target_sparsity=sparsity,
        measured_sparsity=below,
        tokens=len(ids),
    )
    return InputCalibration(tf, below)


@dataclass
class InputHeldOut:
    """Perplexity cost of the input mode on held-out tokens, and the share of each site's
    inputs it dropped there (per layer, per site)."""

    tokens: int
    ppl_dense: float
    ppl_input: float
    dropped: list[list[float]] = field(default_factory=list)

    @property
    def ppl_change(self) -> float:
        return self.ppl_input / self.ppl_dense - 1.0


def held_out_input_cost(
    engine: Any,
    ids: Sequence[int],
    tf: InputThresholds,
    *,
    window: int = 256,
    progress: bool = True,
    ppl_dense: float | None = None,
) -> InputHeldOut:
    """Dense and input-mode perplexity of ``ids``, and the share of inputs each site dropped
    (the site rows of the input-mode run, against the thresholds). The engine is left in
    dense mode."""
    if ppl_dense is None:
        engine.set_sparsity("dense")
        ppl_dense, _ = stage_args.perplexity_and_activity(
            engine, ids, window=window, progress=progress
        )
    engine.set_sparsity("input", thresholds=tf)
    n = engine.config.n_layers
    norms = site_norms(engine, tf.score)
    dropped = np.zeros((n, 4))
    counted = np.zeros((n, 4))

    def on_window(_n: int) -> None:
        layers, _out = engine.take_sites()
        for i, k, v in _site_scores(layers, norms):
            dropped[i, k] += float(np.sum(v < tf.thresholds[i][k]))
            counted[i, k] += v.size

    try:
        ppl_i = float(engine.perplexity_of_ids(list(ids), window=window, progress=progress))
        # The shares dropped, from the input mode's own site rows (each window's first token,
        # kept dense, left out).
        engine.start_profiling(capture_sites=True)
        stage_args.feed_windows(
            engine, ids, window, on_window=on_window, desc="held-out sites", progress=progress
        )
    finally:
        engine.stop_profiling()
        engine.set_sparsity("dense")
    share = np.divide(dropped, np.maximum(counted, 1))
    return InputHeldOut(len(ids), float(ppl_dense), ppl_i, share.tolist())


def format_table(tf: InputThresholds, held: list[list[float]] | None = None) -> str:
    """Per layer the four thresholds and (held out) the shares dropped."""
    head = f"{'layer':>5} | " + " | ".join(f"{s:>17}" for s in SITES)
    lines = [head, "-" * len(head)]
    for i, row in enumerate(tf.thresholds):
        cells = []
        for k, t in enumerate(row):
            d = "" if held is None else f" ({held[i][k]:.2f})"
            cells.append(f"{t:>10.4g}{d:>7}")
        lines.append(f"{i:>5} | " + " | ".join(cells))
    if tf.output:
        lines.append(f"output head: {tf.output:.4g}")
    return "\n".join(lines)
