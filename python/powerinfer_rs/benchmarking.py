"""The benchmark harness's core, shared by ``powerinfer-rs bench`` and the scripts under
``benchmarks/``: one alternating race, the runner protocol the engines follow, and one
markdown/JSON report writer.

The race runs its contenders in turn, the order reversed every other repeat (A B, B A, A B,
...: no contender always goes first on a machine whose load drifts), and measures each run's
wall time, the CPU time its engine used and the CPU time every other process on the machine
used over the same interval (``/proc/stat``'s busy time less the engine's own), so a figure
taken while something else ran can be told from a clean one."""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


def busy_cpu_seconds() -> float:
    """CPU-seconds spent busy by every process on the machine so far (Linux ``/proc/stat``;
    0.0 elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return 0.0
    ticks = [int(v) for v in fields]
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    busy = sum(ticks[:8]) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU-seconds of this process's waited-for children (an engine run as a subprocess)."""
    t = os.times()
    return t.children_user + t.children_system


def int_list(s: str) -> list[int]:
    """A comma-separated list of positive integers (``--threads 1,2``), for argparse."""
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of positive integers: {s!r}")
    return out


def median(xs: Sequence[float]) -> float:
    """The median of ``xs`` (nan when empty)."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return float("nan")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class Run:
    """One run of one contender: what it returned, and the time it took."""

    value: Any
    wall_s: float
    cpu_s: float  # the engine's own CPU time (this process's, or its subprocess's)
    others_cpu_s: float  # every other process's busy CPU time over the same interval

    @property
    def cpu_util(self) -> float:
        """The engine's CPU-seconds per wall-second."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def others_util(self) -> float:
        """Other processes' CPU-seconds per wall-second (cores they kept busy)."""
        return self.others_cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def timed(fn: Callable[[], Any], own_cpu: Callable[[], float] = time.process_time) -> Run:
    """Run ``fn()`` once and time it; ``own_cpu`` reads the engine's cumulative CPU-seconds
    (default: this process's; :func:`children_cpu_seconds` for a subprocess, or a server's
    ``/proc/PID/stat``)."""
    b0, c0, w0 = busy_cpu_seconds(), own_cpu(), time.perf_counter()
    value = fn()
    wall, cpu = time.perf_counter() - w0, own_cpu() - c0
    others = max(busy_cpu_seconds() - b0 - cpu, 0.0)
    return Run(value, wall, cpu, others)


