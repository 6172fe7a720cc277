"""bench_speculative.py's draft task: a synthetic target and its smaller draft model, their greedy
agreement, and the race of plain against draft speculation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from _bench_common import (
    synthetic_gguf,
)
from _speculative_engines import (
    open_ours,
    probe_spec,
    run_ours,
)
from _speculative_race import race_modes, summarize
from _speculative_report import add_ratios, agreement

#: Synthetic target/draft shape of the draft task (full run) and of --quick (the small llama
#: other benchmarks cache).
DRAFT_SHAPE = dict(dim=1024, ffn=2816, layers=8, heads=16, kv_heads=16, vocab=32000)


DRAFT_SHAPE_QUICK = dict(dim=256, ffn=704, layers=4, heads=8, kv_heads=8, vocab=1000)


def draft_models(args) -> tuple[Path, Path, str]:
    if args.draft_pair:
        t, d = (Path(p) for p in args.draft_pair.split(",", 1))
        return t, d, f"target {t.name}, draft {d.name}"
    shape = dict(DRAFT_SHAPE_QUICK if args.quick else DRAFT_SHAPE, activation="relu")
    cache = Path(args.cache)
    target = synthetic_gguf(cache, args.target_dtype, shape, seed=args.seed)
    dshape = dict(shape, layers=args.draft_layers or shape["layers"])
    draft = synthetic_gguf(cache, args.draft_dtype, dshape, seed=args.seed)
    dims = " ".join(f"{k}={v}" for k, v in shape.items() if k != "activation")
    label = (
        f"synthetic llama {dims} relu seed {args.seed}: target {args.target_dtype.upper()}, "
        f"draft {args.draft_dtype.upper()} {dshape['layers']} layers (same weights)"
    )
    return target, draft, label


def greedy_agreement(target, draft_path: Path, ids: list[int], n: int, args) -> float:
    """Share of the target's ``n`` greedy tokens after ``ids`` that the draft model's argmax
    predicts from the same prefix (``Engine.logits`` of both over prompt + output; untimed):
    what a greedy draft's acceptance rate should come near."""
    target.reset()
    out = [
        s.token
        for s in target.stream_tokens(ids, max_new_tokens=n, temperature=0.0, ignore_eos=True)
        if s.token is not None
    ]
    draft = open_ours(draft_path, args.threads, args.n_ctx)
    pred = draft.logits(ids + out).argmax(-1)[len(ids) - 1 : -1]
    target.reset()
    return float(np.mean(pred == np.asarray(out)))


def run_draft_task(args) -> dict:
    n = args.tokens or 128
    k = args.draft_max
    target, draft, label = draft_models(args)
    row = {"task": "draft", "kind": "draft", "label": label, "tokens": n, "draft_max": k}
    row["synthetic"] = not args.draft_pair
    row["target_model"], row["draft_model"] = str(target), str(draft)
    print(f"[draft] {label}", flush=True)
    eng = open_ours(target, args.threads, args.n_ctx, draft=None if args.skip_spec else draft)
    vocab = int(eng.config.vocab_size)
    rng = np.random.default_rng(args.seed)
    ids = [int(t) for t in rng.integers(3, vocab, args.draft_prompt)]
    row["prompt_tokens"] = len(ids)
    modes = {"ours_plain": lambda: run_ours(eng, ids, n, "off", k)}
    if not args.skip_spec:
        probe_spec(eng, ids, "draft", k)
        modes["ours_draft"] = lambda: run_ours(eng, ids, n, "draft", k)
    results = race_modes(modes, args.repeats, args.warmup)
    row["modes"] = summarize(results, n)
    row["greedy_agreement"] = greedy_agreement(eng, draft, ids, n, args)
    texts = {m: runs[-1]["text"] for m, runs in results.items()}
    row["agree_ours_draft_plain"] = agreement(texts.get("ours_plain"), texts.get("ours_draft"))
    add_ratios(row)
    for m, s in row["modes"].items():
        print(f"  {m:13s} " + " ".join(f"{x:.1f}" for x in s["samples"]) + " tok/s", flush=True)
    return row
