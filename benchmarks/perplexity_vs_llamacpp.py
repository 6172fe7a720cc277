#!/usr/bin/env python3
"""Perplexity of powerinfer-rs against llama.cpp (llama-cpp-python) on the same GGUF and the
same held-out text, scored on exactly the same token ids.

The text (benchmarks/corpus.py: prose of the Debian python3.11-doc package, or --text-file) is
tokenized once with llama.cpp's tokenizer (no BOS, no special-token parsing); our tokenizer must
give the same ids (the first mismatch is printed if not). The ids are cut into non-overlapping
windows of --ctx tokens, each evaluated in a fresh context; every token after the first in a
window is scored (NLL of token t+1 from the logits at t), identically for both engines.

Prints both perplexities and their relative difference |ours - llama| / llama, plus per-window
agreement figures; exits 1 if the difference exceeds --max-rel-diff (default 1%), 3 if the
tokenizers disagree (unless --allow-token-mismatch), 2 on setup errors.

Examples::

    python benchmarks/perplexity_vs_llamacpp.py                 # SmolLM2, 2560 tokens, ctx 512
    python benchmarks/perplexity_vs_llamacpp.py --min-tokens 8192 --threads 2 --json /tmp/ppl.json
    python benchmarks/perplexity_vs_llamacpp.py --only llama    # llama.cpp side alone
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as bench  # noqa: E402
from corpus import SOURCE_NAME, CorpusError, held_out_text  # noqa: E402


def window_nll(logits: np.ndarray, window: list[int]) -> np.ndarray:
    """NLL (float64) of window[1:] given the logits at window[:-1]."""
    x = np.asarray(logits[: len(window) - 1], dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    tgt = np.asarray(window[1:])
    return logz - x[np.arange(len(tgt)), tgt]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


class LlamaSide:
    name = "llama.cpp"

    def __init__(self, model: Path, ctx: int, threads: int):
        self.llm = bench.open_llama(model, ctx, threads, n_batch=ctx, n_ubatch=ctx, logits_all=True)

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def detok(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")

    def logits(self, window: list[int]) -> np.ndarray:
        self.llm.reset()  # n_tokens = 0; eval() then drops the KV cells from position 0 on
        self.llm.eval(window)
        return np.array(self.llm.scores[: len(window)], dtype=np.float32)


class OurSide:
    name = "powerinfer-rs"

    def __init__(self, model: Path, ctx: int, threads: int):
        pi = bench.require_powerinfer()
        try:
            self.eng = pi.Engine.from_pretrained(str(model), threads=threads, n_ctx=ctx)
        except TypeError:
            self.eng = pi.Engine.from_pretrained(str(model), threads=threads)

    def tokenize(self, text: str) -> list[int]:
        return list(self.eng.tokenizer.encode(text, add_bos=False))

    def detok(self, ids: list[int]) -> str:
        return self.eng.tokenizer.decode(ids)

    def logits(self, window: list[int]) -> np.ndarray:
        out = np.asarray(self.eng.logits(window), dtype=np.float32)
        if out.shape[0] != len(window):
            raise RuntimeError(f"engine.logits returned shape {out.shape} for {len(window)} ids")
        return out


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first id where ``a`` and ``b`` differ (the shorter length when one is a
    prefix of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class SetupError(Exception):
    """A setup failure (model, text, engine): printed as ``error: ...``, exit status 2."""


def build_parser():
    """The command line."""
    ap = bench.bench_parser(__doc__)
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--ctx", type=int, default=512, help="window length in tokens (default 512)")
    ap.add_argument(
        "--min-tokens",
        type=int,
        default=2560,
        help="score at least this many tokens, rounded up to whole windows "
        "(default 2560 = 5 windows of 512)",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument("--text-file", help="score this UTF-8 file instead of the held-out corpus")
    ap.add_argument(
        "--max-rel-diff",
        type=float,
        default=0.01,
        help="fail if |ppl_ours - ppl_llama| / ppl_llama exceeds this (default 0.01)",
    )
    ap.add_argument(
        "--allow-token-mismatch",
        action="store_true",
        help="do not fail when our tokenizer's ids differ from llama.cpp's",
    )
    ap.add_argument("--only", choices=["ours", "llama"], help="run one engine only")
    ap.add_argument("--json", help="also write the results to this JSON file")
    return ap


def load_sides(model: Path, args) -> dict:
    """The engines to score with, keyed "llama" and "ours" (as --only allows), loaded."""
    sides: dict[str, object] = {}
    for key, cls in (("llama", LlamaSide), ("ours", OurSide)):
        if args.only not in (None, key):
            continue
        try:
            t0 = time.perf_counter()
            sides[key] = cls(model, args.ctx, args.threads)
            print(f"loaded {cls.name} in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        except Exception as e:
            raise SetupError(f"cannot load {cls.name}: {e}") from e
    return sides


def text_and_ids(tok_side, args, need: int) -> tuple[str, str, list[int]]:
    """(text, its source, its ids from ``tok_side``): --text-file, or held-out prose grown
    until it tokenizes to ``need`` ids at least."""
    if args.text_file:
        text = Path(args.text_file).read_text(encoding="utf-8")
        source = args.text_file
        ids = tok_side.tokenize(text)
    else:
        source = SOURCE_NAME
        chars = need * 6
        while True:
            try:
                text = held_out_text(chars)
            except CorpusError as e:
                raise SetupError(str(e)) from e
            ids = tok_side.tokenize(text)
            if len(ids) >= need:
                break
            chars = int(chars * need / max(len(ids), 1) * 1.2) + 1000
    if len(ids) < need:
        raise SetupError(f"the text has {len(ids)} tokens, {need} needed")
    return text, source, ids


def tokenizer_mismatch(sides: dict, text: str, ids: list[int]) -> dict | None:
    """Where our tokenizer's ids of ``text`` first differ from llama.cpp's ``ids`` (the whole
    text, not only the scored part), printed; None when they agree or one engine runs."""
    if "llama" not in sides or "ours" not in sides:
        return None
    ours_ids = sides["ours"].tokenize(text)
    i = first_mismatch(ids, ours_ids)
    if i is None:
        print(f"tokenizers agree on all {len(ids)} ids", file=sys.stderr)
        return None
    lo = max(0, i - 5)
    token_mismatch = {
        "index": i,
        "llama_len": len(ids),
        "ours_len": len(ours_ids),
        "llama_ids": ids[lo : i + 5],
        "ours_ids": ours_ids[lo : i + 5],
        "llama_text": sides["llama"].detok(ids[lo : i + 5]),
        "ours_text": sides["ours"].detok(ours_ids[lo : i + 5]),
    }
    print("TOKENIZER MISMATCH at id index", i, file=sys.stderr)
    for k, v in token_mismatch.items():
        print(f"  {k}: {v!r}", file=sys.stderr)
    return token_mismatch


def score_window(sides: dict, wi: int, w: list[int], nll: dict, secs: dict) -> dict:
    """Score window ``wi`` (ids ``w``) with every side, adding to ``nll`` and ``secs``; the
    window's row (per-side perplexity, and the log-prob agreement when both sides run)."""
    lp = {}
    row = {"window": wi}
    for key, side in sides.items():
        t0 = time.perf_counter()
        lg = side.logits(w)
        secs[key] += time.perf_counter() - t0
        if not np.all(np.isfinite(lg[: len(w) - 1])):
            raise SetupError(f"{side.name} returned non-finite logits in window {wi}")
        x = window_nll(lg, w)
        nll[key] += float(x.sum())
        row[f"{key}_ppl"] = math.exp(float(x.mean()))
        if len(sides) == 2:
            lp[key] = log_softmax(lg[: len(w) - 1])
    if len(lp) == 2:
        d = np.abs(lp["ours"] - lp["llama"])
        row["max_abs_logprob_diff"] = float(d.max())
        row["mean_abs_logprob_diff"] = float(d.mean())
        row["top1_agreement"] = float(
            np.mean(lp["ours"].argmax(axis=1) == lp["llama"].argmax(axis=1))
        )
    return row


