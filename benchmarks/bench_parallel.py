#!/usr/bin/env python3
"""Parallel slots and the prefix cache of our server (issue 62) against llama.cpp's
``llama-server``, side by side in one run, through the official ``openai`` client (streamed
chat completions, temperature 0).

1. Throughput. Each server answers --streams different prompts (ones that make the model talk
   long; ``ignore_eos`` sent as an extra body field, which both servers honour, and
   ``max_tokens`` = --max-tokens), first one at a time ("1 stream": completion tokens / summed
   wall time of the lone requests), then all at once ("N streams": completion tokens / wall time
   from the first request sent to the last one done). Completion tokens are the ones the server
   reports in its usage chunk (content chunks counted when it sends none). Servers: ours with
   ``--parallel N`` and with ``--parallel 1`` (the baseline), llama-server with ``-np N`` and
   ``-np 1`` (its own baseline). The servers' runs alternate (the order reversed every other
   repeat); medians of --repeats. Checked as well: each concurrent stream's greedy text equals
   the text of the same prompt run alone on the same server (what must hold for ours; shown for
   llama-server too).

2. Prefix cache, time to first token. Conversation A (a ~--system-tokens system prompt with a
   tools list, then a user turn; its answer is --answer-tokens long), then conversation B
   (another system prompt of that size and a turn), then A's second turn (A's system prompt,
   turn 1, the assistant's answer, turn 2). TTFT of A's second turn with the cache on (the
   server's default) and off (``--cache-ram 0``, on both servers), one slot each (--cache-slots:
   with one slot, B's prompt evicts A's from the slot, so only the cache can bring it back).
   Every repeat uses new conversations (a session number opens both system prompts), so
   nothing carries over between repeats. Goal: ours on/off <= 0.25. llama-server's defaults:
   ``--cache-ram 8192`` MiB of host memory for saved prompt states, ``cache_prompt`` true (a
   request reuses the common prefix of its slot's KV), ``--cache-idle-slots`` (a slot's state is
   saved to that cache before a new prompt replaces it); with ``--cache-ram 0`` only a slot's own
   common prefix is reused. Its ``timings`` (prompt tokens computed, ``cache_n`` reused) are
   recorded.

Our server gains ``--parallel N`` and ``--cache-ram MIB`` with issue 62; the script reads
``serve --help`` and leaves out (saying so) what the server in this checkout cannot do yet: no
--parallel, ours runs as it is (one request at a time) in the "parallel 1" rows; no
--cache-ram, no "cache off" row for ours. Our /health (and its "parallel", "slots" and
"prefix_cache" fields, once there) is recorded for every server.

All servers run as subprocesses on free 127.0.0.1 ports with --threads threads, are waited for
through /health and are killed at exit. llama-server is built by hand outside the checkout (see
PEERS.md; not part of this repository): --llama-server PATH, else $LLAMA_SERVER, else the first
/tmp/peers/**/bin/llama-server; without it its rows are skipped with a message. Printed beside
the figures: the exact commands, the host's read bandwidth (``powerinfer_rs._core.
measure_read_bandwidth``) before and after, the load average, and each run's server CPU
seconds per wall second and the other processes' (a busy machine makes the figures worthless).

Examples::

    python benchmarks/bench_parallel.py                            # everything, 3 repeats
    python benchmarks/bench_parallel.py --repeats 5 --json out/parallel.json
    python benchmarks/bench_parallel.py --quick                    # smoke: short, 1 repeat
    python benchmarks/bench_parallel.py --only ours --skip cache
    python benchmarks/bench_parallel.py --llama-server /tmp/peers/x/build/bin/llama-server
"""

from __future__ import annotations

import atexit
import glob
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    REPO,
    add_bandwidth_args,
    bench_parser,
    busy_cpu_seconds,
    default_model,
    machine_info,
    measure_bandwidth,
    median,
    write_json,
)
from bench_server import Server, cpu_seconds, free_port  # noqa: E402

