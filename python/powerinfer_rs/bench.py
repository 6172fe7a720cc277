"""``powerinfer-rs bench``: prompt-processing (pp) and decode (tg) tokens/s of a model, per
thread count and sparsity mode, as llama-bench reports them.

``ppN`` is one batched forward pass over N token ids on an empty context; ``tgN`` is N
single-token decode steps after a one-token prompt (the engine's own decode timer). The modes
of one thread count are raced in alternation (:func:`.benchmarking.race`), each figure the
median of ``--repeats`` runs; a row also says how busy the engine and the rest of the machine
were. Output: a markdown table (default) or JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

from .benchmarking import Column, Run, int_list, markdown_table, median, race

COLUMNS: list[Column] = [
    ("model", "model", "s"),
    ("mode", "mode", "s"),
    ("threads", "threads", "d"),
    ("test", "test", "s"),
    ("t/s", "tokens_per_second", ".2f"),
    ("± sd", "stddev", ".2f"),
    ("cpu util", "cpu_util", ".2f"),
    ("others' cpu", "others_util", ".2f"),
]


def _positive(s: str) -> int:
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {s!r}")
    return v


def _modes(s: str) -> list[str]:
    from . import _core

    out = [m for m in s.split(",") if m]
    bad = [m for m in out if m not in _core.SPARSITY_MODES]
    if bad or not out:
        raise argparse.ArgumentTypeError(
            f"unknown mode(s) {bad or s!r}; choose from {', '.join(_core.SPARSITY_MODES)}"
        )
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``powerinfer-rs bench``."""
    from . import _core

    p.add_argument(
        "--model",
        "-m",
        action="append",
        default=None,
        help="GGUF file, Hugging Face directory or hub id org/repo[:QUANT]; repeat for several "
        "(default: "
        "SmolLM2-135M-Instruct Q4_1, fetched once into the cache)",
    )
    p.add_argument(
        "--threads",
        "-t",
        type=int_list,
        default=[os.cpu_count() or 1],
        help="comma-separated thread counts, e.g. 1,2 (default: one per core)",
    )
    p.add_argument(
        "--prompt-tokens",
        "-p",
        type=int,
        default=512,
        help="tokens of the pp test, 0 to skip it (default 512)",
    )
    p.add_argument(
        "--tokens",
        "-n",
        type=int,
        default=64,
        help="tokens of the tg test, 0 to skip it (default 64)",
    )
    p.add_argument(
        "--repeats",
        "-r",
        type=_positive,
        default=5,
        help="timed runs of each test per mode; the figure is their median (5)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (1)")
    p.add_argument(
        "--mode",
        type=_modes,
        default=["dense"],
        help="comma-separated sparsity modes, raced in alternation: "
        + ", ".join(_core.SPARSITY_MODES)
        + " (default dense; threshold, input and "
        "predictor need --thresholds or --predictors)",
    )
    p.add_argument("--thresholds", default=None, help="threshold file for threshold/input")
    p.add_argument("--predictors", default=None, help="predictor file for predictor")
    p.add_argument(
        "--format",
        "-o",
        choices=["markdown", "json"],
        default="markdown",
        help="output: a markdown table like llama-bench's (default) or JSON",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the pp test's token ids")


def _engine(model: str | None, threads: int, mode: str, n_ctx: int, a) -> Any:
    from .runtime.engine import Engine

    files = {}
    if mode in ("threshold", "input") and a.thresholds:
        files["thresholds"] = a.thresholds
    if mode == "predictor" and a.predictors:
        files["predictors"] = a.predictors
    return Engine.from_pretrained(model, threads=threads, n_ctx=n_ctx, sparsity=mode, **files)


def _pp(engine, ids: list[int]):
    def once() -> int:
        engine.reset()
        engine.prefill(ids)
        return len(ids)

    return once


def _tg(engine, first: int, n: int):
    def once() -> dict:
        engine.reset()
        engine.generate([first], max_new_tokens=n + 1, temperature=0.0, seed=0, ignore_eos=True)
        st = engine.stats()  # n + 1 sampled tokens = n single-token decode steps
        return {"tokens": st["decode_tokens"], "seconds": st["decode_seconds"]}

    return once


def _row(
    model: str, mode: str, threads: int, test: str, rates: list[float], runs: list[Run]
) -> dict:
    m = median(rates)
    sd = math.sqrt(sum((x - m) ** 2 for x in rates) / (len(rates) - 1)) if len(rates) > 1 else 0.0
    return {
        "model": model,
        "mode": mode,
        "threads": threads,
        "test": test,
        "n_tokens": int(test[2:]),
        "tokens_per_second": m,
        "stddev": sd,
        "samples": rates,
        "cpu_util": median([r.cpu_util for r in runs]),
        "others_util": median([r.others_util for r in runs]),
    }


def bench_model(model: str | None, threads: int, a) -> list[dict]:
    """The pp and tg rows of ``model`` at ``threads``, every mode raced in alternation."""
    n_ctx = a.prompt_tokens + a.tokens + 8
    engines = {mode: _engine(model, threads, mode, n_ctx, a) for mode in a.mode}
    name = Path(model).name if model else "default (SmolLM2-135M-Instruct Q4_1)"
    vocab = next(iter(engines.values())).config.vocab_size
    rng = random.Random(a.seed)
    rows: list[dict] = []
    if a.prompt_tokens:
        ids = [rng.randrange(1, vocab) for _ in range(a.prompt_tokens)]
        runs = race({m: _pp(e, ids) for m, e in engines.items()}, a.repeats, warmup=a.warmup)
        for mode, rs in runs.items():
            rates = [r.value / r.wall_s for r in rs]
            rows.append(_row(name, mode, threads, f"pp{a.prompt_tokens}", rates, rs))
    if a.tokens:
        first = rng.randrange(1, vocab)
        runs = race(
            {m: _tg(e, first, a.tokens) for m, e in engines.items()}, a.repeats, warmup=a.warmup
        )
        for mode, rs in runs.items():
            rates = [r.value["tokens"] / r.value["seconds"] for r in rs]
            rows.append(_row(name, mode, threads, f"tg{a.tokens}", rates, rs))
    return rows


def cmd_bench(a: argparse.Namespace) -> int:
    """Run the benchmark ``a`` describes and print its table or JSON."""
    if a.prompt_tokens < 0 or a.tokens < 0 or not (a.prompt_tokens or a.tokens):
        raise SystemExit("bench: --prompt-tokens and --tokens must be >= 0, not both 0")
    rows = []
    for model in a.model or [None]:
        for threads in a.threads:
            rows.extend(bench_model(model, threads, a))
            if a.format == "markdown":
                print(f"done: {model or 'default model'}, {threads} thread(s)", file=sys.stderr)
    if a.format == "json":
        print(json.dumps({"repeats": a.repeats, "results": rows}, indent=2))
    else:
        print(markdown_table(rows, COLUMNS))
    return 0