def score_windows(sides: dict, windows: list[list[int]]) -> tuple[dict, dict, list[dict]]:
    """(summed NLL per side, scoring seconds per side, per-window rows), progress printed."""
    nll = {k: 0.0 for k in sides}
    secs = {k: 0.0 for k in sides}
    per_window = []
    for wi, w in enumerate(windows):
        row = score_window(sides, wi, w, nll, secs)
        per_window.append(row)
        print(
            f"  window {wi + 1}/{len(windows)}: "
            + ", ".join(f"{sides[k].name} ppl {row[f'{k}_ppl']:.4f}" for k in sides)
            + (
                f", top-1 agree {row['top1_agreement']:.3f}, max |dlogp| "
                f"{row['max_abs_logprob_diff']:.3g}"
                if "top1_agreement" in row
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )
    return nll, secs, per_window


def verdict(ppl: dict, per_window: list[dict], token_mismatch: dict | None, args) -> tuple:
    """(exit status, relative difference or None): prints the comparison of both sides' perplexity
    against --max-rel-diff and the tokenizer check."""
    if len(ppl) != 2:
        return 0, None
    status = 0
    rel = abs(ppl["ours"] - ppl["llama"]) / ppl["llama"]
    agree = float(np.mean([r["top1_agreement"] for r in per_window]))
    print(
        f"relative difference |ours - llama| / llama: {100 * rel:.3f}% "
        f"(limit {100 * args.max_rel_diff:.2f}%); top-1 agreement {100 * agree:.1f}%"
    )
    if rel > args.max_rel_diff:
        print(f"FAIL: perplexities differ by {100 * rel:.3f}% > {100 * args.max_rel_diff:.2f}%")
        status = 1
    if token_mismatch is not None:
        msg = (
            f"tokenizers disagree from id index {token_mismatch['index']} "
            f"(llama {token_mismatch['llama_ids']} vs ours {token_mismatch['ours_ids']})"
        )
        if args.allow_token_mismatch:
            print(f"WARNING: {msg}")
        else:
            print(f"FAIL: {msg}")
            status = status or 3
    if status == 0:
        print("OK")
    return status, rel


def main(argv=None) -> int:
    """Score both engines on the same windows; the exit status of :func:`verdict`, 2 on setup
    errors."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.ctx < 2 or args.min_tokens < 2:
        ap.error("--ctx and --min-tokens must be >= 2")

    model = Path(args.model) if args.model else bench.default_model()
    if not model.is_file():
        print(f"error: model not found: {model}", file=sys.stderr)
        return 2
    n_windows = math.ceil(args.min_tokens / args.ctx)
    need = n_windows * args.ctx
    try:
        sides = load_sides(model, args)
        tok_side = sides.get("llama") or sides["ours"]
        text, source, ids = text_and_ids(tok_side, args, need)
        token_mismatch = tokenizer_mismatch(sides, text, ids)
        ids = ids[:need]
        windows = [ids[s : s + args.ctx] for s in range(0, need, args.ctx)]
        scored = sum(len(w) - 1 for w in windows)
        print(
            f"model {model.name}: {len(windows)} windows x {args.ctx} tokens, {scored} tokens "
            f"scored, {args.threads} threads\ntext: {source} ({len(text)} chars); "
            f"ids from {tok_side.name}'s tokenizer",
            flush=True,
        )
        nll, secs, per_window = score_windows(sides, windows)
    except SetupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    ppl = {k: math.exp(nll[k] / scored) for k in sides}
    print()
    for k, side in sides.items():
        print(
            f"{side.name:>14} perplexity: {ppl[k]:.4f}   ({scored / secs[k]:.0f} tok/s scoring, "
            f"all logits)"
        )
    status, rel = verdict(ppl, per_window, token_mismatch, args)

    if args.json:
        rep = {
            "model": str(model),
            "ctx": args.ctx,
            "windows": len(windows),
            "scored_tokens": scored,
            "threads": args.threads,
            "text_source": source,
            "text_chars": len(text),
            "perplexity": {sides[k].name: ppl[k] for k in sides},
            "scoring_seconds": {sides[k].name: secs[k] for k in sides},
            "relative_difference": rel,
            "token_mismatch": token_mismatch,
            "per_window": per_window,
            "machine": bench.machine_info(),
        }
        bench.write_json(args.json, rep)
    return status


if __name__ == "__main__":
    sys.exit(main())
