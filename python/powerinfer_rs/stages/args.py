"""What the stage commands share: their argument handling (:func:`stage_parser` and the
``add_*`` helpers, argparse types, :func:`run_cli` with its error convention: one line on
stderr, exit status 2), and for calibrate / profile / evaluate and the sparse benchmark:
loading an engine, turning a corpus into token ids, running the engine over token windows with
a fresh context each, sampling activations with bounded memory."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import PowerInferError, ShapeError
from .corpus import CorpusError, read_corpus

#: Threshold that makes "|act| >= t" mean "act != 0" (the smallest positive float32).
NONZERO = float(np.nextafter(np.float32(0), np.float32(1)))


def run_cli(fn: Callable[[], int], *, error_class: bool = False) -> int:
    """Run a command's body: :class:`PowerInferError` and I/O errors become ``error: ...`` on
    stderr (with the error's class name when ``error_class``) and exit status 2, no traceback;
    Ctrl-C exits 130."""
    try:
        return fn()
    except PowerInferError as e:
        kind = f"{type(e).__name__}: " if error_class else ""
        print(f"error: {kind}{e}", file=sys.stderr)
        return 2
    except OSError as e:
        name = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"error: {name}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def stage_parser(
    stage: str, description: str, *, epilog: str | None = None, model_help: str | None = None
) -> argparse.ArgumentParser:
    """The parser of ``python -m powerinfer_rs.<stage>``, with its ``--model`` argument."""
    ap = argparse.ArgumentParser(
        prog=f"python -m powerinfer_rs.{stage}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model",
        required=True,
        help=model_help or "GGUF file, Hugging Face model directory or hub id org/repo[:QUANT]",
    )
    return ap


def add_text_args(
    ap: argparse.ArgumentParser, flag: str, help: str, *, tokens: int, tokens_help: str
) -> None:
    """``flag`` (text files, HTML pages or directories; several allowed) and ``--tokens``."""
    ap.add_argument(flag, required=True, nargs="+", metavar="FILE", help=help)
    ap.add_argument(
        "--tokens", type=positive_int, default=tokens, help=f"{tokens_help} (default {tokens})"
    )


def add_share_arg(
    ap: argparse.ArgumentParser,
    flag: str,
    default: float,
    help: str,
    type: Callable[[str], float] | None = None,
) -> None:
    """A float option ``flag`` (a share or fraction): finite, and in the range of ``type``
    (e.g. :data:`share`) when given, else the stage checks its range."""
    ap.add_argument(
        flag, type=type or float_in(), default=default, help=f"{help} (default {default})"
    )


def add_window_arg(ap: argparse.ArgumentParser, help: str) -> None:
    """``--window``: tokens per forward window, a fresh context each (default 256)."""
    ap.add_argument("--window", type=positive_int, default=256, help=f"{help} (default 256)")


def add_thresholds_arg(ap: argparse.ArgumentParser, what_for: str) -> None:
    """``--thresholds T``: a threshold file from ``calibrate``."""
    ap.add_argument(
        "--thresholds",
        metavar="T",
        help=f"threshold file (python -m powerinfer_rs.calibrate): {what_for}",
    )


def add_run_args(ap: argparse.ArgumentParser, *, threads: bool = True) -> None:
    """``--threads`` (with ``threads``) and ``--quiet``."""
    if threads:
        ap.add_argument("--threads", type=nonneg_int, default=0, help="threads (0 = one per core)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")


def entry_point(
    build_parser: Callable[[], argparse.ArgumentParser],
    run: Callable[[argparse.Namespace], int],
    *,
    check: Callable[[argparse.Namespace], str | None] | None = None,
) -> Callable[[Sequence[str] | None], int]:
    """A stage's ``main(argv=None)``: parse ``argv`` and ``check`` the values (usage errors
    exit 2 through argparse), then :func:`run_cli` the stage; returns the exit status."""

    def main(argv: Sequence[str] | None = None) -> int:
        """Entry point; returns the exit status (2 with a one-line message on bad input)."""
        ap = build_parser()
        a = ap.parse_args(argv)
        problem = check(a) if check is not None else None
        if problem:
            ap.error(problem)
        return run_cli(lambda: run(a))

    return main


def _int_at_least(s: str, low: int, what: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def positive_int(s: str) -> int:
    """argparse type: an integer > 0."""
    return _int_at_least(s, 1, "a positive integer")


def nonneg_int(s: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(s, 0, "an integer >= 0")


def at_least_int(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``low``."""

    def parse(s: str) -> int:
        return _int_at_least(s, low, f"an integer >= {low}")

    parse.__name__ = f"integer >= {low}"
    return parse


