#!/usr/bin/env python3
"""Mixture-of-experts decode and prefill: powerinfer-rs against llama.cpp on the same GGUF, side
by side in one run (synthetic Qwen3-MoE, quantized by llama.cpp's own quantizer).

The model is a synthetic Qwen3-MoE (random weights, llama.cpp's converter keys) of realistic
ratios scaled to this machine: by default dim 1024, 8 layers, 64 experts of width 512 (half of
dim), top-8, 16 query heads over 4 KV heads, vocabulary 32000. It is written once as F16 and
quantized by llama.cpp (``llama_cpp.llama_model_quantize``) to each ``--formats`` entry
(Q4_K_M = llama.cpp's ftype 15, Q4_0 = 2); everything measured on it is "synthetic".

For each file both engines load it with the same thread count, warm up, then alternate
(ours, llama, llama, ours, ...) ``--repeats`` times: decode tokens/s (the single-token steps
after the prompt, greedy) and prefill tokens/s (one batched pass over ``--prefill`` token ids
on an empty context). Medians and the ratio ours/llama.cpp are reported, with the weight bytes
one token reads (the router, ``n_expert_used`` experts and attention per layer, one embedding
row, the head: ``Engine.bytes_per_token``) and the machine's read bandwidth measured in the
same run (floor = bandwidth / bytes per token).

With ``--smallthinker``: a synthetic SmallThinker (ReGLU experts with a planted activation law,
``--st-active`` of each expert's neurons firing on average; by default 32 experts of width
1024, top-4), quantized by llama.cpp to ``--st-format``, decoded by our dense and our
exact-relu modes alternately. The ideal ratio counts the bytes exact-relu skips: the up and
down_t rows of the routed experts' neurons that do not fire (the share measured by a profile
run over the same tokens). With ``--st-predictor-tokens N`` also predictor mode inside the
experts: a profile of N random tokens with samples, predictors trained per expert and kept
where they pay (the trainer's table is printed), raced against exact-relu in the same rounds.

Examples::

    python benchmarks/bench_moe.py                          # Q4_K_M and Q4_0, 2 threads
    python benchmarks/bench_moe.py --formats Q4_K_M --repeats 7 --json /tmp/moe.json
    python benchmarks/bench_moe.py --experts 128 --expert-ffn 384 --layers 6
    python benchmarks/bench_moe.py --formats --smallthinker  # exact-relu vs dense only
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    import_llama,
    machine_info,
    measure_bandwidth,
    median,
    require_powerinfer,
    write_json,
)
from _decode_engines import LlamaCpp, Ours  # noqa: E402

#: llama.cpp's llama_ftype of each format the quantizer is asked for.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def synthetic_f16(args, arch: str = "qwen3moe") -> Path:
    """The synthetic Qwen3-MoE (or SmallThinker) F16 file, written once into ``args.cache``."""
    require_powerinfer()
    from powerinfer_rs.testing.synth import write_gguf_model

    shape = dict(
        dim=args.dim,
        ffn=3 * args.dim,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        vocab=args.vocab,
        activation="silu",
        arch=arch,
        experts=args.experts,
        experts_used=args.experts_used,
        expert_ffn=args.expert_ffn,
        max_context=4096,
        seed=args.seed,
    )
    if arch == "smallthinker":  # ReGLU experts with a planted activation law; no window
        shape.update(
            activation="relu",
            ffn=args.st_expert_ffn,
            expert_ffn=0,
            experts=args.st_experts,
            experts_used=args.st_experts_used,
            active=args.st_active,
        )
        if args.st_gate_rank is not None:
            shape["gate_rank"] = args.st_gate_rank
    tag = "-".join(f"{k}{v}" for k, v in shape.items() if k not in ("activation", "arch"))
    path = Path(args.cache) / f"synthetic-{arch}-f16-{tag}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        tmp = path.with_suffix(".part.gguf")
        write_gguf_model(tmp, dtype="F16", **shape)
        os.replace(tmp, path)
        print(f"  done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def quantized(f16: Path, fmt: str, threads: int) -> Path:
    """``f16`` quantized to ``fmt`` by llama.cpp's quantizer (once)."""
    out = f16.with_name(f16.name.replace("-f16-", f"-{fmt.lower()}-"))
    if out.is_file():
        return out
    llama_cpp, why = import_llama()
    if llama_cpp is None:
        raise SystemExit(f"llama-cpp-python is needed to quantize: {why}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[fmt]
    params.nthread = threads
    print(f"quantizing to {fmt} with llama.cpp ...", file=sys.stderr, flush=True)
    tmp = out.with_suffix(".part.gguf")
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    os.replace(tmp, out)
    return out


def race(args, path: Path, threads: int) -> dict:
    """Decode and prefill of both engines on ``path``, alternating ABBA."""
    n_ctx = max(512, args.prefill + args.tokens + 64)
    engines = {"ours": Ours(path, threads, n_ctx), "llama": LlamaCpp(path, threads, n_ctx)}
    rng = np.random.default_rng(args.seed)
    vocab = engines["llama"].n_vocab
    prompt = [int(t) for t in rng.integers(100, vocab - 100, 16)]
    batch = [int(t) for t in rng.integers(100, vocab - 100, args.prefill)]
    row: dict = {"file": str(path), "threads": threads, "tokens": args.tokens}
    row["ours_bytes_per_token"] = engines["ours"].bytes_per_token()
    # Same greedy tokens on both sides (a check that both run the same model).
    steps = engines["ours"].eng.stream_tokens(
        prompt, max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True
    )
    ours_toks = [s.token for s in steps if s.token is not None]
    row["greedy_agree"] = ours_toks == engines["llama"].greedy_ids(prompt, 8)
    for e in engines.values():
        e.decode(prompt, 8)
        if batch:
            e.prefill(batch[:16])
    dec = {k: [] for k in engines}
    pre = {k: [] for k in engines}
    order = list(engines)
    for r in range(args.repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            n, secs = engines[key].decode(prompt, args.tokens)
            dec[key].append(n / secs)
            if args.prefill:
                pre[key].append(args.prefill / engines[key].prefill(batch))
    for key in engines:
        row[f"{key}_tok_s"] = median(dec[key])
        row[f"{key}_samples"] = dec[key]
        if args.prefill:
            row[f"{key}_prefill_tok_s"] = median(pre[key])
            row[f"{key}_prefill_samples"] = pre[key]
    row["ratio"] = row["ours_tok_s"] / row["llama_tok_s"]
    if args.prefill:
        row["prefill_ratio"] = row["ours_prefill_tok_s"] / row["llama_prefill_tok_s"]
    for e in engines.values():
        e.close()
    return row


def expert_bytes(loaded, layer: int) -> tuple[int, int, int]:
    """Bytes of one expert's gate, up and down in ``layer`` of a loaded model."""
    n = loaded.config.n_expert
    t = loaded.tensors
    return tuple(
        int(t[f"blk.{layer}.ffn_{k}_exps"].data.nbytes) // n for k in ("gate", "up", "down")
    )


def race_exact_relu(args, path: Path, threads: int) -> dict:
    """Our dense against our exact-relu decode on a ReGLU-expert file (alternating), with the
    ideal speed-up from bytes: the active share inside routed experts comes from a profile run
    over the same prompt and tokens."""
    pi = require_powerinfer()
    from powerinfer_rs.loading import load_model

    loaded = load_model(path)
    c = loaded.config
    n_ctx = max(512, args.tokens + 64)
    dense = pi.Engine(loaded, threads=threads, n_ctx=n_ctx)
    relu = pi.Engine(loaded, threads=threads, n_ctx=n_ctx, sparsity="exact-relu")
    rng = np.random.default_rng(args.seed)
    prompt = [int(t) for t in rng.integers(100, c.vocab_size - 100, 16)]
    seq = list(prompt)  # the greedy continuation the timed runs decode
    logits = dense.prefill(prompt)
    for _ in range(args.tokens):
        seq.append(int(np.argmax(logits)))
        logits = dense.prefill([seq[-1]])
    dense.reset()
    dense.start_profiling()
    dense.prefill(seq)
    counts, tokens = dense.profile_counts()
    routed = dense.profile_expert_counts()
    dense.stop_profiling()
    ef = c.expert_ffn_dim or c.ffn_dim
    active = float(counts.sum() / max(1, routed.sum() * ef))
    full = dense._model.bytes_per_token
    saved = 0.0
    for layer in range(c.n_layers):
        g, u, d = expert_bytes(loaded, layer)
        saved += c.n_expert_used * (1.0 - active) * (u + d)
    ideal = full / (full - saved)
    rates = {"dense": [], "exact-relu": []}
    engines = {"dense": dense, "exact-relu": relu}
    trained = None
    if args.st_predictor_tokens:
        trained = expert_predictors(args, loaded, path, threads)
        engines["predictor"] = pi.Engine(
            loaded, threads=threads, n_ctx=n_ctx, sparsity="predictor", predictors=trained["file"]
        )
        rates["predictor"] = []
    for e in engines.values():
        e.generate(prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    order = list(engines)
    for r in range(args.repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            eng = engines[key]
            eng.reset()
            eng.generate(
                prompt, max_new_tokens=args.tokens + 1, temperature=0.0, seed=0, ignore_eos=True
            )
            st = eng.last_stats
            rates[key].append(st.decode_tokens / st.decode_seconds)
    row = {
        "file": str(path),
        "active_in_routed_experts": active,
        "bytes_dense": full,
        "bytes_exact_relu": full - saved,
        "ideal_speedup": ideal,
        "dense_tok_s": median(rates["dense"]),
        "relu_tok_s": median(rates["exact-relu"]),
        "dense_samples": rates["dense"],
        "relu_samples": rates["exact-relu"],
    }
    if trained is not None:
        row["predictor"] = trained["summary"]
        row["predictor_tok_s"] = median(rates["predictor"])
        row["predictor_samples"] = rates["predictor"]
        row["predictor_vs_relu"] = row["predictor_tok_s"] / row["relu_tok_s"]
        # The ideal from bytes: per layer, k routed experts each saving the kept predictors'
        # mean (without - with) on held-out samples (experts without one save nothing).
        saved_pred = 0.0
        per_layer = trained["saved_per_expert"]
        for layer in range(c.n_layers):
            saved_pred += c.n_expert_used * per_layer.get(layer, 0.0)
        relu_bytes = full - saved
        row["predictor_ideal_vs_relu"] = relu_bytes / (relu_bytes - saved_pred)
    row["speedup"] = row["relu_tok_s"] / row["dense_tok_s"]
    row["share_of_ideal"] = (row["speedup"] - 1) / (ideal - 1) if ideal > 1 else None
    row["ratio_of_ideal"] = row["speedup"] / ideal
    return row


def expert_predictors(args, loaded, path: Path, threads: int) -> dict:
    """Predictors per expert for ``path``: a dense profile over ``--st-predictor-tokens``
    random token ids (windows of 256) with samples, then the trainer, which keeps an expert's
    predictor only where it pays (cached next to the model)."""
    pi = require_powerinfer()
    from powerinfer_rs.predictors import TrainConfig, format_table, train_predictors
    from powerinfer_rs.stages.profile import profile_model

    out = path.with_name(path.stem + f"-pred{args.st_predictor_tokens}.safetensors")
    prof = path.with_name(path.stem + f"-prof{args.st_predictor_tokens}")
    if not out.is_file():
        eng = pi.Engine(loaded, threads=threads, n_ctx=256)
        rng = np.random.default_rng(args.seed + 1)
        ids = [
            int(t)
            for t in rng.integers(100, loaded.config.vocab_size - 100, args.st_predictor_tokens)
        ]
        t0 = time.perf_counter()
        profile_model(eng, ids, window=256, samples_to=prof, progress=True)
        print(f"  profiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        t0 = time.perf_counter()
        train_predictors(
            prof,
            out,
            model=loaded,
            config=TrainConfig(),
            progress=True,
            log=lambda s: print(s, file=sys.stderr),
        )
        print(f"  trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    from powerinfer_rs.formats.predictors import load_predictors

    pset = load_predictors(out)
    table = format_table(pset)
    print(table)
    kept = list(pset.experts.values())
    summary = {
        "tokens": args.st_predictor_tokens,
        "experts_kept": len(kept),
        "experts": loaded.config.n_layers * loaded.config.n_expert,
        "mean_precision": float(np.mean([p.stats["precision"] for p in kept])) if kept else None,
        "mean_recall": float(np.mean([p.stats["recall"] for p in kept])) if kept else None,
        "read_with_over_without": (
            sum(p.stats["bytes_with"] for p in kept) / sum(p.stats["bytes_without"] for p in kept)
            if kept
            else None
        ),
        "table": table,
    }
    n_expert = loaded.config.n_expert
    saved: dict[int, float] = {}
    for (layer, _e), p in pset.experts.items():
        gain = p.stats["bytes_without"] - p.stats["bytes_with"]
        saved[layer] = saved.get(layer, 0.0) + gain / n_expert
    return {"file": str(out), "summary": summary, "saved_per_expert": saved}


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--formats", nargs="*", default=["Q4_K_M", "Q4_0"], choices=list(FTYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--prefill", type=int, default=128, help="prefill tokens (0: skip)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--experts-used", type=int, default=8)
    ap.add_argument("--expert-ffn", type=int, default=512)
    ap.add_argument(
        "--smallthinker",
        action="store_true",
        help="also a synthetic SmallThinker (ReGLU experts): exact-relu against dense, ours",
    )
    ap.add_argument("--st-experts", type=int, default=32)
    ap.add_argument("--st-experts-used", type=int, default=4)
    ap.add_argument("--st-expert-ffn", type=int, default=1024)
    ap.add_argument(
        "--st-active", type=float, default=0.3, help="planted share of expert neurons firing"
    )
    ap.add_argument("--st-format", default="Q4_0", choices=list(FTYPES))
    ap.add_argument(
        "--st-gate-rank",
        type=int,
        default=None,
        help="rank of the planted low-rank gate structure that makes the SmallThinker's "
        "activity predictable (default: the synthetic writer's, 64)",
    )
    ap.add_argument(
        "--st-predictor-tokens",
        type=int,
        default=0,
        help="also predictor mode inside the SmallThinker's experts: profile this many tokens "
        "with samples, train predictors per expert (kept where they pay), race them against "
        "exact-relu (0: skip)",
    )
    ap.add_argument("--json", default=None)
    add_synthetic_args(ap)
    add_bandwidth_args(ap)
    args = ap.parse_args(argv)
    mi = machine_info()
    print(f"machine: {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    f16 = synthetic_f16(args) if args.formats else None
    bw, how = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)
    print(f"read bandwidth: {bw:.1f} GB/s ({how})")
    print("NOTE: synthetic model (random weights): every figure here is 'synthetic'.\n")
    rows = []
    for fmt in args.formats:
        assert f16 is not None
        path = quantized(f16, fmt, args.threads)
        row = race(args, path, args.threads)
        row["format"] = fmt
        bpt = row["ours_bytes_per_token"] or 0
        row["floor_tok_s"] = bw * 1e9 / bpt if bpt else None
        rows.append(row)
        print(
            f"{fmt}: decode ours {row['ours_tok_s']:.1f} vs llama.cpp {row['llama_tok_s']:.1f} "
            f"tok/s = {row['ratio']:.2f}x; prefill {args.prefill}: "
            f"{row.get('ours_prefill_tok_s', 0):.0f} vs {row.get('llama_prefill_tok_s', 0):.0f} "
            f"tok/s = {row.get('prefill_ratio', 0):.2f}x; {bpt / 1e6:.1f} MB/token, floor "
            f"{row['floor_tok_s'] or 0:.0f} tok/s; greedy tokens agree: {row['greedy_agree']}",
            flush=True,
        )
        print("  samples ours", " ".join(f"{x:.1f}" for x in row["ours_samples"]))
        print("  samples llama", " ".join(f"{x:.1f}" for x in row["llama_samples"]))
    st = None
    if args.smallthinker:
        st_path = quantized(synthetic_f16(args, "smallthinker"), args.st_format, args.threads)
        st = race_exact_relu(args, st_path, args.threads)
        print(
            f"SmallThinker {args.st_format}: dense {st['dense_tok_s']:.1f} vs exact-relu "
            f"{st['relu_tok_s']:.1f} tok/s = {st['speedup']:.2f}x; ideal from bytes "
            f"{st['ideal_speedup']:.2f}x ({st['active_in_routed_experts']:.3f} of routed "
            f"experts' neurons fire) -> {100 * st['ratio_of_ideal']:.0f}% of the ideal ratio",
            flush=True,
        )
        print("  samples dense", " ".join(f"{x:.1f}" for x in st["dense_samples"]))
        print("  samples exact-relu", " ".join(f"{x:.1f}" for x in st["relu_samples"]))
        if "predictor" in st:
            pr = st["predictor"]
            ratio = pr["read_with_over_without"]
            print(
                f"  predictor per expert ({pr['experts_kept']} of {pr['experts']} experts kept, "
                f"trained on {pr['tokens']} profiled tokens): {st['predictor_tok_s']:.1f} tok/s "
                f"= {st['predictor_vs_relu']:.2f}x exact-relu (ideal from bytes "
                f"{st['predictor_ideal_vs_relu']:.3f}x); "
                + (
                    f"where kept, a routed token reads {ratio:.3f}x the bytes"
                    if ratio is not None
                    else "none paid: every expert ran exact-relu"
                ),
                flush=True,
            )
            print("  samples predictor", " ".join(f"{x:.1f}" for x in st["predictor_samples"]))
    report = {"machine": mi, "bandwidth_gbs": bw, "args": vars(args), "rows": rows}
    report["smallthinker"] = st
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