def alternation(names: Sequence[str], repeat: int) -> list[str]:
    """The order of ``names`` in repeat ``repeat``: as given on even repeats, reversed on odd
    (A B, B A, A B, ...). With three or more, each pair of repeats also starts one further
    along (A B C, C B A, B C A, A C B, ...), so that none is always in the middle."""
    n = len(names)
    k = (repeat // 2) % n if n > 2 else 0
    order = list(names[k:]) + list(names[:k])
    return order if repeat % 2 == 0 else order[::-1]


def race(
    contenders: Mapping[str, Callable[[], Any]],
    repeats: int,
    *,
    warmup: int = 0,
    own_cpu: Mapping[str, Callable[[], float]] | None = None,
    on_run: Callable[[str, int, Run], None] | None = None,
    before_round: Callable[[int], None] | None = None,
) -> dict[str, list[Run]]:
    """Run every contender ``repeats`` times, alternating (see :func:`alternation`), after
    ``warmup`` untimed runs each; returns ``{name: [Run, ...]}`` in run order. ``own_cpu`` maps
    a name to its CPU counter (default :func:`time.process_time`); ``on_run(name, repeat,
    run)`` is told of every timed run (to print progress); ``before_round(repeat)`` runs,
    untimed, before each round (a bandwidth probe)."""
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    runs: dict[str, list[Run]] = {name: [] for name in names}
    for r in range(repeats):
        if before_round is not None:
            before_round(r)
        for name in alternation(names, r):
            counter = (own_cpu or {}).get(name, time.process_time)
            run = timed(contenders[name], counter)
            runs[name].append(run)
            if on_run is not None:
                on_run(name, r, run)
    return runs


#: Other processes' CPUs (CPU s per wall s) above which a run's figures count as disturbed.
BUSY_OTHERS = 0.25


def looks_busy(others: float | None, own: float | None, threads: int) -> bool:
    """Whether other processes took CPU time during a run: by their CPU where it was measured
    (more than :data:`BUSY_OTHERS`), else by ours falling short of the ``threads`` asked for
    (an engine that sleeps between operations falls short on an idle machine too)."""
    if others is not None:
        return others > BUSY_OTHERS
    return own is not None and own < 0.9 * threads


def summary(runs: Sequence[Run], rate: Callable[[Run], float]) -> dict[str, Any]:
    """Median ``rate`` over ``runs`` with its samples and the median CPU figures."""
    return {
        "median": median([rate(r) for r in runs]),
        "samples": [rate(r) for r in runs],
        "cpu_util": median([r.cpu_util for r in runs]),
        "others_util": median([r.others_util for r in runs]),
    }


def decode_rate(engine: Any, prompt_ids: Sequence[int], n: int) -> float:
    """Tokens/s of ``n`` single-token decode steps of our ``engine`` after ``prompt_ids`` on an
    empty context (greedy, end of text ignored), by the engine's own decode clock."""
    engine.reset()
    engine.generate(
        list(prompt_ids), max_new_tokens=n + 1, temperature=0.0, seed=0, ignore_eos=True
    )
    st = engine.last_stats  # n + 1 sampled tokens = n single-token decode steps
    return st.decode_tokens / st.decode_seconds


@dataclass(frozen=True)
class Decode:
    """Workload: ``n`` single-token greedy decode steps after ``prompt_ids`` (prefill not
    timed); a runner returns ``(tokens decoded, seconds)``."""

    prompt_ids: Sequence[int]
    n: int


@dataclass(frozen=True)
class Prefill:
    """Workload: one batched forward pass over ``ids`` on an empty context; a runner returns
    its seconds."""

    ids: Sequence[int]


@runtime_checkable
class Runner(Protocol):
    """An engine a benchmark races: ours, llama.cpp (llama-cpp-python), llama-server,
    PowerInfer. ``load()`` once, ``run(workload)`` per timed run (returns what the benchmark
    reports: tokens, seconds, text, ...), ``close()`` at the end."""

    name: str

    def load(self) -> None: ...

    def run(self, workload: Any) -> Any: ...

    def close(self) -> None: ...


def race_runners(
    runners: Mapping[str, Runner] | Sequence[Runner],
    workload: Any,
    repeats: int,
    *,
    warmup: int = 0,
    on_run: Callable[[str, int, Run], None] | None = None,
) -> dict[str, list[Run]]:
    """:func:`race` of ``runner.run(workload)`` for every runner (already loaded), keyed as
    given (or by ``runner.name``); a runner with an ``own_cpu()`` method (a subprocess's
    counter) is charged with that."""
    named = dict(runners) if isinstance(runners, Mapping) else {r.name: r for r in runners}
    own = {k: r.own_cpu for k, r in named.items() if callable(getattr(r, "own_cpu", None))}
    fns = {k: (lambda r=r: r.run(workload)) for k, r in named.items()}
    return race(fns, repeats, warmup=warmup, own_cpu=own, on_run=on_run)


# -- reports ---------------------------------------------------------------------------------


def fmt(x: Any, spec: str = ".1f", none: str = "-") -> str:
    """``x`` formatted with ``spec``; ``none`` for None, nan and infinities."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


Column = tuple[str, str, str]  # (header, key in the row, format spec)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """``rows`` as a markdown table of ``columns`` (header, key, spec); numbers right-aligned,
    missing cells "-"."""
    cells = [[fmt(row.get(key), spec) for _, key, spec in columns] for row in rows]
    heads = [h for h, _, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    numeric = [spec != "s" for _, _, spec in columns]

    def line(vals: Sequence[str]) -> str:
        out = [v.rjust(w) if n else v.ljust(w) for v, w, n in zip(vals, widths, numeric)]
        return "| " + " | ".join(out) + " |"

    rule = (
        "|"
        + "|".join(("-" * (w + 1) + ":") if n else ("-" * (w + 2)) for w, n in zip(widths, numeric))
        + "|"
    )
    return "\n".join([line(heads), rule, *(line(c) for c in cells)])


def jsonable(x: Any) -> Any:
    """``x`` with Runs as dicts (and their utilisations), for ``json.dumps``."""
    if isinstance(x, Run):
        return {
            **asdict(x),
            "value": jsonable(x.value),
            "cpu_util": x.cpu_util,
            "others_util": x.others_util,
        }
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def write_report(
    path: str | os.PathLike | None, report: Mapping[str, Any], markdown: str | None = None
) -> None:
    """Write ``report`` as JSON to ``path`` (when given, saying so) and ``markdown`` (the
    tables printed) beside it as ``.md``."""
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(jsonable(report), indent=2, default=str))
    if markdown is not None:
        p.with_suffix(".md").write_text(markdown + "\n")
    print(f"results written to {p}")
