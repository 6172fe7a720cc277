#!/usr/bin/env python3
"""Decode speed of powerinfer-rs against llama.cpp (llama-cpp-python), side by side in one run.

For each thread count both engines load the same GGUF with the same number of threads, are
warmed up, and then decode alternately (ours, llama, llama, ours, ...) --repeats times each;
the table reports the median tokens/s of each and the ratio ours/llama.cpp.

Both decode greedily from the same prompt token ids and are timed the same way: the wall time
of the single-token steps after the prompt (prefill excluded), sampling in Python included.
Ours is timed by the engine's own per-call stats (``Engine.stats()`` / ``last_stats``); if
neither exists, by the time of a generate() of N+1 tokens minus that of a 1-token generate.

"Achieved bandwidth" = weight bytes read per decoded token (from the GGUF tensor table: every
tensor except the embedding table, of which one row is read, unless the output head is tied to
it, in which case the head reads all of it) x tokens/s. It is set against the machine's read
bandwidth measured in this run with the same thread count
(``powerinfer_rs._core.measure_read_bandwidth``; fallback: numpy, single-threaded). The ratio
bandwidth / bytes-per-token is the floor-time speed limit.

Examples::

    python benchmarks/bench_decode.py                      # SmolLM2, threads 1 and 2
    python benchmarks/bench_decode.py --threads 2 --tokens 256 --json /tmp/decode.json
    python benchmarks/bench_decode.py --synthetic f16      # synthetic F16 llama, dim 2048
    python benchmarks/bench_decode.py --only llama         # llama.cpp side alone
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    Decode,
    Prefill,
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    default_model,
    fmt,
    gguf_weight_bytes,
    int_list,
    looks_busy,
    machine_info,
    markdown_table,
    measure_bandwidth,
    median,
    race_runners,
    synthetic_gguf,
    write_json,
)
from _decode_engines import LlamaCpp, Ours  # noqa: E402

DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg"
)

#: Shape of the --synthetic model (a llama-7B-like layer width, few layers).
SYNTH_SHAPE = dict(dim=2048, ffn=5504, layers=8, heads=16, kv_heads=16, vocab=32000)
#: The lattice i-quants (no encoder of ours: llama.cpp's quantizer functions write them, every
#: matrix in the format, from the F32 synthetic model; testing.ggml_quantizer).
LATTICE = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
#: Their --synthetic shape: every row whole 256-weight super-blocks, small enough for the
#: lattice searches (minutes on two cores for IQ2_XS and IQ1_S).
LATTICE_SHAPE = dict(dim=1024, ffn=2816, layers=4, heads=8, kv_heads=8, vocab=4096)
#: Formats whose --synthetic file llama.cpp's quantizer functions write from the F32 one (every
#: matrix in the format): the lattice i-quants, and Q2_0, which the installed gguf-py has no type
#: id for (so our writer cannot store it); Q2_0's at the dim-2048 shape.
GGML_WRITTEN = (*LATTICE, "Q2_0")


# ---------------------------------------------------------------------------------------------
# models


def synthetic_model(kind: str, cache: Path, activation: str, seed: int) -> Path:
    """Create (once) and return the synthetic GGUF of dtype ``kind``: one of
    :data:`GGML_WRITTEN` from the F32 model by llama.cpp's quantizer functions (every matrix, an
    importance matrix of ``testing.ggml_quantizer``; our writer has no lattice encoder, and
    gguf-py no Q2_0)."""
    shape = LATTICE_SHAPE if kind in LATTICE else SYNTH_SHAPE
    if kind not in GGML_WRITTEN:
        return synthetic_gguf(cache, kind, {**shape, "activation": activation}, seed=seed)
    from powerinfer_rs.testing.ggml_quantizer import quantize_gguf

    src = synthetic_gguf(cache, "F32", {**shape, "activation": activation}, seed=seed)
    dst = src.with_name(src.name.replace("-f32-", f"-{kind.lower()}-"))
    if not dst.is_file():
        print(f"quantizing {dst} with llama.cpp's quantizer ...", file=sys.stderr, flush=True)
        quantize_gguf(src, dst.with_suffix(".part"), kind).replace(dst)
    return dst


# ---------------------------------------------------------------------------------------------


def run(args) -> dict:
    if args.synthetic:
        model = synthetic_model(args.synthetic, Path(args.cache), args.activation, args.seed)
        shape = LATTICE_SHAPE if args.synthetic in LATTICE else SYNTH_SHAPE
        label = (
            f"synthetic {args.synthetic.upper()} llama "
            + " ".join(f"{k}={v}" for k, v in shape.items())
            + f" act={args.activation}"
        )
    else:
        model = Path(args.model) if args.model else default_model()
        label = model.name
    if not model.is_file():
        raise SystemExit(f"model not found: {model}")
    n_tokens = args.tokens if args.tokens else (32 if args.synthetic else 128)
    wb = gguf_weight_bytes(model)
    engines = [e for e in ("ours", "llama") if args.only in (None, e)]

    print(f"model      : {label}")
    print(f"file       : {model} ({wb['file_bytes'] / 1e6:.1f} MB, arch {wb['architecture']})")
    print(
        f"bytes/token: {wb['per_token'] / 1e6:.2f} MB "
        f"(embeddings {'tied: head reads all' if wb['tied_embeddings'] else 'untied: one row'})"
    )
    print(f"decode     : {n_tokens} tokens, {args.repeats} repeats (median), {args.warmup} warm-up")
    mi = machine_info()
    print(f"machine    : {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    if args.synthetic:
        print("NOTE: synthetic model (random weights) - figures are labelled 'synthetic'.")
        if args.activation != "silu":
            print("NOTE: llama.cpp runs llama-arch FFNs with SiLU whatever the file says.")
    print(flush=True)

    results = []
    for threads in args.threads:
        row = {"threads": threads, "tokens": n_tokens, "synthetic": bool(args.synthetic)}
        bw, how = measure_bandwidth(threads, args.bw_bytes, args.bw_iters)
        row["bandwidth_gbs"] = bw
        row["bandwidth_method"] = how

        loaded = {}
        n_ctx = max(args.n_ctx, args.prefill + 8)
        for key, cls in (("ours", Ours), ("llama", LlamaCpp)):
            if key not in engines:
                continue
            try:
                loaded[key] = cls(model, threads, n_ctx)
            except Exception as e:  # report and go on with the other engine
                print(f"[threads={threads}] {cls.name}: cannot load: {e}", file=sys.stderr)
                row[f"{key}_error"] = str(e)
        if not loaded:
            results.append(row)
            continue

        # same prompt ids for both: llama.cpp's tokenizer if present, else ours, else fixed ids
        prompt_ids = None
        for key in ("llama", "ours"):
            if key in loaded:
                try:
                    prompt_ids = loaded[key].tokenize(args.prompt)
                    break
                except Exception as e:
                    print(f"tokenize with {key} failed: {e}", file=sys.stderr)
        if not prompt_ids:
            prompt_ids = list(range(1, 17))
        row["prompt_tokens"] = len(prompt_ids)

        if "ours" in loaded and row.get("ours_bytes_per_token") is None:
            row["ours_bytes_per_token"] = loaded["ours"].bytes_per_token()

        runs = race_runners(loaded, Decode(prompt_ids, n_tokens), args.repeats, warmup=args.warmup)
        samples = {k: [n / secs for n, secs in (r.value for r in rs)] for k, rs in runs.items()}
        for key, rs in runs.items():
            row[f"{key}_tok_s"] = median(samples[key])
            row[f"{key}_samples"] = samples[key]
            row[f"{key}_cpu_util"] = median([r.cpu_util for r in rs])
            row[f"{key}_others_cpu_util"] = median([r.others_util for r in rs])
            row[f"{key}_achieved_gbs"] = wb["per_token"] * row[f"{key}_tok_s"] / 1e9
        if "ours" in loaded and "llama" in loaded:
            row["ratio_ours_llama"] = row["ours_tok_s"] / row["llama_tok_s"]
        if args.prefill:
            if "llama" in loaded:
                row["vocab"] = loaded["llama"].n_vocab
            elif "ours" in loaded:
                row["vocab"] = loaded["ours"].eng.config.vocab_size
            race_prefill(args, loaded, row)
        for eng in loaded.values():
            eng.close()
        row["loadavg_after"] = os.getloadavg()
        results.append(row)
        print(
            f"[threads={threads}] "
            + ", ".join(
                f"{k}: " + " ".join(f"{x:.1f}" for x in samples[k]) + " tok/s" for k in samples
            ),
            flush=True,
        )

    return {
        "model": str(model),
        "label": label,
        "synthetic": bool(args.synthetic),
        "weights": wb,
        "prompt": args.prompt,
        "machine": mi,
        "results": results,
    }


def race_prefill(args, loaded: dict, row: dict) -> None:
    """Prefill of ``args.prefill`` fixed pseudo-random token ids (the same for both engines, on an
    empty context, one batched pass each), alternating engines ABBA, ``args.repeats`` times."""
    vocab = int(row.get("vocab") or 0) or 1000
    rng = np.random.default_rng(args.seed)
    ids = [int(t) for t in rng.integers(100, max(101, vocab - 100), args.prefill)]
    for eng in loaded.values():
        eng.prefill(ids)  # warm-up
    runs = dict(
        zip(loaded, race_runners(list(loaded.values()), Prefill(ids), args.repeats).values())
    )
    secs = {k: [r.value for r in rs] for k, rs in runs.items()}
    for key in loaded:
        row[f"{key}_prefill_tok_s"] = args.prefill / median(secs[key])
        row[f"{key}_prefill_samples"] = [args.prefill / s for s in secs[key]]
    if "ours" in loaded and "llama" in loaded:
        row["prefill_ratio_ours_llama"] = row["ours_prefill_tok_s"] / row["llama_prefill_tok_s"]
    print(
        f"[threads={row['threads']}] prefill {args.prefill}: "
        + ", ".join(
            f"{k}: " + " ".join(f"{x:.1f}" for x in row[f"{k}_prefill_samples"]) + " tok/s"
            for k in loaded
        ),
        flush=True,
    )


COLUMNS = [
    ("threads", "threads", "d"),
    ("ours tok/s", "ours_tok_s", ".1f"),
    ("llama tok/s", "llama_tok_s", ".1f"),
    ("ours/llama", "ratio_ours_llama", ".3f"),
    ("mem BW GB/s", "bandwidth_gbs", ".2f"),
    ("floor tok/s", "floor_tok_s", ".1f"),
    ("ours GB/s (%BW)", "ours_gbs", "s"),
    ("llama GB/s (%BW)", "llama_gbs", "s"),
    ("ours CPUs", "ours_cpu_util", ".2f"),
    ("llama CPUs", "llama_cpu_util", ".2f"),
    ("others' CPUs", "others_cpu", ".2f"),
]


def table_row(r: dict, bpt: int) -> dict:
    """``r`` with the table's derived cells: the floor speed and achieved bandwidths."""
    bw = r["bandwidth_gbs"]
    out = {**r, "floor_tok_s": bw * 1e9 / bpt}
    for key in ("ours", "llama"):
        g = r.get(f"{key}_achieved_gbs")
        out[f"{key}_gbs"] = None if g is None else f"{g:.2f} ({100 * g / bw:.0f}%)"
    others = [r[f"{k}_others_cpu_util"] for k in ("ours", "llama") if f"{k}_others_cpu_util" in r]
    out["others_cpu"] = max(others) if others else None
    return out


