"""Benchmark the placement solver on a 70B-shaped model with a synthetic activation profile.

Llama-2-70B's shape (80 layers, dim 8192, 28,672 FFN neurons, 64 heads over 8 KV heads, vocab
32000) in Q4_0, planned from its config alone (no weights), with a power-law *synthetic profile*.
For each (hardware, budget) and objective: HiGHS solve time, status and MIP gap, and, ILP vs
greedy, the GPU share of FFN activation mass and the predicted tokens/s (from the hardware
profile's bandwidths: a model, not a measurement).

    python benchmarks/bench_plan.py [--objectives mass,time] [--time-limit 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

try:
    import powerinfer_rs  # noqa: F401
except ImportError:  # run from a checkout without an installed wheel
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from powerinfer_rs.formats.profile import synthetic_profile
from powerinfer_rs.loading.types import ModelConfig  # noqa: E402
from powerinfer_rs.planning import (  # noqa: E402
    ModelShape,
    build_problem,
    default_predictor_sizes,
    evaluate,
    load_hardware,
)
from powerinfer_rs.planning.greedy import solve_greedy  # noqa: E402
from powerinfer_rs.planning.ilp import DEFAULT_MIP_GAP, solve_ilp  # noqa: E402
from powerinfer_rs.testing.synth_model import SynthSpec  # noqa: E402

#: (hardware profile, budget in GiB); an RTX 4090 has 24564 MiB (< 24 GiB), so 23 GiB is its
#: largest whole budget, and 24/40 GiB run on the H100 PCIe profile.
CASES = [("rtx4090", 8), ("rtx4090", 16), ("rtx4090", 23), ("h100-pcie", 24), ("h100-pcie", 40)]


def llama70b_config() -> ModelConfig:
    """Llama-2-70B's hyper-parameters (ReLU, as a ReluLLaMA-70B would have)."""
    return SynthSpec(8192, 28672, 80, 64, 8, 32000, max_context=4096).model_config()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objectives", default="mass,time")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--mip-gap", type=float, default=DEFAULT_MIP_GAP)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=100_000, help="synthetic profile tokens")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)

    cfg = llama70b_config()
    shape = ModelShape.from_config(cfg, "Q4_0")
    t0 = time.perf_counter()
    prof = synthetic_profile(cfg.n_layers, cfg.ffn_dim, args.tokens, zipf_a=1.0, seed=0)
    print(
        f"70B-shaped model (Q4_0, {cfg.n_layers} layers x {cfg.ffn_dim} neurons), synthetic "
        f"profile (Zipf a=1.0, mean activity 0.1, {args.tokens} tokens, made in "
        f"{time.perf_counter() - t0:.1f} s), context {args.context}, bucket 64, default "
        f"predictor estimate, HiGHS time limit {args.time_limit} s, MIP gap {args.mip_gap}"
    )
    preds = default_predictor_sizes(cfg)
    rows = []
    for objective in args.objectives.split(","):
        for hw_name, gib in CASES:
            hw = load_hardware(hw_name)
            t0 = time.perf_counter()
            p = build_problem(
                shape,
                prof,
                hw,
                gib * 2**30,
                objective=objective,
                context=args.context,
                predictors=preds,
            )
            build_s = time.perf_counter() - t0
            g = solve_greedy(p)
            r = solve_ilp(
                p, time_limit=args.time_limit, mip_rel_gap=args.mip_gap, start=g.placement
            )
            ei, eg = evaluate(p, r.placement), evaluate(p, g.placement)
            assert ei.feasible and eg.feasible
            rows.append(
                {
                    "objective": objective,
                    "hardware": hw_name,
                    "budget_gib": gib,
                    "build_s": build_s,
                    "solve_s": r.solve_time_s,
                    "status": r.status,
                    "mip_gap": r.mip_gap,
                    "greedy_s": g.solve_time_s,
                    "ilp_mass_share": ei.mass_share,
                    "greedy_mass_share": eg.mass_share,
                    "ilp_tok_s": ei.tokens_per_s,
                    "greedy_tok_s": eg.tokens_per_s,
                    "ilp_gpu_gib": ei.gpu_bytes / 2**30,
                    "attention_on_gpu": sum(r.placement.attention),
                }
            )
    hdr = (
        "| objective | hardware | budget | build s | ILP solve s | status | MIP gap | "
        "FFN mass on GPU ILP / greedy | tokens/s ILP / greedy | GPU GiB used | attn layers on GPU |"
    )
    print("\nsynthetic profile (70B-shaped, Q4_0); tokens/s predicted from the hardware profile\n")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for r in rows:
        print(
            f"| {r['objective']} | {r['hardware']} | {r['budget_gib']} GiB | {r['build_s']:.2f} | "
            f"{r['solve_s']:.2f} | {r['status']} | {r['mip_gap']:.1e} | "
            f"{r['ilp_mass_share']:.1%} / {r['greedy_mass_share']:.1%} | "
            f"{r['ilp_tok_s']:.2f} / {r['greedy_tok_s']:.2f} | {r['ilp_gpu_gib']:.2f} | "
            f"{r['attention_on_gpu']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