STORY_PROMPTS = [
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
    "Describe every character, the weather and the sea at length.",
    "Explain in great detail, step by step, how a steam locomotive works, from the firebox to "
    "the wheels, with examples and a short history.",
    "Write a long travel diary of a week spent walking through the mountains of a country you "
    "choose. Describe each day in detail: food, people, paths and weather.",
    "Give a long and thorough lecture on the water cycle for a class of curious students, with "
    "many examples, questions to the class and their answers.",
    "Write a long fairy tale about a fox, a clockmaker and a snowy town, with dialogue.",
    "Describe in detail how to bake bread at home, every step, every mistake to avoid.",
    "Tell the long history of a fictional library across five centuries.",
    "Write a long letter from a sailor to his family describing a voyage around the world.",
]


# ---------------------------------------------------------------------------------------------
# prompts of the cache test


def tools_list(topic: str, n: int) -> str:
    """``n`` made-up tool descriptions (JSON-like), about ``topic``."""
    verbs = ["search", "get", "create", "update", "delete", "list", "summarize", "translate",
             "schedule", "compare", "export", "validate"]  # fmt: skip
    things = ["order", "invoice", "customer", "ticket", "shipment", "product", "review",
              "payment", "report", "meeting", "document", "warehouse", "route",
              "refund"]  # fmt: skip
    out = []
    for i in range(n):
        v, t = verbs[i % len(verbs)], things[(i * 5 + len(topic)) % len(things)]
        out.append(
            f'{{"name": "{v}_{t}_{i}", "description": "{v.capitalize()} a {t} of the {topic} '
            f'system. Use it when the user asks to {v} a {t}; never guess identifiers.", '
            f'"parameters": {{"type": "object", "properties": {{"{t}_id": {{"type": "string", '
            f'"description": "the {t} identifier"}}, "limit": {{"type": "integer", "minimum": 1, '
            f'"maximum": {10 + i}}}, "verbose": {{"type": "boolean"}}}}, "required": ["{t}_id"]}}}}'
        )
    return "\n".join(out)


