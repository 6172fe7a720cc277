#!/usr/bin/env python3
"""Speculative decoding (issue 61): decode tokens/s of our prompt-lookup and draft-model
decoding against our plain decoding and llama.cpp's prompt-lookup decoding, in one process.

Tasks (``--tasks``, default all):

* ``rename`` (copies): a ~440-token Python file, "rename variable X to Y and output the whole
  file", through the model's chat template. Target: lookup >= 2x our plain decoding and >= 1.2x
  llama.cpp's prompt-lookup decoding.
* ``json`` (copies): a customer message, "answer with a JSON object that repeats its fields".
  Same targets.
* ``story`` (copies nothing): a story from a one-line prompt. Target: lookup >= 0.97x plain.
* ``draft`` (synthetic): a synthetic target/draft pair sharing one tokenizer (the same synthetic
  llama weights: target ``--target-dtype`` F16, draft ``--draft-dtype`` Q4_0, optionally with
  fewer layers) from pseudo-random prompt ids: ours plain on the target against ours with the
  draft model (``Engine.from_pretrained(target, draft=draft)``, ``speculative="draft"``);
  acceptance rate and speed-up, beside the "greedy agreement": the share of the target's
  greedy tokens that the draft's argmax predicts from the same prefix (``Engine.logits`` of
  both, untimed), which the acceptance rate should come near. Labelled synthetic.
  ``--draft-pair TARGET,DRAFT`` uses two real files instead.

Modes, alternated in one process (the order reversed every other repeat), ``--repeats`` each
after ``--warmup`` untimed runs; medians reported:

* ours plain:   ``engine.generate(ids, max_new_tokens=N, temperature=0, ignore_eos=True,
  speculative="off")`` (the engine's default, "auto", is lookup)
* ours lookup:  the same with ``speculative="lookup", draft_max=K``
* ours draft:   the same with ``speculative="draft", draft_max=K`` (draft task)
* llama plain:  ``Llama(model, n_threads=T).generate(ids, temp=0)`` (llama-cpp-python)
* llama lookup: ``Llama(model, n_threads=T, draft_model=LlamaPromptLookupDecoding(
  max_ngram_size=--llama-ngram, num_pred_tokens=K)).generate(ids, temp=0)``
  (``logits_all=True`` passed by hand: llama-cpp-python 0.3.36 forces it with a draft model but
  sizes its logits buffer by the argument and fails past n_batch positions). This is the peer
  as shipped: every verify step copies its K + 1 rows of logits into Python, and the draft is
  the continuation of the first (earliest) match of the last 1..max_ngram_size tokens.

Both engines get the same prompt token ids (ours: the chat template applied and tokenized by
our engine, exactly what ``engine.chat`` feeds; llama.cpp gets the ids, not the text), greedy,
and produce exactly N tokens (end-of-sequence ignored; llama's generator is stopped at N).

What is timed (prefill excluded on both sides, same formula): decode tokens/s = (N - 1) /
decode seconds, where the first generated token is the one the prompt's prefill yields and
decode seconds cover the other N - 1.
Ours: the wall time of the ``generate`` call minus its ``stats()["prefill_seconds"]`` (the
prompt's prefill; the rest is decode, Python sampling included; if the engine reports no
prefill seconds, ``stats()["decode_seconds"]`` is used and a note printed). The engine is reset
before each run (no prefix reuse). llama.cpp: the wall time from the first token its
``generate`` generator yields (prefill done) to the N-th; its state is reset before each run.
The ``stats()`` counters of speculation ("drafted_tokens", "accepted_tokens",
"acceptance_rate", "verify_steps", "tokens_per_verify_step") are shown as medians (ours
tok/step: tokens per verification step). For llama.cpp's lookup the script
counts the draft calls itself: verify steps = draft calls during decode, tokens/step = (N - 1) /
steps, drafted = the draft tokens proposed.

"copyable" (untimed, from one more greedy run of ours): the share of the greedy output tokens
that the most recent earlier match of the last 2 (else 1) tokens in prompt + output predicts; a
guide to what any prompt lookup can accept on this model and prompt.

Whether the texts agree is printed: our lookup against our plain (greedy speculation must not
change the text; batched verification rounds differently from one-token steps, so a late
divergence on a near-tie is possible, and is shown with its position), llama's lookup against
llama's plain, and ours against llama's (llama's ids decoded by our tokenizer).

Also printed: the exact command line, the host's read bandwidth (``powerinfer_rs._core.
measure_read_bandwidth``, as bench_decode.py) and the CPU use of each mode (process CPU s per
wall s; < 0.9 x threads means the machine was busy and the figures should be thrown away).

Examples::

    python benchmarks/bench_speculative.py                      # all tasks, 2 threads, 5 repeats
    python benchmarks/bench_speculative.py --tasks rename,json --repeats 7 --json out/spec.json
    python benchmarks/bench_speculative.py --quick              # smoke: few tokens, 1 repeat
    python benchmarks/bench_speculative.py --quick --skip-spec  # only the plain and llama modes
    python benchmarks/bench_speculative.py --tasks draft --draft-layers 4
"""

