"""bench_parallel.py's runs: one throughput run (the prompts one at a time, then all at once) and
one prefix-cache run (A, B, then A again), each timed with the server's and the other
processes' CPU by the one race's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _bench_common import (
    timed,
)
from _parallel_servers import (
    Spec,
    stream_chat,
)
from _parallel_workloads import conversations, user
from bench_server import cpu_seconds


def usage(spec: Spec, fn: Callable[[], Any]) -> tuple[Any, dict]:
    """``fn()`` timed by the one race's clock (:func:`_bench_common.timed`), the server's CPU
    read from /proc: (its value, the server's and other processes' CPU per wall second)."""
    pid = spec.server.proc.pid
    run = timed(fn, lambda: cpu_seconds(pid))
    return run.value, {"server_cpu_per_wall": run.cpu_util, "others_cpu_per_wall": run.others_util}


def throughput_run(spec: Spec, prompts: list[str], max_tokens: int) -> dict:
    """The prompts one at a time, then all at once."""
    alone, lone = usage(
        spec, lambda: [stream_chat(spec, user(p), max_tokens, True) for p in prompts]
    )
    t0 = time.perf_counter()

    def together_run():
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p: stream_chat(spec, user(p), max_tokens, True), prompts))

    together, conc = usage(spec, together_run)
    wall = time.perf_counter() - t0
    one_tokens = sum(r["tokens"] for r in alone)
    n_tokens = sum(r["tokens"] for r in together)
    same = [a["text"] == b["text"] for a, b in zip(alone, together)]
    return {
        "one_stream_tok_s": one_tokens / sum(r["wall_s"] for r in alone),
        "n_streams_tok_s": n_tokens / wall,
        "one_stream_tokens": [r["tokens"] for r in alone],
        "n_streams_tokens": [r["tokens"] for r in together],
        "n_streams_wall_s": wall,
        "n_streams_ttft_s": [r["ttft_s"] for r in together],
        "tokens_from": together[0]["tokens_from"],
        "texts_equal": same,
        "first_difference": [first_diff(a["text"], b["text"]) for a, b in zip(alone, together)],
        "alone_cpu": lone,
        "concurrent_cpu": conc,
    }


def first_diff(a: str, b: str) -> int | None:
    """The first character where ``a`` and ``b`` differ (None when equal)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def cache_run(spec: Spec, session: str, sys_tokens: int, answer_tokens: int) -> dict:
    """A's first turn, B, then A's second turn; the TTFT of each."""
    conv = conversations(session, sys_tokens)

    def turns():
        a1 = stream_chat(spec, conv["A1"], answer_tokens, False)
        b = stream_chat(spec, conv["B"], 16, False)
        a2_msgs = [*conv["A1"], {"role": "assistant", "content": a1["text"]}, *conv["A2"]]
        return a1, b, stream_chat(spec, a2_msgs, 16, False)

    (a1, b, a2), cpu = usage(spec, turns)
    out = {"cpu": cpu, "answer_tokens": a1["tokens"]}
    for name, r in (("A1", a1), ("B", b), ("A2", a2)):
        out[name] = {k: v for k, v in r.items() if k not in ("text", "tokens_from")}
    return out