def system_prompt(session: str, topic: str, tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (SmolLM2's tokenizer: ~115 tokens a tool),
    opening with ``session`` so that each repeat's prompts share nothing with the previous."""
    head = (
        f"Session {session}. You are the assistant of the {topic} help desk. Answer briefly and "
        f"politely. You can call the following tools by answering with a JSON object "
        f'{{"tool": NAME, "arguments": {{...}}}}; call one only when it is needed.\nTools:\n'
    )
    return head + tools_list(topic, max(1, round((tokens - 60) / 115)))


def conversations(session: str, sys_tokens: int) -> dict[str, list[dict]]:
    """The cache test's messages: A's first turn, B's turn, A's second turn (without the
    assistant's answer, filled in after A's first turn)."""
    a_sys = system_prompt(session, "online bookshop", sys_tokens)
    b_sys = system_prompt(session, "city bicycle rental", sys_tokens)
    return {
        "A1": [
            {"role": "system", "content": a_sys},
            {"role": "user", "content": "Hello! What kinds of things can you help me with?"},
        ],
        "B": [
            {"role": "system", "content": b_sys},
            {"role": "user", "content": "Hi, how do I rent a bicycle for the weekend?"},
        ],
        "A2": [{"role": "user", "content": "Thanks. Which tool would you use to find order 42?"}],
    }


# ---------------------------------------------------------------------------------------------
# servers


@dataclass
class Spec:
    """A server to start: ``key`` names it in the report, ``label`` in the table."""

    key: str
    label: str
    kind: str  # "ours" or "llama"
    argv: list[str]
    url: str = ""
    server: Server | None = None
    health: dict = field(default_factory=dict)
    client: Any = None  # an openai.OpenAI on the server
    model: str = ""  # the model id the server serves


_RUNNING: list[Server] = []


def _stop_all() -> None:
    while _RUNNING:
        _RUNNING.pop().stop()


atexit.register(_stop_all)


def start(spec: Spec, logs: Path) -> None:
    port = free_port()
    argv = [*spec.argv, "--port", str(port)]
    spec.argv = argv
    print(f"starting {spec.key}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    spec.server = Server(spec.key, argv, port, logs / f"{spec.key}.log", ready_path="/health")
    _RUNNING.append(spec.server)
    spec.url = spec.server.url
    spec.health = get_json(f"{spec.url}/health")
    from openai import OpenAI

    spec.client = OpenAI(base_url=f"{spec.url}/v1", api_key="none", max_retries=0, timeout=900)
    spec.model = spec.client.models.list().data[0].id


def stop(spec: Spec) -> None:
    if spec.client is not None:
        spec.client.close()
    if spec.server is not None:
        spec.server.stop()
        if spec.server in _RUNNING:
            _RUNNING.remove(spec.server)
        spec.server = None


def get_json(url: str) -> dict:
    try:
        r = httpx.get(url, timeout=5)
        return r.json() if r.status_code == 200 else {"http_status": r.status_code}
    except (httpx.HTTPError, ValueError) as e:
        return {"error": str(e)}


def serve_flags(py: str) -> set[str]:
    """The options ``python -m powerinfer_rs serve --help`` lists."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'python'}:{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [py, "-m", "powerinfer_rs", "serve", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    ).stdout
    return {w.strip("[],") for w in out.split() if w.startswith(("--", "[--"))}


def find_llama_server(arg: str | None) -> str | None:
    if arg:
        return arg if Path(arg).is_file() else None
    env = os.environ.get("LLAMA_SERVER")
    if env and Path(env).is_file():
        return env
    found = sorted(glob.glob("/tmp/peers/**/bin/llama-server", recursive=True))
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# requests


def stream_chat(spec: Spec, messages: list[dict], max_tokens: int, ignore_eos: bool) -> dict:
    """One streamed chat completion through the openai client: text, completion tokens, TTFT
    (request sent -> first content chunk), wall time, and what the server says of its prompt
    (usage's prompt tokens and their cached part; llama-server's ``timings``)."""
    t0 = time.perf_counter()
    stream = spec.client.chat.completions.create(
        model=spec.model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True} if ignore_eos else None,
    )
    ttft, pieces, chunks, usage, timings = None, [], 0, None, None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - t0
            pieces.append(chunk.choices[0].delta.content)
            chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        timings = (chunk.model_extra or {}).get("timings") or timings
    wall = time.perf_counter() - t0
    out = {
        "text": "".join(pieces),
        "tokens": usage.completion_tokens if usage else chunks,
        "tokens_from": "usage" if usage else "content chunks",
        "ttft_s": ttft if ttft is not None else float("nan"),
        "wall_s": wall,
    }
    if usage is not None:
        out["prompt_tokens"] = usage.prompt_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        if details is not None and getattr(details, "cached_tokens", None) is not None:
            out["cached_tokens"] = details.cached_tokens
    if timings:
        out["timings"] = {k: timings.get(k) for k in ("prompt_n", "cache_n", "prompt_ms")}
    return out


class Usage:
    """CPU seconds of a server and of the whole machine over a run."""

    def __init__(self, pid: int):
        self.pid, self.t0 = pid, time.perf_counter()
        self.cpu0, self.busy0 = cpu_seconds(pid), busy_cpu_seconds()

    def done(self) -> dict:
        wall = time.perf_counter() - self.t0
        cpu = cpu_seconds(self.pid) - self.cpu0
        others = busy_cpu_seconds() - self.busy0 - cpu
        return {"server_cpu_per_wall": cpu / wall, "others_cpu_per_wall": max(0.0, others) / wall}


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def throughput_run(spec: Spec, prompts: list[str], max_tokens: int) -> dict:
    """The prompts one at a time, then all at once."""
    use = Usage(spec.server.proc.pid)
    alone = [stream_chat(spec, user(p), max_tokens, True) for p in prompts]
    lone = use.done()
    use = Usage(spec.server.proc.pid)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: stream_chat(spec, user(p), max_tokens, True), prompts))
    wall = time.perf_counter() - t0
    conc = use.done()
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
    use = Usage(spec.server.proc.pid)
    a1 = stream_chat(spec, conv["A1"], answer_tokens, False)
    b = stream_chat(spec, conv["B"], 16, False)
    a2_msgs = [*conv["A1"], {"role": "assistant", "content": a1["text"]}, *conv["A2"]]
    a2 = stream_chat(spec, a2_msgs, 16, False)
    out = {"cpu": use.done(), "answer_tokens": a1["tokens"]}
    for name, r in (("A1", a1), ("B", b), ("A2", a2)):
        out[name] = {k: v for k, v in r.items() if k not in ("text", "tokens_from")}
    return out


# ---------------------------------------------------------------------------------------------
# the run


def build_specs(a, py: str, flags: set[str], llama: str | None) -> tuple[dict, list[str]]:
    """The servers of each test and the notes on what was left out."""
    ours = [
        py,
        "-m",
        "powerinfer_rs",
        "serve",
        "--model",
        a.model,
        "--threads",
        str(a.threads),
        "--ctx",
        str(a.ctx),
        "--max-queue",
        "256",
        "--log-level",
        "warning",
        *shlex.split(a.ours_args),
    ]
    lls = (
        [
            llama,
            "-m",
            a.model,
            "-t",
            str(a.threads),
            "-tb",
            str(a.threads),
            "-c",
            str(a.ctx),
            "--host",
            "127.0.0.1",
            *shlex.split(a.llama_args),
        ]
        if llama
        else []
    )
    has_par, has_cram = "--parallel" in flags, "--cache-ram" in flags
    n, cs = a.parallel, a.cache_slots
    notes: list[str] = []
    thr: list[Spec] = []
    cache: list[Spec] = []
    if a.only != "llama":
        if has_par:
            thr.append(
                Spec(f"ours_p{n}", f"ours --parallel {n}", "ours", [*ours, "--parallel", str(n)])
            )
            thr.append(Spec("ours_p1", "ours --parallel 1", "ours", [*ours, "--parallel", "1"]))
        else:
            notes.append(
                f"ours: `serve --help` lists no --parallel (issue 62 not in this tree): the "
                f"--parallel {n} row is skipped; ours runs as it is (one request at a time) in "
                f"the parallel-1 rows"
            )
            thr.append(Spec("ours_p1", "ours (no --parallel: 1 at a time)", "ours", list(ours)))
        slots = ["--parallel", str(cs)] if has_par else []
        cache.append(Spec("ours_cache_on", "ours, cache on (default)", "ours", [*ours, *slots]))
        if has_cram:
            cache.append(
                Spec(
                    "ours_cache_off",
                    "ours, --cache-ram 0",
                    "ours",
                    [*ours, *slots, "--cache-ram", "0"],
                )
            )
        else:
            notes.append("ours: `serve --help` lists no --cache-ram: no cache-off row for ours")
    if a.only != "ours":
        if lls:
            thr.append(
                Spec(f"llama_np{n}", f"llama-server -np {n}", "llama", [*lls, "-np", str(n)])
            )
            thr.append(Spec("llama_np1", "llama-server -np 1", "llama", [*lls, "-np", "1"]))
            cache.append(
                Spec(
                    "llama_cache_on",
                    "llama-server, cache on (default)",
                    "llama",
                    [*lls, "-np", str(cs)],
                )
            )
            cache.append(
                Spec(
                    "llama_cache_off",
                    "llama-server, --cache-ram 0",
                    "llama",
                    [*lls, "-np", str(cs), "--cache-ram", "0"],
                )
            )
        else:
            notes.append(
                "llama-server not found (pass --llama-server PATH or set $LLAMA_SERVER; build "
                "it outside the checkout as PEERS.md says): its rows are skipped"
            )
    return {"throughput": thr, "cache": cache}, notes


def alternate(specs: list[Spec], repeat: int) -> list[Spec]:
    return specs if repeat % 2 == 0 else specs[::-1]


def run_alternating(
    a, specs: list[Spec], logs: Path, one_run: Callable[[Spec, int], dict], line: Callable
) -> dict[str, dict]:
    """Start every server (and warm it up), run ``one_run(spec, repeat)`` ``a.repeats`` times
    per server in alternating order (printing ``line(spec, result)``), keep each server's
    /health before and after, and stop them all; per server: its label, command, health and
    runs."""
    runs: dict[str, list[dict]] = {s.key: [] for s in specs}
    try:
        for s in specs:
            start(s, logs)
            stream_chat(s, user("Hello!"), 4, False)  # warm-up
        for k in range(a.repeats):
            for s in alternate(specs, k):
                r = one_run(s, k)
                runs[s.key].append(r)
                print(f"  repeat {k} {line(s, r)}", file=sys.stderr, flush=True)
        for s in specs:
            s.health = {"at_start": s.health, "at_end": get_json(f"{s.url}/health")}
    finally:
        for s in specs:
            stop(s)
    return {
        s.key: {
            "label": s.label,
            "command": shlex.join(s.argv),
            "health": s.health,
            "runs": runs[s.key],
        }
        for s in specs
    }


def run_throughput(a, specs: list[Spec], logs: Path) -> dict:
    prompts = [STORY_PROMPTS[i % len(STORY_PROMPTS)] for i in range(a.streams)]

    def line(s: Spec, r: dict) -> str:
        return (
            f"{s.key:10s}: 1 stream {r['one_stream_tok_s']:.1f} tok/s, "
            f"{a.streams} streams {r['n_streams_tok_s']:.1f} tok/s, texts equal "
            f"{sum(r['texts_equal'])}/{a.streams}; other processes' CPU/wall "
            f"{r['alone_cpu']['others_cpu_per_wall']:.2f} / "
            f"{r['concurrent_cpu']['others_cpu_per_wall']:.2f}"
        )

    out = run_alternating(
        a, specs, logs, lambda s, k: throughput_run(s, prompts, a.max_tokens), line
    )
    for o in out.values():
        rs = o["runs"]
        o["one_stream_tok_s"] = median([r["one_stream_tok_s"] for r in rs])
        o["n_streams_tok_s"] = median([r["n_streams_tok_s"] for r in rs])
        o["texts_equal_all_runs"] = all(all(r["texts_equal"]) for r in rs)
    return out


def run_cache(a, specs: list[Spec], logs: Path) -> dict:
    def one(s: Spec, k: int) -> dict:
        return cache_run(s, f"{k + 1:04d}", a.system_tokens, a.answer_tokens)

    def line(s: Spec, r: dict) -> str:
        return (
            f"{s.key:15s}: TTFT A1 {r['A1']['ttft_s']:.3f} s, B {r['B']['ttft_s']:.3f} s, "
            f"A2 {r['A2']['ttft_s']:.3f} s (A2 prompt {r['A2'].get('prompt_tokens', '?')} "
            f"tokens); other processes' CPU/wall {r['cpu']['others_cpu_per_wall']:.2f}"
        )

    out = run_alternating(a, specs, logs, one, line)
    for o in out.values():
        rs = o["runs"]
        o.update({f"ttft_{n}_s": median([r[n]["ttft_s"] for r in rs]) for n in ("A1", "B", "A2")})
        o["prompt_tokens"] = {n: rs[0][n].get("prompt_tokens") for n in ("A1", "B", "A2")}
    for kind in ("ours", "llama"):
        on, off = out.get(f"{kind}_cache_on"), out.get(f"{kind}_cache_off")
        if on and off:
            on["a2_ttft_on_over_off"] = on["ttft_A2_s"] / off["ttft_A2_s"]
    return out


def print_report(rep: dict) -> None:
    a = rep["args"]
    print(
        f"\nmodel {Path(a['model']).name}, {a['threads']} threads, openai client, streamed chat, "
        f"temperature 0, {a['repeats']} repeat(s), medians; read bandwidth "
        f"{rep['bandwidth_gbs_before']:.1f} GB/s before, {rep['bandwidth_gbs_after']:.1f} after "
        f"({rep['bandwidth_how']}); load average {rep['load_before']:.1f} before, "
        f"{rep['load_after']:.1f} after, {rep['machine']['cpus']} CPUs"
    )
    for n in rep["notes"]:
        print(f"NOTE: {n}")
    thr = rep.get("throughput") or {}
    if thr:
        n = a["streams"]
        print(
            f"\nthroughput: max_tokens {a['max_tokens']}, ignore_eos; 1 stream = {n} prompts "
            f"one at a time, {n} streams = the same {n} at once\n"
        )
        print(
            f"| server | 1 stream tok/s | {n} streams aggregate tok/s | x | completion tokens "
            f"(1 / {n}) | server CPU/wall ({n}) | others' CPU/wall (1 / {n}) | {n}-stream texts == "
            "alone |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in thr.values():
            last = r["runs"][-1]
            cpu = median([x["concurrent_cpu"]["server_cpu_per_wall"] for x in r["runs"]])
            oth1 = median([x["alone_cpu"]["others_cpu_per_wall"] for x in r["runs"]])
            oth = median([x["concurrent_cpu"]["others_cpu_per_wall"] for x in r["runs"]])
            eq = sum(sum(x["texts_equal"]) for x in r["runs"])
            tot = sum(len(x["texts_equal"]) for x in r["runs"])
            print(
                f"| {r['label']} | {r['one_stream_tok_s']:.1f} | {r['n_streams_tok_s']:.1f} | "
                f"{r['n_streams_tok_s'] / r['one_stream_tok_s']:.2f} | "
                f"{sum(last['one_stream_tokens'])} / {sum(last['n_streams_tokens'])} | "
                f"{cpu:.2f} | {oth1:.2f} / {oth:.2f} | {eq}/{tot} |"
            )
    cache = rep.get("cache") or {}
    if cache:
        print(
            f"\nprefix cache: TTFT of A's first turn, B, A's second turn; system prompts ~"
            f"{a['system_tokens']} tokens, A's answer {a['answer_tokens']} tokens, "
            f"{a['cache_slots']} slot(s)\n"
        )
        print(
            "| server | TTFT A1 s | TTFT B s | TTFT A2 s | A2/A1 | prompt tokens A1/B/A2 | "
            "A2 reused (server's figure) |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in cache.values():
            p = r["prompt_tokens"]
            a2 = r["runs"][-1]["A2"]
            reused = a2.get("cached_tokens")
            if reused is None and a2.get("timings"):
                t = a2["timings"]
                reused = f"cache_n {t.get('cache_n')}, computed {t.get('prompt_n')}"
            print(
                f"| {r['label']} | {r['ttft_A1_s']:.3f} | {r['ttft_B_s']:.3f} | "
                f"{r['ttft_A2_s']:.3f} | {r['ttft_A2_s'] / r['ttft_A1_s']:.2f} | "
                f"{p['A1']}/{p['B']}/{p['A2']} | {reused if reused is not None else '-'} |"
            )
        for kind in ("ours", "llama"):
            on = cache.get(f"{kind}_cache_on", {})
            if "a2_ttft_on_over_off" in on:
                goal = " (goal <= 0.25)" if kind == "ours" else ""
                print(
                    f"{kind}: TTFT of A's second turn, cache on / off = "
                    f"{on['a2_ttft_on_over_off']:.2f}{goal}"
                )
    for part in ("throughput", "cache"):
        for key, r in (rep.get(part) or {}).items():
            h = r["health"].get("at_end", {})
            said = {k: h[k] for k in ("parallel", "slots", "prefix_cache") if k in h}
            if said:
                print(f"{part}/{key} /health: {said}")
    print("\ncommands:")
    for part in ("throughput", "cache"):
        for key, r in (rep.get(part) or {}).items():
            print(f"  {part}/{key}: {r['command']}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every server (2)")
    ap.add_argument("--ctx", type=int, default=8192, help="context of every server (8192)")
    ap.add_argument(
        "--llama-server",
        default=None,
        help="llama.cpp's llama-server binary (default: $LLAMA_SERVER, else the first "
        "/tmp/peers/**/bin/llama-server)",
    )
    ap.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="slots of the parallel rows: ours --parallel N, llama-server -np N (4)",
    )
    ap.add_argument("--streams", type=int, default=4, help="concurrent streams (4)")
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per stream (128; --quick: 32)"
    )
    ap.add_argument(
        "--repeats", type=int, default=None, help="alternating runs per server (3; --quick: 1)"
    )
    ap.add_argument(
        "--system-tokens",
        type=int,
        default=1500,
        help="approximate length of each system prompt of the cache test (1500)",
    )
    ap.add_argument(
        "--answer-tokens",
        type=int,
        default=None,
        help="length of A's first answer in the cache test (64; --quick: 32)",
    )
    ap.add_argument(
        "--cache-slots",
        type=int,
        default=1,
        help="slots of the cache-test servers (1; ours only if it has --parallel)",
    )
    ap.add_argument("--only", choices=["ours", "llama"], default=None, help="one side only")
    ap.add_argument("--skip", choices=["throughput", "cache"], default=None, help="skip a test")
    ap.add_argument("--ours-args", default="", help="more arguments of our serve (one string)")
    ap.add_argument("--llama-args", default="", help="more arguments of llama-server")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: by default 1 repeat, --max-tokens 32, --answer-tokens 32",
    )
    ap.add_argument("--json", default=None, help="write every figure and command to this file")
    add_bandwidth_args(ap)
    a = ap.parse_args(argv)
    quick = {"repeats": 1, "max_tokens": 32, "answer_tokens": 32}
    full = {"repeats": 3, "max_tokens": 128, "answer_tokens": 64}
    for k, v in (quick if a.quick else full).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.model = str(a.model or default_model())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that finally/atexit kill servers
    py = sys.executable
    flags = serve_flags(py)
    llama = find_llama_server(a.llama_server)
    specs, notes = build_specs(a, py, flags, llama)
    for n in notes:
        print(f"NOTE: {n}", file=sys.stderr)
    logs = Path(tempfile.mkdtemp(prefix="bench_parallel_"))
    print(f"server logs in {logs}", file=sys.stderr)
    bw0, how = measure_bandwidth(a.threads, a.bw_bytes, a.bw_iters)
    rep: dict = {
        "command": shlex.join([py, *sys.argv]),
        "args": vars(a),
        "llama_server": llama,
        "serve_has": {f: f in flags for f in ("--parallel", "--cache-ram")},
        "notes": notes,
        "machine": machine_info(),
        "load_before": os.getloadavg()[0],
        "bandwidth_gbs_before": bw0,
        "bandwidth_how": how,
        "logs": str(logs),
    }
    if a.skip != "throughput" and specs["throughput"]:
        rep["throughput"] = run_throughput(a, specs["throughput"], logs)
    if a.skip != "cache" and specs["cache"]:
        rep["cache"] = run_cache(a, specs["cache"], logs)
    rep["bandwidth_gbs_after"] = measure_bandwidth(a.threads, a.bw_bytes, a.bw_iters)[0]
    rep["load_after"] = os.getloadavg()[0]
    print_report(rep)
    write_json(a.json, rep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
