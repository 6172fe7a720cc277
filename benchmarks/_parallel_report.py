"""bench_parallel.py's report: the throughput and prefix-cache tables."""

from __future__ import annotations

import sys
from pathlib import Path

from _bench_common import (
    median,
)


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
