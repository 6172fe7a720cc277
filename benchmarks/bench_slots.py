#!/usr/bin/env python3
"""Parallel slots and the prefix cache (issue 62): what batching and prefix reuse buy, in one
process, each pair of modes alternated (the order reversed every other repeat), medians of
--repeats.

* pass: one ``_core.decode_slots`` call over N sessions (one token each) against N one-token
  ``Session.feed`` calls, for N in --slots: the Rust batched pass alone.
* pool: N greedy streams of --max-tokens tokens (distinct short prompts, end-of-sequence
  ignored) run together in a ``SlotPool`` of N slots (one thread each) against the same
  prompts one after the other with ``Engine.generate``: aggregate tokens/s, prefill included
  (the prompts are a few tokens). The texts must agree (they are printed as agreeing or not).
* cache: the time to the first token of a question after a long system prompt (--system-rules
  rules, ~15 tokens each), asked in a slot that does not hold it, with the prefix cache (which
  holds an earlier question's prompt) against without (the whole prompt computed).

    python benchmarks/bench_slots.py                       # SmolLM2 Q4_1, 2 threads
    python benchmarks/bench_slots.py --slots 2,4 --max-tokens 32 --repeats 3 --json out/slots.json
"""

from __future__ import annotations

import threading
import time

from _bench_common import bench_parser, default_model, median, race, write_json


def alternate(repeats: int, a, b) -> tuple[float, float]:
    """Median seconds of ``a()`` and ``b()`` in the one race (alternated, the order reversed
    every other repeat)."""
    runs = race({"a": a, "b": b}, repeats)
    return median([r.wall_s for r in runs["a"]]), median([r.wall_s for r in runs["b"]])


def bench_pass(engine, n: int, repeats: int) -> dict:
    from powerinfer_rs import _core

    sessions = [engine.new_session() for _ in range(n)]
    for s in sessions:
        s.feed([1, 2, 3, 4])

    def batched():
        _core.decode_slots(sessions, [[5]] * n)
        for s in sessions:
            s.truncate(4)

    def one_by_one():
        for s in sessions:
            s.feed([5])
        for s in sessions:
            s.truncate(4)

    tb, t1 = alternate(repeats, batched, one_by_one)
    return {"slots": n, "decode_slots_s": tb, "feeds_s": t1, "speedup": t1 / tb}


def bench_pool(engine, n: int, max_tokens: int, repeats: int) -> dict:
    from powerinfer_rs.runtime.slots import SlotPool

    prompts = [[1, 2, 3, 40 + i] for i in range(n)]
    kw = dict(max_new_tokens=max_tokens, temperature=0, ignore_eos=True, speculative="off")
    texts: dict[str, list] = {}
    with SlotPool(engine, n, cache_bytes=0) as pool:

        def together():
            streams = [pool.stream(p, **kw) for p in prompts]
            out = [""] * n
            threads = [
                threading.Thread(target=lambda i=i: out.__setitem__(i, "".join(streams[i])))
                for i in range(n)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            texts["pool"] = out

        def sequential():
            engine.reset()
            texts["alone"] = [engine.generate(p, **kw) for p in prompts]

        tp, ts = alternate(repeats, together, sequential)
        rounds = pool.batcher.stats()
    toks = n * max_tokens
    return {
        "slots": n,
        "pool_tok_s": toks / tp,
        "sequential_tok_s": toks / ts,
        "speedup": ts / tp,
        "same_text": texts["pool"] == texts["alone"],
        "rows_per_round": rounds["rows"] / max(1, rounds["rounds"]),
    }


def bench_cache(engine, rules: int, repeats: int) -> dict:
    from powerinfer_rs.runtime.slots import SlotPool

    system = "You are a helpful assistant. " + " ".join(
        f"Rule {i}: answer briefly and politely about topic {i}." for i in range(rules)
    )

    def ask(q: str) -> str:
        return engine.format_chat(
            [{"role": "system", "content": system}, {"role": "user", "content": q}]
        )

    first, second = ask("What is rain?"), ask("What is bread?")
    kw = dict(max_new_tokens=1, temperature=0, speculative="off")
    reused = []

    def run(cache_bytes: int):
        with SlotPool(engine, 2, cache_bytes=cache_bytes) as pool:
            pool.generate(first, **kw)  # slot 0 (and the cache, when on)
            pool.generate([1, 2, 3, 4, 5], **kw)  # slot 1
            pool.generate([6, 7, 8, 9, 10], **kw)  # slot 0: no slot holds the system prompt
            t = time.perf_counter()
            pool.generate(second, **kw)
            dt = time.perf_counter() - t
            if cache_bytes:
                reused.append(max(s.last_stats.cached_tokens for s in pool.slots))
            return dt

    hit, miss = [], []
    for r in range(repeats):
        order = ((1 << 30, hit), (0, miss)) if r % 2 == 0 else ((0, miss), (1 << 30, hit))
        for cache_bytes, out in order:
            out.append(run(cache_bytes))
    n = len(engine.tokenizer.encode(second))
    return {
        "prompt_tokens": n,
        "cached_tokens": median(reused),
        "ttft_hit_s": median(hit),
        "ttft_miss_s": median(miss),
        "speedup": median(miss) / median(hit),
    }


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2 Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", default="2,4,8", help="slot counts (2,4,8)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--system-rules", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from powerinfer_rs import Engine

    engine = Engine.from_pretrained(a.model or default_model(), threads=a.threads)
    report: dict = {"pass": [], "pool": []}
    for n in [int(x) for x in a.slots.split(",")]:
        p = bench_pass(engine, n, a.repeats * 5)
        report["pass"].append(p)
        print(f"pass  N={n}: decode_slots {p['decode_slots_s'] * 1e3:.1f} ms, {n} feeds "
              f"{p['feeds_s'] * 1e3:.1f} ms: {p['speedup']:.2f}x")  # fmt: skip
        q = bench_pool(engine, n, a.max_tokens, a.repeats)
        report["pool"].append(q)
        print(f"pool  N={n}: {q['pool_tok_s']:.1f} tok/s together, {q['sequential_tok_s']:.1f} "
              f"one after the other: {q['speedup']:.2f}x ({q['rows_per_round']:.1f} rows/round, "
              f"same text: {q['same_text']})")  # fmt: skip
    c = bench_cache(engine, a.system_rules, a.repeats)
    report["cache"] = c
    print(f"cache: first token of a {c['prompt_tokens']}-token prompt {c['ttft_hit_s'] * 1e3:.0f} "
          f"ms with the cache ({c['cached_tokens']} tokens reused), {c['ttft_miss_s'] * 1e3:.0f} "
          f"ms without: {c['speedup']:.1f}x")  # fmt: skip
    write_json(a.json, report)


if __name__ == "__main__":
    main()
