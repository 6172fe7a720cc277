"""The cost of constrained decoding per token: decode time per token with a JSON schema against
the same engine without one, in alternating runs (the ratio is what counts; the machine's load
moves both).

usage: python benchmarks/bench_constrained.py [--model M] [--rounds 8] [--tokens 64] [--threads N]

The constrained run asks for a JSON array of up to 64 small objects (so it runs its whole
token budget); the free run generates as many tokens with ``ignore_eos``. Prints the mean
seconds per decoded token of each and the overhead of the constrained one.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from powerinfer_rs import Engine  # noqa: E402
from powerinfer_rs.benchmarking import race  # noqa: E402

SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "maxItems": 64,
}
ASK = [{"role": "user", "content": "List people as JSON: name, age and tags."}]


def per_token(engine: Engine, tokens: int, seed: int, constrained: bool) -> float:
    kw = dict(max_new_tokens=tokens, temperature=0.7, seed=seed)
    if constrained:
        engine.chat(ASK, json_schema=SCHEMA, **kw)
    else:
        engine.chat(ASK, ignore_eos=True, **kw)
    s = engine.last_stats
    return s.decode_seconds / max(1, s.decode_tokens)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    engine = Engine.from_pretrained(a.model, threads=a.threads)
    per_token(engine, 8, 0, True)  # build the grammar engine's tokenizer once
    seeds = {"free": itertools.count(), "constrained": itertools.count()}
    runs = race(
        {
            "free": lambda: per_token(engine, a.tokens, next(seeds["free"]), False),
            "constrained": lambda: per_token(engine, a.tokens, next(seeds["constrained"]), True),
        },
        a.rounds,
    )
    free, held = ([r.value for r in runs[k]] for k in ("free", "constrained"))
    f, h = statistics.mean(free), statistics.mean(held)
    print(f"free        {f * 1e3:.2f} ms/token (mean of {a.rounds})")
    print(f"constrained {h * 1e3:.2f} ms/token")
    print(f"overhead    {100 * (h / f - 1):+.1f}% per token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
