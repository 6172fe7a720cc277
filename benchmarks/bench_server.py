#!/usr/bin/env python3
"""Time to first token and tokens/s of our OpenAI-compatible server against llama-cpp-python's
own (``python -m llama_cpp.server``), on the same GGUF and thread count, at 1, 4 and 16
concurrent clients, in one run.

Both servers run as subprocesses on free 127.0.0.1 ports. Each client sends --requests streamed
chat completions one after the other (its own prompt, temperature 0, --max-tokens), reading the
server-sent events with httpx. Per level and server: TTFT (request sent -> first content chunk;
median and worst), per-request decode tokens/s ((chunks - 1) / (last chunk - first chunk)), and
the aggregate (all content chunks / wall time of the level). A content chunk is one token in
both servers. The levels alternate which server goes first (this machine is noisy); both get a
warm-up request. llama_cpp.server runs with interrupt_requests off (by default a new request
cuts the running stream short). Needs: the server extra, httpx, llama-cpp-python[server]
(sse-starlette, starlette-context, pydantic-settings, fastapi).

    python benchmarks/bench_server.py                               # SmolLM2, 2 threads
    python benchmarks/bench_server.py --levels 1,4 --max-tokens 16 --json out/server.json
    python benchmarks/bench_server.py --only ours
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from _bench_common import (
    REPO,
    alternation,
    bench_parser,
    default_model,
    machine_info,
    race,
    write_json,
)

TOPICS = ["a lighthouse", "a lost key", "the moon", "a bakery", "a storm", "a robot", "a river",
          "a old map", "a garden", "a train", "a violin", "a fox", "a snowy town", "a ship",
          "a clock", "a library"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess (its log in ``log``), up once ``ready_path`` answers 200."""

    def __init__(
        self, name: str, argv: list[str], port: int, log: Path, ready_path: str = "/v1/models"
    ):
        self.name, self.url, self.log = name, f"http://127.0.0.1:{port}", log
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'python'}:{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(
            argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} server exited: see {log}\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}{ready_path}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{name} server did not start in 180 s: see {log}")
            time.sleep(0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stream_once(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed chat completion: TTFT, content chunks, decode time."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    times: list[float] = []
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                times.append(time.perf_counter())
    if not times:
        return {"ttft": float("nan"), "tokens": 0, "decode_s": 0.0}
    return {"ttft": times[0] - t0, "tokens": len(times), "decode_s": times[-1] - times[0]}


def run_level(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    def client(c: int) -> list[dict]:
        return [
            stream_once(url, f"Tell a story about {TOPICS[(c + k) % len(TOPICS)]}.", max_tokens)
            for k in range(requests)
        ]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(client, range(clients)) for r in rs]
    wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    rates = [(r["tokens"] - 1) / r["decode_s"] for r in results if r["decode_s"] > 0]
    tokens = sum(r["tokens"] for r in results)
    return {
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "ttft_median_s": statistics.median(ttfts),
        "ttft_max_s": ttfts[-1],
        "decode_tok_s": statistics.median(rates) if rates else 0.0,
        "aggregate_tok_s": tokens / wall,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2 Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,4,16", help="concurrent clients per level")
    ap.add_argument("--requests", type=int, default=2, help="requests per client (2)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--only", choices=["ours", "llama"], default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    model = str(a.model or default_model())
    levels = [int(x) for x in a.levels.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="bench_server_"))
    py = sys.executable
    argv = {
        "ours": [py, "-m", "powerinfer_rs", "serve", "--model", model, "--threads",
                 str(a.threads), "--n-ctx", str(a.n_ctx), "--max-queue", "256",
                 "--log-level", "warning"],
        "llama": [py, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(a.threads),
                  "--n_threads_batch", str(a.threads), "--n_ctx", str(a.n_ctx),
                  "--interrupt_requests", "False", "--verbose", "False"],
    }  # fmt: skip
    names = [a.only] if a.only else ["ours", "llama"]
    servers: dict[str, Server] = {}
    report: dict = {
        "model": model,
        "threads": a.threads,
        "max_tokens": a.max_tokens,
        "requests_per_client": a.requests,
        "machine": machine_info(),
        "load_average_before": os.getloadavg()[0],
        "levels": {},
    }
    try:
        for name in names:
            port = free_port()
            extra = ["--port", str(port)] + (["--host", "127.0.0.1"] if name == "llama" else [])
            servers[name] = Server(name, argv[name] + extra, port, logs / f"{name}.log")
            stream_once(servers[name].url, "Hello!", 4)  # warm-up
        for i, clients in enumerate(levels):  # one round of the race per level
            runs = race(
                {
                    n: (
                        lambda n=n, c=clients: run_level(
                            servers[n].url, c, a.requests, a.max_tokens
                        )
                    )
                    for n in alternation(names, i)
                },
                1,
                own_cpu={n: (lambda n=n: cpu_seconds(servers[n].proc.pid)) for n in names},
            )
            for name, (run,) in runs.items():
                r = {**run.value, "server_cpu_per_wall": run.cpu_util}
                r["others_cpu_per_wall"] = run.others_util
                report["levels"].setdefault(str(clients), {})[name] = r
                print(f"  {name:5s} clients={clients:2d}: {r}", file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.stop()
    report["load_average_after"] = os.getloadavg()[0]
    print_table(report, names)
    write_json(a.json, report)
    return 0


def print_table(report: dict, names: list[str]) -> None:
    print(f"\nmodel {Path(report['model']).name}, {report['threads']} threads, "
          f"{report['requests_per_client']} streamed chat requests per client, "
          f"max_tokens {report['max_tokens']}, temperature 0; 1-min load average "
          f"{report['load_average_before']:.1f} before, {report['load_average_after']:.1f} "
          f"after on {report['machine']['cpus']} CPUs\n")  # fmt: skip
    print("| clients | server | TTFT median s | TTFT max s | decode tok/s per request | "
          "aggregate tok/s | server CPU/wall |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for clients, by_name in report["levels"].items():
        for name in names:
            r = by_name[name]
            label = "powerinfer-rs" if name == "ours" else "llama_cpp.server"
            print(f"| {clients} | {label} | {r['ttft_median_s']:.3f} | {r['ttft_max_s']:.3f} | "
                  f"{r['decode_tok_s']:.1f} | {r['aggregate_tok_s']:.1f} | "
                  f"{r['server_cpu_per_wall']:.2f} |")  # fmt: skip
    if len(names) == 2:
        print()
        for clients, by_name in report["levels"].items():
            o, ll = by_name["ours"], by_name["llama"]
            print(f"clients {clients}: aggregate tok/s ours/llama = "
                  f"{o['aggregate_tok_s'] / ll['aggregate_tok_s']:.2f}, TTFT median ours/llama = "
                  f"{o['ttft_median_s'] / ll['ttft_median_s']:.2f}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
