"""bench_moe.py's synthetic SmallThinker (ReGLU experts): our dense, exact-relu and (optionally)
per-expert predictor decode raced on one file, with the ideal speed-ups from bytes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from _bench_common import (
    decode_rate,
    median,
    race,
    require_powerinfer,
)


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
    full = dense.bytes_per_token
    saved = 0.0
    for layer in range(c.n_layers):
        g, u, d = expert_bytes(loaded, layer)
        saved += c.n_expert_used * (1.0 - active) * (u + d)
    ideal = full / (full - saved)
    engines = {"dense": dense, "exact-relu": relu}
    trained = None
    if args.st_predictor_tokens:
        trained = expert_predictors(args, loaded, path, threads)
        engines["predictor"] = pi.Engine(
            loaded, threads=threads, n_ctx=n_ctx, sparsity="predictor", predictors=trained["file"]
        )
    for e in engines.values():
        e.generate(prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    runs = race(
        {k: (lambda e=e: decode_rate(e, prompt, args.tokens)) for k, e in engines.items()},
        args.repeats,
    )
    rates = {k: [r.value for r in rs] for k, rs in runs.items()}
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


def print_smallthinker(st: dict, fmt: str) -> None:
    """The SmallThinker race's lines: dense against exact-relu (and predictor), samples."""
    print(
        f"SmallThinker {fmt}: dense {st['dense_tok_s']:.1f} vs exact-relu "
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
