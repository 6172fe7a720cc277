#!/usr/bin/env python3
"""The chat decode rate through the server's streaming path with the output parsers on
against off: issue 74's "the chat decode rate with the parsers on stays within 2% of today's".

usage: python benchmarks/bench_chat_parsers.py [--rounds 6] [--max-tokens 128] [--model M]
                                               [--threads 2] [--json OUT]

One ``powerinfer-rs serve`` subprocess (a free 127.0.0.1 port) and two streamed chat requests,
run in alternating rounds (on, off, off, on, ...):

- **on**: the conversation with ``tools`` (tool_choice auto), so every piece of the answer goes
  through the tool-call stream of the template's family (and its ``finish``);
- **off**: the same prompt text with no ``tools``: the messages the server renders for the
  first (:func:`~powerinfer_rs.runtime.tools.prompt_messages`: the fallback system prompt
  naming the tools, for a template that renders none), so both decode the same prompt.

Both ask for ``--max-tokens`` tokens with ``ignore_eos`` at temperature 0 (the same greedy
tokens; checked). Per request: the decode rate as the client sees it, ``max_tokens / (wall -
prompt time)`` (wall: request sent to the stream's last byte; prompt time: the server's
``timings.prompt_ms``, as the prefix cache leaves it), and the server's own
``timings.predicted_per_second``, and the server process's CPU milliseconds per token (what
the parsers add shows there even when other work on the machine moves the rates). Prints the
median of each arm, on/off, and the median of each round's own on/off (a round's two runs are
next to each other in time, so the machine's drift cancels better). The reasoning splitter's
cost per piece is in bench_tool_parsers.py (SmolLM2's template does not think).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _bench_common import REPO, alternation, bench_parser, default_model, machine_info, write_json
from bench_server import Server, cpu_seconds, free_port

sys.path.insert(0, str(REPO / "python"))

from powerinfer_rs.runtime.tools import prompt_messages  # noqa: E402

ASK = [{"role": "user", "content": "What is the weather like in Paris and in Rome? Tell me "
        "what to wear there this week, with reasons."}]  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city today.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip


def chat_template(model: str) -> str | None:
    """The GGUF's ``tokenizer.chat_template`` (None: none)."""
    import gguf

    field = gguf.GGUFReader(model).fields.get("tokenizer.chat_template")
    return bytes(field.parts[-1]).decode() if field is not None else None


def bodies(template: str | None, max_tokens: int) -> dict[str, dict]:
    """The two requests: ``on`` with tools, ``off`` with the messages ``on`` renders to."""
    common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    rendered, extra = prompt_messages(ASK, TOOLS, template)
    if extra:  # the template renders the tools itself: the off arm's prompt is shorter
        print("note: the template renders tools itself; the off arm's prompt differs",
              file=sys.stderr)  # fmt: skip
    return {"on": {**common, "messages": ASK, "tools": TOOLS},
            "off": {**common, "messages": rendered}}  # fmt: skip


def stream_once(url: str, body: dict, pid: int) -> dict:
    """One streamed chat completion: the client's decode rate, the server's, the server
    process's CPU seconds (server ``pid``), and the text."""
    text, calls, usage, timings = [], [], {}, {}
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for ch in chunk.get("choices") or []:
                text.append(ch["delta"].get("content") or "")
                calls += ch["delta"].get("tool_calls") or []
                timings = ch.get("timings") or chunk.get("timings") or timings
            timings = chunk.get("timings") or timings
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(pid) - cpu0
    n = usage.get("completion_tokens", 0)
    decode_s = wall - timings.get("prompt_ms", 0.0) / 1000.0
    return {"tokens": n, "prompt_tokens": usage.get("prompt_tokens"), "wall_s": wall,
            "client_tok_s": n / decode_s if decode_s > 0 else 0.0,
            "server_tok_s": timings.get("predicted_per_second", 0.0),
            "server_cpu_ms_per_tok": 1000.0 * cpu / n if n else 0.0,
            "text": "".join(text), "calls": len(calls)}  # fmt: skip


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2 Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    model = str(a.model or default_model())
    reqs = bodies(chat_template(model), a.max_tokens)
    port = free_port()
    argv = [sys.executable, "-m", "powerinfer_rs", "serve", "--model", model, "--threads",
            str(a.threads), "--port", str(port), "--log-level", "warning"]  # fmt: skip
    log = Path(tempfile.mkdtemp(prefix="bench_chat_parsers_")) / "serve.log"
    server = Server("ours", argv, port, log)
    report: dict = {"model": model, "threads": a.threads, "max_tokens": a.max_tokens,
                    "rounds": a.rounds, "machine": machine_info(),
                    "load_average_before": os.getloadavg()[0],
                    "runs": {"on": [], "off": []}}  # fmt: skip
    try:
        for name in ("on", "off"):
            stream_once(server.url, reqs[name], server.proc.pid)  # warm-up (and the prefix cache)
        for r in range(a.rounds):
            for name in alternation(["on", "off"], r):
                run = stream_once(server.url, reqs[name], server.proc.pid)
                report["runs"][name].append(run)
                print(f"  round {r} {name:3s}: client {run['client_tok_s']:.2f} tok/s, server "
                      f"{run['server_tok_s']:.2f} tok/s", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        server.stop()
    report["load_average_after"] = os.getloadavg()[0]
    summarize(report)
    write_json(a.json, report)
    return 0


def summarize(report: dict) -> None:
    """The medians per arm and on/off (client and server rates); the two arms' answers must
    be the same tokens."""
    on, off = report["runs"]["on"], report["runs"]["off"]
    same = {r["text"] for r in on if not r["calls"]} | {r["text"] for r in off}
    if len({r["tokens"] for r in on + off}) != 1 or (not on[0]["calls"] and len(same) != 1):
        print("warning: the two arms did not decode the same answer", file=sys.stderr)
    out = {}
    for key in ("client_tok_s", "server_tok_s", "server_cpu_ms_per_tok"):
        m_on = statistics.median(r[key] for r in on)
        m_off = statistics.median(r[key] for r in off)
        paired = statistics.median(a[key] / b[key] for a, b in zip(on, off) if b[key])
        out[key] = {"on": m_on, "off": m_off, "ratio": m_on / m_off if m_off else 0.0,
                    "paired_ratio": paired}  # fmt: skip
    report["summary"] = out
    print(f"prompt tokens on/off: {on[0]['prompt_tokens']}/{off[0]['prompt_tokens']}; "
          f"{on[0]['tokens']} tokens per answer; "
          f"tool calls in the on answer: {on[0]['calls']}")  # fmt: skip
    for key, v in out.items():
        print(f"{key}: parsers on {v['on']:.2f}, off {v['off']:.2f}, on/off {v['ratio']:.4f} "
              f"(median of the rounds' own on/off: {v['paired_ratio']:.4f})")


if __name__ == "__main__":
    raise SystemExit(main())