def print_table(rep: dict) -> None:
    syn = " (synthetic)" if rep["synthetic"] else ""
    bpt = rep["weights"]["per_token"]
    print(f"\nDecode speed{syn}: {rep['label']}, {bpt / 1e6:.2f} MB weights read per token")
    print(markdown_table([table_row(r, bpt) for r in rep["results"]], COLUMNS))
    busy = [
        f"threads={r['threads']} {k}: others used {r.get(k + '_others_cpu_util', 0):.2f} CPUs"
        for r in rep["results"]
        for k in ("ours", "llama")
        if k + "_cpu_util" in r
        and looks_busy(r.get(k + "_others_cpu_util"), r[k + "_cpu_util"], r["threads"])
    ]
    if busy:
        print(
            "WARNING: the machine looks busy (other processes took CPU time): "
            + "; ".join(busy)
            + " - these figures are unreliable, run again on an idle machine"
        )
    methods = sorted({r["bandwidth_method"] for r in rep["results"]})
    print("CPUs: process CPU s / wall s (expect ~threads; more = someone spins while idle);")
    print("others' CPUs: CPU-seconds per wall-second other processes used during the runs")
    print(f"mem BW: best pass of a read-only sweep ({'; '.join(methods)})")
    print("floor tok/s = mem BW / bytes per token (all weights streamed once per token)")
    obpts = {r.get("ours_bytes_per_token") for r in rep["results"]} - {None}
    for obpt in obpts:
        if abs(obpt - bpt) > 1e-3 * bpt:
            print(
                f"note: the engine reports {obpt / 1e6:.2f} MB/token (GGUF count {bpt / 1e6:.2f})"
            )
    for r in rep["results"]:
        if "ours_prefill_tok_s" in r or "llama_prefill_tok_s" in r:
            print(
                f"prefill (threads {r['threads']}): ours {fmt(r.get('ours_prefill_tok_s'))} tok/s, "
                f"llama.cpp {fmt(r.get('llama_prefill_tok_s'))} tok/s, ours/llama "
                f"{fmt(r.get('prefill_ratio_ours_llama'), '.3f')}"
            )
    for r in rep["results"]:
        for key in ("ours", "llama"):
            if r.get(f"{key}_error"):
                print(f"threads={r['threads']}: {key} not run: {r[f'{key}_error']}")


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--model",
        help="GGUF file (default: SmolLM2-135M-Instruct Q4_1: "
        "$POWERINFER_RS_TEST_MODEL, /tmp/smol/..., or the package's cached copy)",
    )
    ap.add_argument(
        "--synthetic",
        type=str.upper,
        choices=[
            *("F16", "F32", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"),
            *("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"),
            *("IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0", "NVFP4", "Q1_0"),
            *GGML_WRITTEN,
        ],
        help="use a synthetic llama (dim 2048, ffn 5504, 8 layers, 16/16 heads, "
        "vocab 32000) of this dtype, written once into --cache (K-quants, IQ4_XS, TQ*: ffn_down, "
        "whose rows of 5504 are not whole super-blocks, takes llama.cpp's 32-weight fallback; "
        "the lattice IQ2_XXS..IQ1_M: dim 1024, ffn 2816, 4 layers, 8/8 heads, vocab 4096, every "
        "matrix in the format, by llama.cpp's quantizer functions, as is Q2_0 at dim 2048)",
    )
    ap.add_argument(
        "--activation",
        default="silu",
        choices=["silu", "relu"],
        help="FFN activation of the synthetic model (default silu, what llama.cpp runs)",
    )
    add_synthetic_args(ap)
    ap.add_argument(
        "--threads",
        type=int_list,
        default=[1, 2],
        help="comma-separated thread counts (default 1,2)",
    )
    ap.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="tokens decoded per run (default 128; 32 with --synthetic)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per engine (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per engine first")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    ap.add_argument("--n-ctx", type=int, default=1024, help="context size of both engines")
    ap.add_argument("--only", choices=["ours", "llama"], help="run one engine only")
    add_bandwidth_args(ap)
    ap.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="also race a prefill of N tokens (fixed pseudo-random ids, one batched pass on an "
        "empty context; llama.cpp with n_batch = n_ubatch = 512), e.g. 512",
    )
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")

    rep = run(args)
    print_table(rep)
    write_json(args.json, rep)
    ok = any(k.endswith("_tok_s") for r in rep["results"] for k in r)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
