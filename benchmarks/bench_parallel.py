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

import itertools
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    bench_parser,
    default_model,
    machine_info,
    measure_bandwidth,
    median,
    race,
    write_json,
)
from _parallel_report import print_report  # noqa: E402
from _parallel_runs import cache_run, throughput_run  # noqa: E402
from _parallel_servers import (  # noqa: E402
    Spec,
    build_specs,  # noqa: E402
    find_llama_server,
    get_json,
    serve_flags,
    start,
    stop,
    stream_chat,
)
from _parallel_workloads import STORY_PROMPTS, user  # noqa: E402
from bench_server import cpu_seconds  # noqa: E402

# ---------------------------------------------------------------------------------------------
# the run


def run_alternating(
    a, specs: list[Spec], logs: Path, one_run: Callable[[Spec, int], dict], line: Callable
) -> dict[str, dict]:
    """Start every server (and warm it up), run ``one_run(spec, repeat)`` ``a.repeats`` times
    per server in alternating order (printing ``line(spec, result)``), keep each server's
    /health before and after, and stop them all; per server: its label, command, health and
    runs."""
    runs: dict = {}
    try:
        for s in specs:
            start(s, logs)
            stream_chat(s, user("Hello!"), 4, False)  # warm-up
        repeat = {s.key: itertools.count() for s in specs}
        by_key = {s.key: s for s in specs}
        runs = race(
            {s.key: (lambda s=s: one_run(s, next(repeat[s.key]))) for s in specs},
            a.repeats,
            own_cpu={s.key: (lambda s=s: cpu_seconds(s.server.proc.pid)) for s in specs},
            on_run=lambda key, k, run: print(
                f"  repeat {k} {line(by_key[key], run.value)}", file=sys.stderr, flush=True
            ),
        )
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
            "runs": [r.value for r in runs[s.key]],
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
