"""bench_sparse.py's real-model part: SmolLM2 (SiLU) in dense, threshold and predictor modes, with
its predictors trained once and cached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from _bench_common import (
    default_model,
    measure_bandwidth,
    median,
    require_powerinfer,
)
from _sparse_parts import (
    ffn_bytes,
    race_modes,
    sparse_bytes_per_token,
)


def load_or_train_predictors(args, eng, path: Path, calib: list[int]):
    if args.train_predictors:
        import tempfile

        from powerinfer_rs.loading import load_model
        from powerinfer_rs.predictors import train_predictors
        from powerinfer_rs.stages.profile import profile_model

        with tempfile.TemporaryDirectory() as d:
            profile_model(
                eng,
                calib,
                samples_to=d,
                sample_metadata={
                    "model_fingerprint": eng.loaded.fingerprint,
                    "predictor_input": "ffn_norm",
                },
                progress=not args.quiet,
            )
            return train_predictors(
                d, Path(d) / "p.safetensors", model=load_model(path), progress=not args.quiet
            )
    if args.predictors:
        from powerinfer_rs.formats.predictors import load_predictors

        pset = load_predictors(args.predictors)
        if pset.model_fingerprint and pset.model_fingerprint != eng.loaded.fingerprint:
            print(f"note: {args.predictors} is for another model; no predictor mode here")
            return None
        return pset
    return None


def bench_smol(args) -> dict[str, Any]:
    pi = require_powerinfer()
    from corpus import SOURCE_NAME, held_out_ids

    from powerinfer_rs.stages.calibrate import calibrate_thresholds, held_out_cost

    path = Path(args.model) if args.model else default_model()
    eng = pi.Engine.from_pretrained(str(path), threads=args.threads, n_ctx=args.n_ctx)
    need = args.calib_tokens + args.ppl_tokens
    ids = held_out_ids(eng.tokenizer, need)
    cal, held = ids[: args.calib_tokens], ids[args.calib_tokens : need]
    dense_b = int(eng.bytes_per_token)
    layers = ffn_bytes(eng)
    prompt = eng.tokenizer.encode(args.prompt)
    rep: dict[str, Any] = {
        "model": str(path),
        "label": f"{path.name} (real model, {eng.config.activation})",
        "synthetic": False,
        "text": SOURCE_NAME,
        "calibration_tokens": len(cal),
        "heldout_tokens": len(held),
        "dense_bytes_per_token": dense_b,
        "targets": {},
    }
    print(f"\n== {rep['label']}: threshold mode ==", flush=True)
    modes: dict[str, dict] = {"dense": {"mode": "dense"}}
    bpt = {"dense": dense_b}
    ppl_dense = None
    for s in args.sparsities:
        thr, _ = calibrate_thresholds(eng, cal, s, window=args.window, progress=not args.quiet)
        ho = held_out_cost(eng, held, thr, window=args.window, progress=not args.quiet)
        ppl_dense = ho.ppl_dense
        label = f"threshold@{s:.2f}"
        modes[label] = {"mode": "threshold", "thresholds": thr}
        act = [1.0 - x for x in ho.sparsity]
        bpt[label] = sparse_bytes_per_token(dense_b, layers, act, up_sparse=False)
        rep["targets"][label] = {
            "target_sparsity": s,
            "measured_sparsity": float(np.mean(ho.sparsity)),
            "perplexity": ho.ppl_threshold,
            "perplexity_change": ho.ppl_change,
        }
        print(
            f"  {label}: held-out perplexity {ho.ppl_threshold:.3f} vs dense "
            f"{ho.ppl_dense:.3f} ({100 * ho.ppl_change:+.2f}%), measured sparsity "
            f"{np.mean(ho.sparsity):.3f}",
            flush=True,
        )
    rep["perplexity_dense"] = ppl_dense
    bw = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)[0]
    samples = race_modes(eng, modes, prompt, args.tokens, args.repeats, args.warmup)
    bw2 = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)[0]
    rep["bandwidth_gbs"] = max(bw, bw2)
    rep["modes"] = {}
    d = median(samples["dense"])
    for label, xs in samples.items():
        tps = median(xs)
        rep["modes"][label] = {
            "tok_s": tps,
            "samples": xs,
            "ratio_vs_dense": tps / d,
            "bytes_per_token": bpt[label],
            "ideal_ratio_vs_dense": dense_b / bpt[label],
            "achieved_gbs": bpt[label] * tps / 1e9,
        }
    return rep
