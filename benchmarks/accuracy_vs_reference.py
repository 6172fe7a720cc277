#!/usr/bin/env python3
"""Accuracy of powerinfer-rs and llama.cpp against an independent float64 reference of the same
GGUF: the same quantized weights dequantized (tests/reference.py's numpy forward pass), so what
is measured is each engine's arithmetic alone (its quantized activations, f16 KV cache, f32
sums), not the file's quantization.

Both engines score the same token ids of held-out text (benchmarks/corpus.py), one token per
step (the decode path: what generation runs), and, with --prefill, also as one batch. Per
position: the relative logit error max|l − ref| / max|ref|; over positions: its largest and
median, the mean KL divergence KL(softmax(ref) ‖ softmax(l)), and the perplexity of the text
under each (against the reference's). Both engines use their default KV cache (f16). Ours runs
the process's numerics (int16 x by default; ``POWERINFER_RS_NUMERICS=int8`` for the int8 x).

Examples::

    python benchmarks/accuracy_vs_reference.py                  # SmolLM2 Q4_1, 96 tokens
    python benchmarks/accuracy_vs_reference.py --model FILE.gguf --tokens 64 --json out.json
    POWERINFER_RS_NUMERICS=int8 python benchmarks/accuracy_vs_reference.py --prefill
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import _bench_common as bench  # noqa: E402
from corpus import held_out_text  # noqa: E402


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def judge(logits: np.ndarray, ref: np.ndarray, ids: list[int]) -> dict:
    """Figures of `logits` (positions × vocab) against the float64 `ref`."""
    logits = np.asarray(logits, dtype=np.float64)
    rel = np.abs(logits - ref).max(axis=1) / np.abs(ref).max(axis=1)
    lp, lq = log_softmax(ref), log_softmax(logits)
    kld = (np.exp(lp) * (lp - lq)).sum(axis=1)
    tgt = np.asarray(ids[1:])
    nll = -lq[np.arange(len(tgt)), tgt]
    return {
        "rel_max": float(rel.max()),
        "rel_median": float(np.median(rel)),
        "kld_mean": float(kld.mean()),
        "kld_max": float(kld.max()),
        "ppl": float(np.exp(nll.mean())),
        "top1_agree": float((logits.argmax(1) == ref.argmax(1)).mean()),
    }


def ours_decode(path: str, ids: list[int], threads: int) -> np.ndarray:
    from powerinfer_rs import Engine

    eng = Engine.from_pretrained(path, threads=threads)
    return np.stack([np.asarray(eng.prefill([t]), dtype=np.float64) for t in ids])


def ours_prefill(path: str, ids: list[int], threads: int) -> np.ndarray:
    from powerinfer_rs import Engine

    eng = Engine.from_pretrained(path, threads=threads)
    return np.asarray(eng.logits(ids), dtype=np.float64)


def llama_logits(path: str, ids: list[int], threads: int, decode: bool) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path, n_ctx=max(64, len(ids) + 8), n_threads=threads,
        n_threads_batch=threads, logits_all=True, verbose=False,
    )
    if decode:
        for t in ids:
            llm.eval([t])
    else:
        llm.eval(ids)
    return np.asarray(llm.scores[: len(ids)], dtype=np.float64)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--tokens", type=int, default=96, help="positions scored (default 96)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", action="store_true", help="also score both engines' batch path")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    path = args.model or str(bench.default_model())

    from powerinfer_rs.loading import load_model

    import reference

    model = load_model(path)
    ids = model.tokenizer.encode(held_out_text(), add_bos=False)[: args.tokens]
    from powerinfer_rs import _core

    print(f"model: {path}\npositions: {len(ids)} (held-out text), threads {args.threads}")
    print(f"ours: numerics {_core.numerics()} (POWERINFER_RS_NUMERICS), {_core.simd_level()}")
    ref = reference.reference_logits(model, ids)
    runs = {"ours decode": lambda: ours_decode(path, ids, args.threads)}
    if args.prefill:
        runs["ours prefill"] = lambda: ours_prefill(path, ids, args.threads)
    if not args.no_llama:
        runs["llama.cpp decode"] = lambda: llama_logits(path, ids, args.threads, True)
        if args.prefill:
            runs["llama.cpp prefill"] = lambda: llama_logits(path, ids, args.threads, False)
    lp = log_softmax(ref)
    tgt = np.asarray(ids[1:])
    ref_ppl = float(np.exp(-lp[np.arange(len(tgt)), tgt].mean()))
    out = {"model": path, "positions": len(ids), "reference_ppl": ref_ppl,
           "numerics": _core.numerics(), "runs": {}}
    print(f"\n{'engine':<18} {'rel max':>9} {'rel med':>9} {'KLD mean':>10} {'KLD max':>10}"
          f" {'ppl':>9} {'ppl/ref-1':>10} {'top1':>6}")
    for name, run in runs.items():
        f = judge(run(), ref, ids)
        out["runs"][name] = f
        print(f"{name:<18} {f['rel_max']:9.2e} {f['rel_median']:9.2e} {f['kld_mean']:10.2e}"
              f" {f['kld_max']:10.2e} {f['ppl']:9.4f} {f['ppl'] / ref_ppl - 1:+10.2e}"
              f" {f['top1_agree']:6.3f}")
    print(f"{'float64 reference':<18} {'':>9} {'':>9} {'':>10} {'':>10} {ref_ppl:9.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
