"""Soak: resident memory across many calls on one engine and many engine lifetimes.

Phase 1 ("calls"): one Engine on the model runs ``--calls`` calls, cycling through greedy and
sampled ``generate``, ``stream`` (read fully, and closed after two pieces), ``chat``, ``logits``,
``perplexity``, a sparsity switch (threshold, dense) and calls that raise a typed error (a token
id out of range, a prompt longer than the context). Phase 2 ("engines"): ``--engines`` cycles of
``Engine.from_pretrained`` + a short generate + drop (and a ``gc.collect()``).

Resident memory (VmRSS from /proc/self/status) is sampled after each tenth of a phase, after a
``gc.collect()``. The growth that matters is from the end of the warm-up (the first tenth: lazy
imports, allocator pools, rayon's threads) to the end; the script prints each sample, the
growth in MiB and per call, and exits 1 when the growth passes ``--max-growth-mib``.

    python benchmarks/soak.py [--model M] [--calls 1000] [--engines 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

from _bench_common import default_model, import_powerinfer

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "Once upon a time",
]


def rss_mib() -> float:
    """This process's resident memory (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def one_call(engine, i: int, errors) -> None:
    """The ``i``-th call of phase 1 (a mix of every entry point)."""
    prompt = PROMPTS[i % len(PROMPTS)]
    kind = i % 10
    if kind in (0, 1):
        engine.generate(prompt, max_new_tokens=8, temperature=0 if kind == 0 else 0.8, seed=i)
    elif kind == 2:
        "".join(engine.stream(prompt, max_new_tokens=8, seed=i))
    elif kind == 3:
        gen = engine.stream(prompt, max_new_tokens=8, seed=i)
        next(gen, None)
        next(gen, None)
        gen.close()  # a client that stops reading
    elif kind == 4:
        engine.chat([{"role": "user", "content": prompt}], max_new_tokens=8, seed=i)
    elif kind == 5:
        engine.logits(engine.tokenizer.encode(prompt))
    elif kind == 6:
        engine.perplexity(" ".join(PROMPTS) * 2)
    elif kind == 7:
        engine.set_sparsity("threshold", thresholds=[0.05] * engine.config.n_layers)
        engine.generate(prompt, max_new_tokens=4, temperature=0)
        engine.set_sparsity("dense")
    elif kind == 8:
        try:
            engine.logits([engine.config.vocab_size + 5])
        except errors.PowerInferError:
            pass
        else:
            raise AssertionError("a token id out of range was accepted")
    else:
        try:
            engine.generate("x " * (2 * engine.n_ctx), max_new_tokens=1)
        except errors.PowerInferError:
            pass
        else:
            raise AssertionError("a prompt longer than the context was accepted")


def phase(name: str, n: int, step, samples: list) -> None:
    """Run ``step(i)`` for ``i < n``, sampling RSS after each tenth (after gc)."""
    tenth = max(1, n // 10)
    t0 = time.perf_counter()
    for i in range(n):
        step(i)
        if (i + 1) % tenth == 0 or i + 1 == n:
            gc.collect()
            mib = rss_mib()
            samples.append({"phase": name, "done": i + 1, "rss_mib": mib})
            took = time.perf_counter() - t0
            print(f"{name:>8} {i + 1:>6}/{n}  rss {mib:8.1f} MiB  {took:7.1f} s")


def growth(samples: list, name: str, n: int) -> dict:
    """RSS growth of a phase from the end of its warm-up (first sample) to its end."""
    mine = [s for s in samples if s["phase"] == name]
    start, end = mine[0], mine[-1]
    mib = end["rss_mib"] - start["rss_mib"]
    per = (n - start["done"]) or 1
    return {
        "phase": name,
        "rss_after_warmup_mib": start["rss_mib"],
        "rss_end_mib": end["rss_mib"],
        "growth_mib": mib,
        "growth_kib_per_step": mib * 1024 / per,
        "peak_mib": max(s["rss_mib"] for s in mine),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF or HF dir (default: SmolLM2)")
    ap.add_argument("--calls", type=int, default=1000, help="calls on one engine (1000)")
    ap.add_argument("--engines", type=int, default=100, help="engine lifetimes (100)")
    ap.add_argument("--threads", type=int, default=0, help="engine threads (0 = all cores)")
    ap.add_argument("--n-ctx", type=int, default=256, help="context of each engine (256)")
    ap.add_argument(
        "--max-growth-mib", type=float, default=16.0, help="fail above this growth (16)"
    )
    ap.add_argument("--json", help="write the samples and the growth to this file")
    a = ap.parse_args(argv)
    if a.calls < 10 or a.engines < 10:
        ap.error("--calls and --engines must be >= 10")
    pi, why = import_powerinfer()
    if pi is None:
        print(f"powerinfer_rs not importable: {why}", file=sys.stderr)
        return 2
    from powerinfer_rs import Engine, errors

    model = str(a.model or default_model())
    print(f"model {model}; start rss {rss_mib():.1f} MiB")
    samples: list = []
    engines = [Engine.from_pretrained(model, threads=a.threads, n_ctx=a.n_ctx)]
    phase("calls", a.calls, lambda i: one_call(engines[0], i, errors), samples)
    engines.clear()

    def lifetime(i: int) -> None:
        eng = Engine.from_pretrained(model, threads=a.threads, n_ctx=a.n_ctx)
        eng.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=2, temperature=0)

    phase("engines", a.engines, lifetime, samples)
    result = {
        "model": model,
        "calls": a.calls,
        "engines": a.engines,
        "growth": [growth(samples, "calls", a.calls), growth(samples, "engines", a.engines)],
        "samples": samples,
    }
    for g in result["growth"]:
        print(
            f"{g['phase']:>8}: {g['rss_after_warmup_mib']:.1f} -> {g['rss_end_mib']:.1f} MiB "
            f"after warm-up ({g['growth_mib']:+.2f} MiB, {g['growth_kib_per_step']:+.2f} KiB "
            f"per step; peak {g['peak_mib']:.1f} MiB)"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = [g for g in result["growth"] if g["growth_mib"] > a.max_growth_mib]
    for g in bad:
        print(f"FAIL: {g['phase']} grew {g['growth_mib']:.1f} MiB", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