def float_in(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Callable[[str], float]:
    """argparse type: a finite float in the interval from ``low`` to ``high`` (None: no
    bound; ``*_open``: the bound itself excluded). Out of range, argparse prints
    ``argument --flag: expected ..., got ...`` and exits 2."""
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    want = f"a number {lo}{' and ' if lo and hi else ''}{hi}".strip()

    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {s!r}") from None
        ok = math.isfinite(v)
        if ok and low is not None:
            ok = v > low if low_open else v >= low
        if ok and high is not None:
            ok = v < high if high_open else v <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"expected {want}, got {s}")
        return v

    parse.__name__ = want
    return parse


#: argparse types for shares: (0, 1] and [0, 1).
share = float_in(0.0, 1.0, low_open=True)
nonneg_float = float_in(0.0)
positive_float = float_in(0.0, low_open=True)


def load_engine(model: str | os.PathLike[str], threads: int = 0, n_ctx: int | None = None):
    """A dense :class:`~powerinfer_rs.runtime.engine.Engine` on ``model``."""
    from ..runtime.engine import Engine

    return Engine.from_pretrained(model, threads=threads, n_ctx=n_ctx)


def corpus_ids(
    engine: Any, paths: Sequence[str | os.PathLike[str]], tokens: int | None
) -> tuple[list[int], list[str]]:
    """Token ids of the corpus ``paths`` (at most ``tokens``; all with None) and the names
    read. Reads only as much text as the token count needs (about 8 characters a token,
    more when that falls short)."""
    if not paths:
        raise CorpusError("no corpus given")
    chars: int | None = None if tokens is None else max(4096, 8 * tokens)
    while True:
        text, names = read_corpus(paths, max_chars=chars)
        ids = engine.tokenizer.encode(text, add_bos=False)
        if tokens is None or len(ids) >= tokens or chars is None or len(text) < chars:
            break
        chars *= 4
    if tokens is not None:
        ids = ids[:tokens]
    if len(ids) < 2:
        raise CorpusError(f"the corpus {names} has {len(ids)} tokens; at least 2 are needed")
    return [int(i) for i in ids], names


def windows(ids: Sequence[int], window: int) -> list[list[int]]:
    """``ids`` cut into consecutive windows of ``window`` tokens (the last may be shorter)."""
    if window < 1:
        raise ShapeError(f"window must be >= 1, got {window}")
    return [list(ids[s : s + window]) for s in range(0, len(ids), window)]


def feed_windows(
    engine: Any,
    ids: Sequence[int],
    window: int,
    *,
    on_window: Callable[[int], bool | None] | None = None,
    desc: str = "tokens",
    progress: bool = True,
) -> int:
    """Run ``engine`` over ``ids`` in windows of ``window`` tokens, each in a fresh context
    (prefill only: no logits beyond the last row are made). ``on_window(n)`` is called after
    each window of ``n`` tokens; returning True stops early. Returns the tokens fed."""
    from tqdm import tqdm

    window = min(window, engine.n_ctx)
    fed = 0
    with tqdm(total=len(ids), desc=desc, unit="tok", disable=not progress) as bar:
        for chunk in windows(ids, window):
            engine.reset()
            engine.prefill(chunk)
            fed += len(chunk)
            bar.update(len(chunk))
            if on_window is not None and on_window(len(chunk)):
                break
    engine.reset()
    return fed


def capture_windows(
    engine: Any,
    ids: Sequence[int],
    window: int,
    on_rows: Callable[[list[tuple[np.ndarray, np.ndarray]]], None],
    *,
    desc: str,
    progress: bool = True,
) -> int:
    """:func:`feed_windows` with the engine's capture on: each window's captured rows, per
    layer ``(FFN input, activation)``, go to ``on_rows``. Returns the tokens fed."""
    engine.start_profiling(capture=True)
    try:
        return feed_windows(
            engine,
            ids,
            window,
            on_window=lambda _n: on_rows(engine.take_captured()),
            desc=desc,
            progress=progress,
        )
    finally:
        engine.stop_profiling()


