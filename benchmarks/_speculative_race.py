"""bench_speculative.py's race: the modes of one task run in the one alternating race, their
results summarised (median tokens/s, the speculation counters, CPU use), and the chat tasks
that race ours against llama.cpp, plain and with prompt lookup."""

from __future__ import annotations

from _bench_common import (
    median,
    race,
)
from _speculative_engines import (
    SPEC_KEYS,
    run_llama,
    run_ours,
)
from _speculative_report import add_ratios, agreement
from _speculative_tasks import TASKS


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


def race_modes(modes: dict, repeats: int, warmup: int) -> dict:
    """The one race (:func:`_bench_common.race`) of ``modes`` (name -> callable returning a
    result dict): name -> list of results, each with its ``cpu`` use (process CPU s / wall s)
    and ``others_cpu`` (other processes' CPU s / wall s) added."""
    runs = race(modes, repeats, warmup=warmup)
    return {
        m: [{**r.value, "cpu": r.cpu_util, "others_cpu": r.others_util} for r in rs]
        for m, rs in runs.items()
    }


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
            "others_cpu_util": median([r["others_cpu"] for r in runs]),
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
    results = race_modes(modes, args.repeats, args.warmup)
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
