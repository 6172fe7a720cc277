#!/usr/bin/env python3
"""Decode speed at a long context with the KV cache at f16 and in ggml's blocks (q8_0, q4_0,
q4_1), alternating in one process: one session per type over the same weights, each filled
with the same --ctx tokens once, then rounds that time --tokens one-token decode steps on every
session in turn (each round drops its own tokens again), so a type's figure is never from
another moment of the machine than the others'. Prints tok/s per type and each type's ratio to
f16 (median of the rounds); the KV bytes each type keeps per position beside it.

Examples::

    python benchmarks/bench_kv_quant.py                       # SmolLM2, ctx 4096, 3 rounds
    python benchmarks/bench_kv_quant.py --ctx 1024 --tokens 16 --types f16,q8_0 --json out.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as bench  # noqa: E402


def fill(session, ids: list[int], chunk: int = 512) -> None:
    """The context filled with ``ids`` in passes of ``chunk`` tokens."""
    for at in range(0, len(ids), chunk):
        session.feed(ids[at : at + chunk])


def run(args) -> dict:
    pi = bench.require_powerinfer()
    path = args.model or bench.default_model()
    eng = pi.Engine.from_pretrained(str(path), threads=args.threads, n_ctx=args.ctx + args.tokens)
    vocab = eng.config.vocab_size
    rng = np.random.default_rng(0)
    ids = [int(t) for t in rng.integers(3, vocab, args.ctx)]
    steps = [int(t) for t in rng.integers(3, vocab, args.tokens)]
    sessions = {}
    for kv in args.types:
        s = eng.new_session()
        s.set_kv_cache(kv)
        t0 = time.perf_counter()
        fill(s, ids)
        print(f"{kv}: {args.ctx} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
        sessions[kv] = s
    times: dict[str, list[float]] = {kv: [] for kv in args.types}
    for r in range(args.warmup + args.rounds):
        for kv, s in sessions.items():
            t0 = time.perf_counter()
            for t in steps:
                s.decode([t])
            dt = time.perf_counter() - t0
            s.truncate(args.ctx)
            if r >= args.warmup:
                times[kv].append(dt)
    rates = {kv: args.tokens / statistics.median(ts) for kv, ts in times.items()}
    base = rates.get("f16")
    rows = [
        {
            "kv_cache": kv,
            "tok_s": round(rates[kv], 2),
            "ratio_to_f16": round(rates[kv] / base, 3) if base else None,
            "kv_bytes_per_position": sessions[kv].kv_snapshot_bytes_per_position,
            "rounds_s": [round(t, 4) for t in times[kv]],
        }
        for kv in args.types
    ]
    return {
        "model": str(path),
        "ctx": args.ctx,
        "tokens": args.tokens,
        "threads": eng.ctx.session.threads,
        "machine": bench.machine_info(),
        "rows": rows,
    }


def main(argv=None) -> int:
    ap = bench.bench_parser(__doc__)
    ap.add_argument("--model", default=None, help="GGUF (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--ctx", type=int, default=4096, help="tokens in the context (4096)")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps timed per round (32)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first (1)")
    ap.add_argument("--threads", type=int, default=0, help="threads (0: one per core)")
    ap.add_argument("--types", default="f16,q8_0,q4_0", help="KV types, comma-separated")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    args.types = [t.strip() for t in args.types.split(",") if t.strip()]
    rep = run(args)
    print(f"decode at ctx {rep['ctx']}, {rep['tokens']} steps a round, {rep['threads']} threads")
    print("| kv_cache | tok/s | vs f16 | KV bytes/position |")
    print("|---|---|---|---|")
    for r in rep["rows"]:
        cells = (r["kv_cache"], r["tok_s"], r["ratio_to_f16"], r["kv_bytes_per_position"])
        print("| " + " | ".join(str(c) for c in cells) + " |")
    bench.write_json(args.json, rep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