from __future__ import annotations

import inspect
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    default_model,
    import_llama,
    machine_info,
    measure_bandwidth,
    median,
    open_llama,
    require_powerinfer,
    synthetic_gguf,
    write_json,
)
from _speculative_tasks import TASKS  # noqa: E402

ALL_TASKS = [*TASKS, "draft"]
SPEC_KEYS = ("drafted", "accepted", "acceptance_rate", "verify_steps", "tokens_per_step")

#: Synthetic target/draft shape of the draft task (full run) and of --quick (the small llama
#: other benchmarks cache).
DRAFT_SHAPE = dict(dim=1024, ffn=2816, layers=8, heads=16, kv_heads=16, vocab=32000)
DRAFT_SHAPE_QUICK = dict(dim=256, ffn=704, layers=4, heads=8, kv_heads=8, vocab=1000)

MISSING_API = (
    "this powerinfer_rs has no speculative decoding yet (issue 61): {err}. "
    "Expected engine.generate(ids, ..., speculative='lookup'|'draft'|None, draft_max=K) and "
    "Engine.from_pretrained(path, draft=DRAFT_PATH). Run with --skip-spec to measure only "
    "the plain and llama.cpp modes."
)


class MissingApi(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# our engine


def open_ours(path, threads: int, n_ctx: int, draft=None):
    pi = require_powerinfer()
    kw = dict(threads=threads, n_ctx=n_ctx)
    if draft is None:
        return pi.Engine.from_pretrained(str(path), **kw)
    try:
        return pi.Engine.from_pretrained(str(path), draft=str(draft), **kw)
    except TypeError as e:
        raise MissingApi(MISSING_API.format(err=f"Engine.from_pretrained(draft=...): {e}")) from e


def check_draft_api() -> None:
    """Raise MissingApi when ``Engine.from_pretrained`` takes no ``draft=`` (before any run)."""
    params = inspect.signature(require_powerinfer().Engine.from_pretrained).parameters
    kinds = {p.kind for p in params.values()}
    if "draft" not in params and inspect.Parameter.VAR_KEYWORD not in kinds:
        raise MissingApi(MISSING_API.format(err="Engine.from_pretrained has no draft= argument"))


def ours_kwargs(n: int, spec: str | None, k: int) -> dict:
    # Plain is speculative="off" said explicitly: the engine's default ("auto") is lookup.
    kw = dict(max_new_tokens=n, temperature=0.0, seed=0, ignore_eos=True, speculative=spec)
    if spec != "off":
        kw["draft_max"] = k
    return kw


def ours_call_text(n: int, spec: str | None, k: int) -> str:
    args = ", ".join(f"{a}={v!r}" for a, v in ours_kwargs(n, spec, k).items())
    return f"engine.generate(ids, {args})"


def probe_spec(engine, ids: list[int], spec: str, k: int) -> None:
    """Raise MissingApi when ``engine.generate`` does not take ``speculative=spec``."""
    engine.reset()
    try:
        engine.generate(list(ids), **ours_kwargs(2, spec, k))
    except TypeError as e:
        raise MissingApi(MISSING_API.format(err=f"engine.generate(speculative=...): {e}")) from e


def run_ours(engine, ids: list[int], n: int, spec: str | None, k: int) -> dict:
    engine.reset()  # no prefix reuse between runs: every run prefills the prompt
    t0 = time.perf_counter()
    text = engine.generate(list(ids), **ours_kwargs(n, spec, k))
    wall = time.perf_counter() - t0
    st = engine.stats() if callable(getattr(engine, "stats", None)) else {}
    gen = int(st.get("completion_tokens", n))
    pre = float(st.get("prefill_seconds") or 0.0)
    if pre > 0:
        secs, how = wall - pre, "wall - prefill_seconds"
    else:
        secs, how = float(st.get("decode_seconds") or wall), "stats decode_seconds"
    out = {"text": text, "tokens": gen, "decode_s": secs, "timing": how, "wall_s": wall}
    out["stats_decode_tok_s"] = st.get("decode_tokens_per_second")
    # The engine's names of the speculation counters (tokens per step: per verification step).
    names = {
        "drafted": "drafted_tokens",
        "accepted": "accepted_tokens",
        "acceptance_rate": "acceptance_rate",
        "verify_steps": "verify_steps",
        "tokens_per_step": "tokens_per_verify_step",
    }
    for key in SPEC_KEYS:
        if st.get(names[key]) is not None:
            out[key] = st[names[key]]
    return out


# ---------------------------------------------------------------------------------------------
# llama.cpp


def llama_lookup_class(llama_cpp):
    """LlamaPromptLookupDecoding that counts its calls (verify steps) and drafted tokens."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class Counting(LlamaPromptLookupDecoding):
        calls = 0
        drafted = 0

        def __call__(self, input_ids, /, **kwargs):
            out = super().__call__(input_ids, **kwargs)
            self.calls += 1
            self.drafted += len(out)
            return out

    return Counting


def run_llama(llm, ids: list[int], n: int, counter=None) -> dict:
    llm.reset()
    out = []
    t_first = None
    calls0 = drafted0 = 0
    gen = llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    try:
        for tok in gen:
            out.append(int(tok))
            if t_first is None:
                t_first = time.perf_counter()
                if counter is not None:
                    calls0, drafted0 = counter.calls, counter.drafted
            if len(out) >= n:
                break
        t_last = time.perf_counter()
    finally:
        gen.close()
    res = {"ids": out, "tokens": len(out), "decode_s": max(t_last - t_first, 1e-9)}
    if counter is not None:
        steps = counter.calls - calls0
        res["verify_steps"] = steps
        res["drafted"] = counter.drafted - drafted0
        res["tokens_per_step"] = (len(out) - 1) / steps if steps else None
    return res


# ---------------------------------------------------------------------------------------------
# one task


def lookup_hit_share(prompt: list[int], out: list[int], ngram: int = 2) -> float:
    """Share of ``out`` tokens that the continuation of the most recent earlier match of the
    last 1..``ngram`` tokens (longest first) in prompt + output so far predicts: how much of a
    greedy output a one-token prompt lookup would get right."""
    seq, hits = list(prompt), 0
    for tok in out:
        pred = None
        for n in range(min(ngram, len(seq) - 1), 0, -1):
            key = seq[-n:]
            j = next((j for j in range(len(seq) - n - 1, -1, -1) if seq[j : j + n] == key), None)
            if j is not None:
                pred = seq[j + n]
                break
        hits += pred == tok
        seq.append(tok)
    return hits / max(1, len(out))


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where ``a`` and ``b`` differ (None if equal)."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def agreement(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return "-"
    d = first_difference(a, b)
    return "same" if d is None else f"differ@{d}/{max(len(a), len(b))}"


def race(modes: dict, repeats: int, warmup: int) -> dict:
    """Run every mode (name -> callable returning a result dict) ``warmup`` times untimed, then
    ``repeats`` times alternating (order reversed every other repeat). Returns name -> list of
    results, each with its ``cpu`` use (process CPU s / wall s) added."""
    for fn in modes.values():
        for _ in range(warmup):
            fn()
    results = {m: [] for m in modes}
    order = list(modes)
    for r in range(repeats):
        for m in order if r % 2 == 0 else order[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            res = modes[m]()
            res["cpu"] = (time.process_time() - c0) / (time.perf_counter() - w0)
            results[m].append(res)
    return results


def summarize(results: dict, n: int) -> dict:
    """Per mode: median tokens/s, samples, medians of the speculation counters, CPU use."""
    out = {}
    for m, runs in results.items():
        if not runs:
            continue
        rates = [(r["tokens"] - 1) / r["decode_s"] for r in runs]
        s = {
            "tok_s": median(rates),
            "samples": rates,
            "tokens": [r["tokens"] for r in runs],
            "cpu_util": median([r["cpu"] for r in runs]),
        }
        if any(r["tokens"] != n for r in runs):
            s["warning"] = f"generated {sorted({r['tokens'] for r in runs})} tokens, not {n}"
        for key in (*SPEC_KEYS, "stats_decode_tok_s"):
            vals = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
            if vals:
                s[key] = median(vals)
        timings = {r.get("timing") for r in runs} - {None}
        if timings:
            s["timing"] = sorted(timings)
        out[m] = s
    return out


def run_chat_task(name: str, args, ctx: dict) -> dict:
    messages, default_n, kind = TASKS[name]
    n = args.tokens or default_n
    eng = ctx["ours"]
    ids = list(eng.tokenizer.encode(eng.format_chat(messages)))
    k = args.draft_max
    row = {"task": name, "kind": kind, "prompt_tokens": len(ids), "tokens": n, "draft_max": k}
    if len(ids) + n + k + 1 > args.n_ctx:
        raise SystemExit(f"{name}: {len(ids)} prompt + {n} tokens + {k} drafted > --n-ctx")
    modes = {}
    if "ours" in args.engines:
        modes["ours_plain"] = lambda: run_ours(eng, ids, n, "off", k)
        if not args.skip_spec:
            modes["ours_lookup"] = lambda: run_ours(eng, ids, n, "lookup", k)
    if "llama" in args.engines and ctx.get("llama_plain") is not None:
        lp, ll, counter = ctx["llama_plain"], ctx["llama_lookup"], ctx["counter"]
        modes["llama_plain"] = lambda: run_llama(lp, ids, n)
        modes["llama_lookup"] = lambda: run_llama(ll, ids, n, counter)
        llama_ids = lp.tokenize(
            eng.format_chat(messages).encode("utf-8"), add_bos=False, special=True
        )
        row["llama_tokenizer_agrees"] = list(llama_ids) == ids or (
            ids[:1] == [eng.tokenizer.bos_id] and list(llama_ids) == ids[1:]
        )
    print(f"[{name}] {len(ids)} prompt tokens, {n} generated, modes {', '.join(modes)}", flush=True)
    results = race(modes, args.repeats, args.warmup)
    row["modes"] = summarize(results, n)
    texts = {}
    for m, runs in results.items():
        last = runs[-1]
        texts[m] = last["text"] if "text" in last else eng.tokenizer.decode(last["ids"])
    if "llama_plain" in results and "llama_lookup" in results:
        same_ids = results["llama_plain"][-1]["ids"] == results["llama_lookup"][-1]["ids"]
        row["agree_llama_lookup_plain"] = (
            "same" if same_ids else agreement(texts["llama_plain"], texts["llama_lookup"])
        )
    greedy = [
        st.token
        for st in eng.stream_tokens(ids, max_new_tokens=n, temperature=0.0, ignore_eos=True)
        if st.token is not None
    ]
    row["lookup_hit_share"] = lookup_hit_share(ids, greedy)
    row["agree_ours_lookup_plain"] = agreement(texts.get("ours_plain"), texts.get("ours_lookup"))
    row["agree_ours_llama"] = agreement(texts.get("ours_plain"), texts.get("llama_plain"))
    row["texts"] = texts
    add_ratios(row)
    for m, s in row["modes"].items():
        print(f"  {m:13s} " + " ".join(f"{x:.1f}" for x in s["samples"]) + " tok/s", flush=True)
    return row


def add_ratios(row: dict) -> None:
    md = row["modes"]

    def r(a, b):
        if a in md and b in md and md[b]["tok_s"] > 0:
            return md[a]["tok_s"] / md[b]["tok_s"]
        return None

    row["lookup_over_plain"] = r("ours_lookup", "ours_plain")
    row["lookup_over_llama_lookup"] = r("ours_lookup", "llama_lookup")
    row["plain_over_llama_plain"] = r("ours_plain", "llama_plain")
    row["llama_lookup_over_llama_plain"] = r("llama_lookup", "llama_plain")
    row["draft_over_plain"] = r("ours_draft", "ours_plain")
    if row["kind"] == "copy":
        a, b = row["lookup_over_plain"], row["lookup_over_llama_lookup"]
        row["target"] = ">=2x plain, >=1.2x llama lookup"
        row["meets_target"] = None if a is None or b is None else (a >= 2.0 and b >= 1.2)
    elif row["kind"] == "prose":
        a = row["lookup_over_plain"]
        row["target"] = ">=0.97x plain"
        row["meets_target"] = None if a is None else a >= 0.97


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
    results = race(modes, args.repeats, args.warmup)
    row["modes"] = summarize(results, n)
    row["greedy_agreement"] = greedy_agreement(eng, draft, ids, n, args)
    texts = {m: runs[-1]["text"] for m, runs in results.items()}
    row["agree_ours_draft_plain"] = agreement(texts.get("ours_plain"), texts.get("ours_draft"))
    add_ratios(row)
    for m, s in row["modes"].items():
        print(f"  {m:13s} " + " ".join(f"{x:.1f}" for x in s["samples"]) + " tok/s", flush=True)
    return row


# ---------------------------------------------------------------------------------------------
# report


def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def print_tables(rep: dict) -> None:
    rows = [r for r in rep["rows"] if r["kind"] != "draft"]
    if rows:
        print(
            f"\nSpeculative decoding: {Path(rep['model']).name}, {rep['threads']} threads, "
            f"draft_max {rep['draft_max']}, decode tok/s (median of {rep['repeats']})\n"
        )
        print(
            "| task | prompt tok | gen tok | ours plain | ours lookup | lookup/plain | "
            "llama plain | llama lookup | ours lookup/llama lookup | target | met |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for r in rows:
            md = r["modes"]
            met = {True: "yes", False: "NO", None: "-"}[r.get("meets_target")]
            print(
                f"| {r['task']} | {r['prompt_tokens']} | {r['tokens']} | "
                f"{fmt(md.get('ours_plain', {}).get('tok_s'))} | "
                f"{fmt(md.get('ours_lookup', {}).get('tok_s'))} | "
                f"{fmt(r.get('lookup_over_plain'), '.2f')} | "
                f"{fmt(md.get('llama_plain', {}).get('tok_s'))} | "
                f"{fmt(md.get('llama_lookup', {}).get('tok_s'))} | "
                f"{fmt(r.get('lookup_over_llama_lookup'), '.2f')} | {r.get('target', '')} | {met} |"
            )
        print(
            "\n| task | copyable | ours tok/step | ours acceptance | ours drafted | "
            "llama tok/step | llama drafted | ours lookup vs plain text | "
            "llama lookup vs plain | ours vs llama |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
        for r in rows:
            o, ll = r["modes"].get("ours_lookup", {}), r["modes"].get("llama_lookup", {})
            print(
                f"| {r['task']} | {fmt(r.get('lookup_hit_share'), '.2f')} | "
                f"{fmt(o.get('tokens_per_step'), '.2f')} | "
                f"{fmt(o.get('acceptance_rate'), '.2f')} | {fmt(o.get('drafted'), '.0f')} | "
                f"{fmt(ll.get('tokens_per_step'), '.2f')} | {fmt(ll.get('drafted'), '.0f')} | "
                f"{r.get('agree_ours_lookup_plain', '-')} | "
                f"{r.get('agree_llama_lookup_plain', '-')} | {r.get('agree_ours_llama', '-')} |"
            )
    for r in rep["rows"]:
        if r["kind"] != "draft":
            continue
        syn = " (synthetic)" if r["synthetic"] else ""
        md = r["modes"]
        d = md.get("ours_draft", {})
        print(f"\nDraft model{syn}: {r['label']}, draft_max {r['draft_max']}\n")
        print(
            "| task | prompt tok | gen tok | ours plain | ours draft | draft/plain | "
            "acceptance | greedy agreement | tok/step | drafted | text vs plain |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        print(
            f"| draft{syn} | {r['prompt_tokens']} | {r['tokens']} | "
            f"{fmt(md.get('ours_plain', {}).get('tok_s'))} | {fmt(d.get('tok_s'))} | "
            f"{fmt(r.get('draft_over_plain'), '.2f')} | {fmt(d.get('acceptance_rate'), '.2f')} | "
            f"{fmt(r.get('greedy_agreement'), '.2f')} | "
            f"{fmt(d.get('tokens_per_step'), '.2f')} | {fmt(d.get('drafted'), '.0f')} | "
            f"{r.get('agree_ours_draft_plain', '-')} |"
        )
    if rows:
        print(
            "\ncopyable: share of our greedy output tokens that the most recent earlier match of"
            " the last 2 (else 1) tokens in prompt + output predicts (untimed; a guide to what a"
            " lookup can accept)"
        )
    print(f"\nmem BW: {rep['bandwidth_gbs']:.2f} GB/s ({rep['bandwidth_method']})")
    cpu = [
        f"{r['task']}/{m} {s['cpu_util']:.2f}" for r in rep["rows"] for m, s in r["modes"].items()
    ]
    print("cpu use (process CPU s / wall s, expect ~threads): " + ", ".join(cpu))
    busy = [
        f"{r['task']}/{m}"
        for r in rep["rows"]
        for m, s in r["modes"].items()
        if s["cpu_util"] < 0.9 * rep["threads"]
    ]
    if busy:
        print(
            "WARNING: the machine looks busy (other processes took CPU time) during "
            + ", ".join(busy)
            + ": these figures are unreliable, run again on an idle machine"
        )
    for r in rep["rows"]:
        for m, s in r["modes"].items():
            if "warning" in s:
                print(f"WARNING: {r['task']}/{m}: {s['warning']}")
            if "timing" in s and "stats decode_seconds" in s["timing"]:
                print(f"note: {r['task']}/{m}: timed by stats decode_seconds (no prefill_seconds)")
        if r.get("llama_tokenizer_agrees") is False:
            print(f"note: {r['task']}: llama.cpp's tokenizer gives other ids (ours are fed)")
    print("\ncalls:")
    for line in rep["calls"]:
        print(f"  {line}")
    for err in rep["errors"]:
        print(f"ERROR: {err}")


# ---------------------------------------------------------------------------------------------


def run(args) -> dict:
    tasks = args.tasks
    model = Path(args.model) if args.model else default_model()
    chat_tasks = [t for t in tasks if t != "draft"]
    mi = machine_info()
    print(f"command    : {shlex.join([sys.executable, *sys.argv])}")
    print(f"model      : {model}")
    print(f"tasks      : {', '.join(tasks)}; engines {', '.join(args.engines)}")
    print(
        f"runs       : {args.repeats} repeats (median) after {args.warmup} warm-up, "
        f"{args.threads} threads, draft_max {args.draft_max}"
    )
    print(f"machine    : {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    bw, how = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)
    print(f"mem BW     : {bw:.2f} GB/s ({how})", flush=True)
    rep = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "model": str(model),
        "threads": args.threads,
        "draft_max": args.draft_max,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "machine": mi,
        "bandwidth_gbs": bw,
        "bandwidth_method": how,
        "rows": [],
        "errors": [],
        "calls": [],
    }
    if "draft" in tasks and "ours" in args.engines and not args.skip_spec:
        check_draft_api()
    ctx = {}
    n_doc = args.tokens or "N"
    if chat_tasks:
        ctx["ours"] = open_ours(model, args.threads, args.n_ctx)
        rep["calls"].append(
            f"ours: Engine.from_pretrained({str(model)!r}, threads={args.threads}, "
            f"n_ctx={args.n_ctx}); ids = engine.tokenizer.encode(engine.format_chat(messages))"
        )
        rep["calls"].append(f"ours plain: {ours_call_text(n_doc, 'off', args.draft_max)}")
        if "ours" in args.engines and not args.skip_spec:
            probe_spec(ctx["ours"], [1, 2, 3, 4], "lookup", args.draft_max)
            rep["calls"].append(f"ours lookup: {ours_call_text(n_doc, 'lookup', args.draft_max)}")
        if "llama" in args.engines:
            llama_cpp, why = import_llama()
            if llama_cpp is None:
                rep["errors"].append(f"llama.cpp not run: {why}")
            else:
                kw = dict(n_batch=512, n_ubatch=512)
                counting = llama_lookup_class(llama_cpp)
                counter = counting(max_ngram_size=args.llama_ngram, num_pred_tokens=args.draft_max)
                ctx["llama_plain"] = open_llama(model, args.n_ctx, args.threads, **kw)
                # logits_all=True by hand: llama-cpp-python 0.3.36 turns it on with a draft
                # model but sizes its score buffer by the argument (n_batch rows), and the
                # first verify step past n_batch positions then fails to copy its logits.
                ctx["llama_lookup"] = open_llama(
                    model, args.n_ctx, args.threads, draft_model=counter, logits_all=True, **kw
                )
                ctx["counter"] = counter
                common = (
                    f"Llama({str(model)!r}, n_ctx={args.n_ctx}, n_threads={args.threads}, "
                    f"n_threads_batch={args.threads}, n_batch=512, n_ubatch=512"
                )
                gen = (
                    ".generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, "
                    f"repeat_penalty=1.0) stopped after {n_doc} tokens"
                )
                rep["calls"].append(f"llama plain: {common}){gen}")
                rep["calls"].append(
                    f"llama lookup: {common}, logits_all=True, "
                    "draft_model=LlamaPromptLookupDecoding("
                    f"max_ngram_size={args.llama_ngram}, num_pred_tokens={args.draft_max})){gen}"
                )
    for t in chat_tasks:
        rep["rows"].append(run_chat_task(t, args, ctx))
    for key in ("llama_plain", "llama_lookup"):
        if ctx.get(key) is not None:
            ctx[key].close()
    ctx.clear()
    if "draft" in tasks:
        if "ours" not in args.engines:
            rep["errors"].append("draft task: ours only (--engines has no 'ours')")
        else:
            row = run_draft_task(args)
            rep["rows"].append(row)
            spec = "draft" if not args.skip_spec else None
            draft_kw = f"draft={row['draft_model']!r}, " if spec else ""
            rep["calls"].append(
                f"ours {spec or 'plain'} (draft task): Engine.from_pretrained("
                f"{row['target_model']!r}, {draft_kw}threads={args.threads}, "
                f"n_ctx={args.n_ctx}); {ours_call_text(n_doc, spec, args.draft_max)}; ids: "
                f"{row['prompt_tokens']} pseudo-random ids (seed {args.seed}); draft for the "
                f"greedy agreement: {row['draft_model']!r}"
            )
    rep["loadavg_after"] = os.getloadavg()
    return rep


def parse_list(s: str, choices: list[str]) -> list[str]:
    out = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in out if x not in choices]
    if bad or not out:
        raise SystemExit(f"choose from {', '.join(choices)} (got {s!r})")
    return out


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", help="GGUF file (default SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument(
        "--tasks", default=",".join(ALL_TASKS), help=f"comma-separated, of {', '.join(ALL_TASKS)}"
    )
    ap.add_argument("--engines", default="ours,llama", help="comma-separated: ours, llama")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="tokens generated per run (default per task: rename 256, json 128, story 256, "
        "draft 128; --quick 32)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per mode first")
    ap.add_argument(
        "--draft-max", type=int, default=10, help="draft tokens per step K, both engines (10)"
    )
    ap.add_argument(
        "--llama-ngram",
        type=int,
        default=2,
        help="LlamaPromptLookupDecoding's max_ngram_size (default 2, its own default)",
    )
    ap.add_argument(
        "--n-ctx",
        type=int,
        default=1024,
        help="context size of every engine (1024; llama's lookup keeps n_ctx x vocab logits)",
    )
    ap.add_argument(
        "--skip-spec",
        action="store_true",
        help="skip our speculative modes (smoke test of the rest on an engine without them)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 32 tokens, 1 repeat, small draft pair"
    )
    ap.add_argument(
        "--target-dtype", default="F16", help="draft task: synthetic target's dtype (F16)"
    )
    ap.add_argument("--draft-dtype", default="Q4_0", help="draft task: synthetic draft's dtype")
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=0,
        help="draft task: layers of the synthetic draft (default: the target's)",
    )
    ap.add_argument(
        "--draft-prompt", type=int, default=64, help="draft task: prompt length (random ids)"
    )
    ap.add_argument("--draft-pair", metavar="TARGET,DRAFT", help="draft task: two real GGUFs")
    add_synthetic_args(ap)
    add_bandwidth_args(ap)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    args.tasks = parse_list(args.tasks, ALL_TASKS)
    args.engines = parse_list(args.engines, ["ours", "llama"])
    if args.quick:
        args.tokens = args.tokens or 32
        args.repeats = 1
        args.bw_bytes = min(args.bw_bytes, 64 << 20)
        args.bw_iters = min(args.bw_iters, 2)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        rep = run(args)
    except MissingApi as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_tables(rep)
    write_json(args.json, rep)
    return 1 if rep["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
