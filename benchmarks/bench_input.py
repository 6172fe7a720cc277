"""Input sparsity (``sparsity="input"``, TEAL/WINA) against dense decoding: perplexity cost and
decode speed at several shares of projection inputs skipped.

(a) SmolLM2-135M-Instruct Q4_1 (real model): per share, thresholds calibrated on the first part
of held-out prose (python3.11-doc, see corpus.py), held-out perplexity on the text after it
(never seen by calibration), the shares each site dropped there, and decode tokens/s against
dense in alternating runs in this one process. (b) A synthetic SiLU llama of about 1B weights
(dim 2048, ffn 5632, 16 layers, vocab 32000; synthetic: only the speed means anything),
thresholds calibrated on random token ids. Both report the ideal speed-up from bytes: the
dense bytes of a token over those left when each site's matrices are read only for the inputs
kept (the measured shares).

Examples::

    python benchmarks/bench_input.py                      # both parts, 2 threads
    python benchmarks/bench_input.py --skip-synthetic --shares 0.25,0.4 --score wina
    python benchmarks/bench_input.py --allocation greedy --json input.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_synthetic_args,
    bench_parser,
    default_model,
    machine_info,
    median,
    require_powerinfer,
    synthetic_gguf,
    write_json,
)
from _sparse_parts import race_modes  # noqa: E402

PROMPT = "The history of the printing press begins in the fifteenth century, when Johannes"
SYNTH_SHAPE = dict(dim=2048, ffn=5632, layers=16, heads=16, kv_heads=16, vocab=32000)


def ideal_ratio(engine, dropped: list[list[float]]) -> float:
    """Dense bytes per token over the bytes left when each site's matrices are read only for
    the kept inputs (``dropped``: per layer and site, the share skipped)."""
    from powerinfer_rs.stages.calibrate_input import site_bytes

    dense = float(engine.bytes_per_token)
    saved = float((site_bytes(engine) * np.asarray(dropped)).sum())
    return dense / (dense - saved)


def bench(
    engine, label: str, cal, held, args, *, synthetic: bool, prompt: list[int]
) -> dict[str, Any]:
    from powerinfer_rs.stages.calibrate_input import calibrate_input, held_out_input_cost

    rep: dict[str, Any] = {"label": label, "synthetic": synthetic, "levels": {}}
    modes: dict[str, dict] = {"dense": {"mode": "dense"}}
    ppl_dense = None
    for share in args.shares:
        c = calibrate_input(
            engine,
            cal,
            share,
            score=args.score,
            allocation=args.allocation,
            output=args.output_head,
            window=args.window,
            progress=not args.quiet,
        )
        ho = held_out_input_cost(
            engine, held, c.thresholds, window=args.window, progress=False, ppl_dense=ppl_dense
        )
        ppl_dense = ho.ppl_dense
        key = f"input@{share:.2f}"
        modes[key] = {"mode": "input", "thresholds": c.thresholds}
        rep["levels"][key] = {
            "target": share,
            "dropped_mean": float(np.mean(ho.dropped)),
            "dropped_by_site": np.mean(ho.dropped, axis=0).tolist(),
            "perplexity": ho.ppl_input,
            "perplexity_change": ho.ppl_change,
            "ideal_ratio": ideal_ratio(engine, ho.dropped),
        }
        print(
            f"  {key}: held-out perplexity {ho.ppl_input:.3f} vs dense {ho.ppl_dense:.3f} "
            f"({100 * ho.ppl_change:+.2f}%), skipped {np.mean(ho.dropped):.3f}",
            flush=True,
        )
    rep["perplexity_dense"] = ppl_dense
    samples = race_modes(engine, modes, prompt, args.tokens, args.repeats, 1)
    d = median(samples["dense"])
    rep["dense_tok_s"] = d
    for key, lv in rep["levels"].items():
        tps = median(samples[key])
        lv.update(tok_s=tps, samples=samples[key], ratio=tps / d)
        lv["share_of_ideal"] = lv["ratio"] / lv["ideal_ratio"]
    rep["input_copies_bytes"] = engine.input_copies_bytes
    rep["crossovers"] = engine.core_model.input_crossovers
    return rep


def print_table(rep: dict[str, Any]) -> None:
    tag = " (synthetic: speed only)" if rep["synthetic"] else ""
    print(f"\n{rep['label']}{tag}: dense {rep['dense_tok_s']:.1f} tok/s", end="")
    if rep.get("perplexity_dense"):
        print(f", perplexity {rep['perplexity_dense']:.3f}", end="")
    print(f"; input-major copies {rep['input_copies_bytes'] / 1e6:.1f} MB")
    print("level        skipped  ppl change   tok/s  vs dense  ideal  of ideal")
    for key, lv in rep["levels"].items():
        print(
            f"{key:<12} {lv['dropped_mean']:>7.3f} {100 * lv['perplexity_change']:>+10.2f}% "
            f"{lv['tok_s']:>7.1f} {lv['ratio']:>8.2f}x {lv['ideal_ratio']:>5.2f}x "
            f"{100 * lv['share_of_ideal']:>7.0f}%"
        )


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--threads", type=int, default=2, help="engine threads (default 2)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode")
    ap.add_argument(
        "--shares",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.25, 0.4, 0.5],
        help="shares of projection inputs skipped (default 0.25,0.4,0.5)",
    )
    ap.add_argument("--score", choices=("teal", "wina"), default="wina")
    ap.add_argument("--allocation", choices=("uniform", "greedy"), default="uniform")
    ap.add_argument("--output-head", action="store_true", help="also sparsify the head's input")
    ap.add_argument("--calib-tokens", type=int, default=2048)
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--model", help="GGUF for part (a) (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--skip-smol", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--synthetic-dtype", default="Q4_0", help="format of model (b)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    add_synthetic_args(ap)
    args = ap.parse_args(argv)
    pi = require_powerinfer()
    report: dict[str, Any] = {"machine": machine_info(), "parts": []}
    if not args.skip_smol:
        from corpus import SOURCE_NAME, held_out_ids

        path = Path(args.model) if args.model else default_model()
        eng = pi.Engine.from_pretrained(str(path), threads=args.threads, n_ctx=1024)
        need = args.calib_tokens + args.ppl_tokens
        ids = held_out_ids(eng.tokenizer, need)
        cal, held = ids[: args.calib_tokens], ids[args.calib_tokens : need]
        print(f"\n== {path.name}: calibration and held-out text from {SOURCE_NAME} ==")
        rep = bench(
            eng,
            f"{path.name} (real model)",
            cal,
            held,
            args,
            synthetic=False,
            prompt=eng.tokenizer.encode(PROMPT),
        )
        print_table(rep)
        report["parts"].append(rep)
        del eng
    if not args.skip_synthetic:
        shape = {**SYNTH_SHAPE, "activation": "silu"}
        path = synthetic_gguf(Path(args.cache), args.synthetic_dtype, shape, seed=args.seed)
        eng = pi.Engine.from_pretrained(str(path), threads=args.threads, n_ctx=1024)
        rng = np.random.default_rng(0)
        vocab = eng.config.vocab_size
        cal = [int(i) for i in rng.integers(3, vocab, 512)]
        held = [int(i) for i in rng.integers(3, vocab, 256)]
        prompt = [int(i) for i in rng.integers(3, vocab, 16)]
        print(f"\n== synthetic SiLU llama {args.synthetic_dtype} {SYNTH_SHAPE} ==")
        rep = bench(eng, path.name, cal, held, args, synthetic=True, prompt=prompt)
        print_table(rep)
        report["parts"].append(rep)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
