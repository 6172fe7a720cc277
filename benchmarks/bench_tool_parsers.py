"""The cost per token of the server's output parsers (the reasoning splitter and the tool-call
stream of each family), against the time of a decode step, so their share of the chat decode
rate is known (issue 74 asks it stay within 2%).

usage: python benchmarks/bench_tool_parsers.py [--tokens 400] [--rounds 20] [--model M]
                                               [--no-decode]

Each family's answer is the transcript its real chat template produces for two calls
(tests/test_tool_formats.py: the assistant turn rendered from tests/chat_templates/), after
``--tokens`` tokens of text (reasoning for the thinking templates, content otherwise), fed in
pieces of 4 characters (about a token each) through what the server runs per piece: the
splitter (for a thinking template), then the family's :class:`ToolCallStream`, then its
``finish``. Prints microseconds per piece (the median of ``--rounds``) and, unless
``--no-decode``, SmolLM2's decode time per token at 2 threads and the parsers' share of it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

from test_tool_formats import CALLS, FAMILIES, TOOLS, template, transcript  # noqa: E402

from powerinfer_rs.runtime.reasoning import splitter_of, template_thinks  # noqa: E402
from powerinfer_rs.runtime.tools import ToolCallStream, tool_format  # noqa: E402

PIECE = 4  # characters per piece: about one token of English text
WORDS = "the weather in paris is mild today and the tool will say more about it ".split()


def long_answer(name: str, tokens: int) -> tuple[str, str]:
    """``(prompt, text)``: ``tokens`` pieces of reasoning or content, then the family's calls."""
    calls = CALLS if FAMILIES[name][1] else CALLS[:1]
    filler = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))[: tokens * PIECE]
    thinks = template_thinks(template(name))
    prompt, text = transcript(name, calls, filler if thinks else "")
    return prompt, text if filler in text else filler + "\n" + text


def run(tpl: str, prompt: str, pieces: list[str], n_calls: int) -> float:
    """Seconds to feed ``pieces`` through the server's parsers for template ``tpl`` (the
    family detected and the parsers made inside the timing, as each request does)."""
    t0 = time.perf_counter()
    think = splitter_of(tpl, prompt) if template_thinks(tpl) else None
    stream = ToolCallStream(TOOLS, tool_format(tpl))
    for p in pieces:
        _, c = think.push(p) if think else ("", p)
        if c:
            stream.push(c)
    if think:
        stream.push(think.finish()[1])
    _, calls = stream.finish()
    elapsed = time.perf_counter() - t0
    assert len(calls) == n_calls
    return elapsed


def decode_seconds(model: str | None) -> float:
    """SmolLM2's decode time per token (2 threads, 64 tokens, the median of 3)."""
    from powerinfer_rs import Engine

    eng = Engine.from_pretrained(model, threads=2)
    out = []
    for seed in range(3):
        eng.generate("The weather in Paris", max_new_tokens=64, ignore_eos=True, seed=seed)
        s = eng.last_stats
        out.append(s.decode_seconds / max(1, s.decode_tokens))
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode measurement")
    a = ap.parse_args(argv)
    step = None if a.no_decode else decode_seconds(a.model)
    if step is not None:
        print(f"decode step (SmolLM2, 2 threads): {step * 1e6:.0f} us/token")
    print(f"{'family':<16}{'pieces':>8}{'us/piece':>10}" + ("  share of a step" if step else ""))
    for name in FAMILIES:
        prompt, text = long_answer(name, a.tokens)
        pieces = [text[i : i + PIECE] for i in range(0, len(text), PIECE)]
        tpl, n_calls = template(name), 2 if FAMILIES[name][1] else 1
        times = [run(tpl, prompt, pieces, n_calls) for _ in range(a.rounds)]
        per = statistics.median(times) / len(pieces)
        share = f"  {100 * per / step:.3f}%" if step else ""
        print(f"{name:<16}{len(pieces):>8}{per * 1e6:>10.2f}{share}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
