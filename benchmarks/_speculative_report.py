"""bench_speculative.py's report: how far two outputs agree, the ratios between modes, and the
markdown tables."""

from __future__ import annotations

from pathlib import Path

from powerinfer_rs.benchmarking import looks_busy


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
    others = [
        f"{r['task']}/{m} {s['others_cpu_util']:.2f}"
        for r in rep["rows"]
        for m, s in r["modes"].items()
        if "others_cpu_util" in s
    ]
    print("other processes' CPU (CPU s / wall s over the same runs): " + ", ".join(others))
    busy = [
        f"{r['task']}/{m}"
        for r in rep["rows"]
        for m, s in r["modes"].items()
        if looks_busy(s.get("others_cpu_util"), s["cpu_util"], rep["threads"])
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
