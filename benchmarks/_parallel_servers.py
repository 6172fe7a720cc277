"""bench_parallel.py's servers: what to start (Spec), starting and stopping them (every one
stopped at exit), their flags, finding llama-server, and one streamed chat request."""

from __future__ import annotations

import atexit
import glob
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _bench_common import (
    REPO,
)
from bench_server import Server, free_port


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
