#!/usr/bin/env python3
"""Decode speed of the FFN sparsity modes, dense vs exact-relu vs threshold (vs predictor),
measured side by side in one run.

(a) A synthetic ReLU llama (default dim 2048, ffn 5504, 8 layers, vocab 32000, ~10 % of FFN
    neurons active, planted power law; F16 and Q4_0; written once into --cache by
    ``powerinfer_rs.testing.synth.write_gguf_model``). Every figure from it is labelled "synthetic".
    Printed: tokens/s per mode, the measured speed-up of exact-relu over dense, and the ideal
    speed-up = dense weight bytes per token / exact-relu weight bytes per token, where
    exact-relu reads all of attention, the gate and the output head but only the active rows
    of up and down_t (the active fraction per layer comes from a profile run over the same
    decode); achieved bandwidth = the mode's bytes per token x tokens/s, set against the read
    bandwidth ``_core.measure_read_bandwidth`` measures in the same run with the same threads.
    Threshold mode runs on thresholds calibrated in-process (random token ids, synthetic) to
    --synthetic-threshold sparsity; predictor mode with --predictors P (a file made for this
    synthetic model) or --train-predictors (profile + train in-process; slow at full size).
(b) SmolLM2-135M (real, SiLU): threshold mode at 30/50/70 % FFN sparsity, thresholds
    calibrated in-process on held-out prose (python3.11-doc, see corpus.py), perplexity dense
    vs threshold on the next, unseen part of that prose, and decode tokens/s ratio vs dense.

Every mode of one model runs on one Engine (``set_sparsity`` between runs), warmed up, then
the modes decode alternately (rotating order) --repeats times each; tables show medians.
Decode time = the engine's own ``last_stats.decode_seconds`` (single-token steps after the
prompt, greedy sampling in Python included).

Examples::

    python benchmarks/bench_sparse.py --threads 2 --json /tmp/sparse.json
    python benchmarks/bench_sparse.py --only synthetic --dtypes q4_0 --tokens 64
    python benchmarks/bench_sparse.py --only smol --calib-tokens 4096 --ppl-tokens 2048
    python benchmarks/bench_sparse.py --shape 512,1376,2,4096 --tokens 8 --repeats 1  # smoke
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    machine_info,
    measure_bandwidth,
    median,
    require_powerinfer,
    synthetic_gguf,
    write_json,
)
from _sparse_parts import (  # noqa: E402
    decode_activity,
    ffn_bytes,
    print_report,
    race_modes,
    sparse_bytes_per_token,
)
from _sparse_smol import bench_smol, load_or_train_predictors  # noqa: E402

DEFAULT_PROMPT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg"
)
DEFAULT_SHAPE = (2048, 5504, 8, 32000)


def _pi():
    try:
        return require_powerinfer()
    except RuntimeError as e:
        raise SystemExit(str(e)) from None


# ---------------------------------------------------------------------------------------------
# models and byte accounting


def synthetic_relu_model(dtype: str, shape: tuple[int, int, int, int], cache: Path, seed: int):
    """Create (once) and return the synthetic ReLU GGUF of ``dtype``."""
    dim, ffn, layers, vocab = shape
    heads = max(1, dim // 128)
    s = dict(dim=dim, ffn=ffn, layers=layers, heads=heads, kv_heads=heads, vocab=vocab)
    return synthetic_gguf(cache, dtype, s, seed=seed, tag="-g64")


# ---------------------------------------------------------------------------------------------
# (a) synthetic ReLU


def bench_synthetic(args, dtype: str) -> dict[str, Any]:
    pi = _pi()
    from powerinfer_rs.stages.calibrate import calibrate_thresholds
    from powerinfer_rs.stages.evaluate import predictor_quality

    path = synthetic_relu_model(dtype, args.shape, Path(args.cache), args.seed)
    eng = pi.Engine.from_pretrained(str(path), threads=args.threads, n_ctx=args.n_ctx)
    rng = np.random.default_rng(0)
    vocab = eng.config.vocab_size
    prompt = [int(i) for i in rng.integers(3, vocab, 16)]
    calib = [int(i) for i in rng.integers(3, vocab, args.synthetic_calib_tokens)]
    dense_b = int(eng.bytes_per_token)
    layers = ffn_bytes(eng)
    rep: dict[str, Any] = {
        "model": str(path),
        "label": f"synthetic {dtype.upper()} ReLU llama dim/ffn/layers/vocab {args.shape}",
        "synthetic": True,
        "dense_bytes_per_token": dense_b,
    }
    print(f"\n== {rep['label']} (synthetic) ==", flush=True)

    active = decode_activity(eng, prompt, args.tokens)
    rep["active_fraction"] = float(np.mean(active))
    relu_b = sparse_bytes_per_token(dense_b, layers, active)
    thr, _ = calibrate_thresholds(
        eng, calib, args.synthetic_threshold, window=256, progress=not args.quiet
    )
    thr_active = decode_activity(eng, prompt, args.tokens, thresholds=thr)
    modes = {
        "dense": {"mode": "dense"},
        "exact-relu": {"mode": "exact-relu"},
        "threshold": {"mode": "threshold", "thresholds": thr},
    }
    bpt = {
        "dense": dense_b,
        "exact-relu": relu_b,
        "threshold": sparse_bytes_per_token(dense_b, layers, thr_active, up_sparse=False),
    }
    pset = load_or_train_predictors(args, eng, path, calib)
    if pset is not None:
        modes["predictor"] = {"mode": "predictor", "predictors": pset}
        q = predictor_quality(eng, prompt + calib[: args.tokens], pset, progress=False)
        pred_frac = [r["predicted_fraction"] for r in q]
        pb = sum(4 * p.rank * (p.dim + p.ffn) for p in pset.layers.values())  # F32 in the engine
        bpt["predictor"] = sparse_bytes_per_token(dense_b, layers, pred_frac, gate_sparse=True) + pb
        rep["predictor"] = {
            "recall": [r["recall"] for r in q],
            "predicted_fraction": float(np.mean(pred_frac)),
            "predictor_bytes_f32": pb,
        }
    bw = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)[0]
    samples = race_modes(eng, modes, prompt, args.tokens, args.repeats, args.warmup)
    bw2 = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)[0]
    rep["bandwidth_gbs"] = max(bw, bw2)
    rep["modes"] = {}
    for label, xs in samples.items():
        tps = median(xs)
        rep["modes"][label] = {
            "tok_s": tps,
            "samples": xs,
            "bytes_per_token": bpt[label],
            "achieved_gbs": bpt[label] * tps / 1e9,
        }
    d = rep["modes"]["dense"]["tok_s"]
    rep["speedup_exact_relu"] = rep["modes"]["exact-relu"]["tok_s"] / d
    rep["ideal_speedup_exact_relu"] = dense_b / relu_b
    rep["speedup_share_of_ideal"] = rep["speedup_exact_relu"] / rep["ideal_speedup_exact_relu"]
    if "predictor" in samples:
        rep["speedup_predictor_over_exact_relu"] = (
            rep["modes"]["predictor"]["tok_s"] / rep["modes"]["exact-relu"]["tok_s"]
        )
        rep["ideal_predictor_over_exact_relu"] = relu_b / bpt["predictor"]
    eng = None
    return rep


# ---------------------------------------------------------------------------------------------
# (b) SmolLM2 threshold mode


def parse_list(kind):
    def f(s: str):
        try:
            out = [kind(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad list {s!r}") from None
        if not out:
            raise argparse.ArgumentTypeError("empty list")
        return out

    return f


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--only", choices=["synthetic", "smol"], help="run one part only (default both)"
    )
    ap.add_argument("--threads", type=int, default=2, help="engine threads (default 2)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per run (default 64)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per mode first")
    ap.add_argument("--n-ctx", type=int, default=1024, help="context size (default 1024)")
    ap.add_argument(
        "--dtypes",
        type=parse_list(str.upper),
        default=["F16", "Q4_0"],
        help="synthetic model dtypes, comma-separated (default F16,Q4_0)",
    )
    ap.add_argument(
        "--shape",
        type=parse_list(int),
        default=list(DEFAULT_SHAPE),
        help="synthetic DIM,FFN,LAYERS,VOCAB (default 2048,5504,8,32000; heads = dim/128)",
    )
    add_synthetic_args(ap)
    ap.add_argument(
        "--synthetic-threshold",
        type=float,
        default=0.9,
        help="target sparsity of the synthetic model's threshold mode (default 0.9)",
    )
    ap.add_argument(
        "--synthetic-calib-tokens",
        type=int,
        default=4096,
        help="random token ids the synthetic thresholds (and --train-predictors) use",
    )
    ap.add_argument(
        "--predictors",
        help="predictor file for the synthetic model (adds predictor mode where its "
        "fingerprint matches)",
    )
    ap.add_argument(
        "--train-predictors",
        action="store_true",
        help="profile and train predictors for each synthetic model in-process (slow)",
    )
    ap.add_argument("--model", help="GGUF for part (b) (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument(
        "--sparsities",
        type=parse_list(float),
        default=[0.3, 0.5, 0.7],
        help="threshold-mode target sparsities for part (b) (default 0.3,0.5,0.7)",
    )
    ap.add_argument(
        "--calib-tokens", type=int, default=4096, help="(b) calibration tokens (default 4096)"
    )
    ap.add_argument(
        "--ppl-tokens", type=int, default=2048, help="(b) held-out perplexity tokens (2048)"
    )
    ap.add_argument("--window", type=int, default=256, help="(b) window of calibration/ppl")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="(b) prompt text")
    add_bandwidth_args(ap)
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if len(args.shape) != 4:
        ap.error("--shape takes DIM,FFN,LAYERS,VOCAB")
    args.shape = tuple(args.shape)
    if args.repeats < 1 or args.tokens < 1:
        ap.error("--repeats and --tokens must be >= 1")

    mi = machine_info()
    print(f"machine: {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    runs = []
    if args.only in (None, "synthetic"):
        for dt in args.dtypes:
            runs.append(bench_synthetic(args, dt))
    if args.only in (None, "smol"):
        runs.append(bench_smol(args))
    rep = {
        "threads": args.threads,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "machine": mi,
        "runs": runs,
    }
    print_report(rep)
    write_json(args.json, rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