class ValueSampler:
    """A bounded, uniform random sample of the values streamed through :meth:`add`, per
    layer: keeps every value until ``capacity`` are held, then a reservoir-style subsample
    (each batch contributes in proportion to its size). Used for quantiles of |act|."""

    def __init__(self, n_layers: int, capacity: int = 1 << 20, seed: int = 0) -> None:
        if capacity < 1:
            raise ShapeError(f"sample capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.held: list[np.ndarray] = [np.empty(0, np.float32) for _ in range(n_layers)]
        self.seen = [0] * n_layers

    def add(self, layer: int, values: np.ndarray) -> None:
        """Stream ``values`` (any shape) of ``layer``."""
        v = np.asarray(values, dtype=np.float32).reshape(-1)
        if v.size == 0:
            return
        self.seen[layer] += v.size
        held = self.held[layer]
        if held.size + v.size <= self.capacity and held.size == self.seen[layer] - v.size:
            self.held[layer] = np.concatenate([held, v])
            return
        # keep each seen value with probability capacity / seen: subsample the new batch at
        # that rate and the held sample down to its share
        rate = self.capacity / self.seen[layer]
        k_new = min(v.size, int(round(rate * v.size)))
        k_old = min(held.size, self.capacity - k_new)
        new = v[self.rng.choice(v.size, k_new, replace=False)] if k_new < v.size else v
        old = held[self.rng.choice(held.size, k_old, replace=False)] if k_old < held.size else held
        self.held[layer] = np.concatenate([old, new])

    def quantile(self, layer: int, q: float) -> float:
        """The ``q``-quantile of ``layer``'s sampled values."""
        h = self.held[layer]
        if h.size == 0:
            raise ShapeError(f"no values sampled for layer {layer}")
        return float(np.quantile(h, q))

    def fraction_below(self, layer: int, t: float) -> float:
        """Share of ``layer``'s sampled values below ``t``."""
        h = self.held[layer]
        return float(np.count_nonzero(h < t)) / max(1, h.size)


def active_mask(act: np.ndarray, threshold: float | None) -> np.ndarray:
    """The active mask of captured neuron values ``act`` (h = act(gate)·up): ``h != 0``
    without a threshold (ReLU semantics), ``|h| >= threshold`` with one -- the engine's rule."""
    if threshold is None:
        return act != 0
    return np.abs(act) >= np.float32(threshold)


def top_share(counts: np.ndarray, fraction: float) -> float:
    """Share of all activations (sum of counts) that the ``fraction`` most active neurons
    account for."""
    c = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    total = c.sum()
    if total <= 0:
        return 0.0
    k = max(1, int(math.ceil(fraction * c.size)))
    return float(c[:k].sum() / total)


def fmt_pct(x: float) -> str:
    """``+1.23%`` style."""
    return f"{100 * x:+.2f}%"


def perplexity_and_activity(
    engine: Any,
    ids: Sequence[int],
    *,
    window: int,
    count_thresholds: Sequence[float] | None = None,
    progress: bool = False,
) -> tuple[float, np.ndarray]:
    """Perplexity of ``ids`` in the engine's current sparsity mode (windows of ``window``
    tokens, fresh context each) and, counted by the engine's profiler during the same passes,
    the per-layer active fraction of FFN neurons (ReLU semantics without
    ``count_thresholds``, ``|act| >= t`` with them; the activations are those after the
    mode's mask, so skipped neurons count as inactive)."""
    engine.start_profiling(thresholds=None if count_thresholds is None else list(count_thresholds))
    try:
        ppl = engine.perplexity_of_ids(list(ids), window=window, progress=progress)
        counts, tokens = engine.profile_counts()
    finally:
        engine.stop_profiling()
    ffn = engine.config.ffn_dim
    active = np.asarray(counts, dtype=np.float64).sum(axis=1) / max(1, tokens * ffn)
    return float(ppl), active
