"""Plan a Qwen3-30B-A3B-shaped mixture of experts on an RTX 4090's budgets: the neuron policy
(hot experts and hot neurons inside warm experts, the integer program) against llama.cpp's
``--n-cpu-moe`` baseline, on the same budget and cost model.

The model is planned from its config alone (no weights): 48 layers, dim 2048, 128 experts of
768 neurons, top-8, 32 query heads over 4 KV heads of 128, vocab 151936, Q4_K matrices, with a
*synthetic profile* whose routing follows a power law (Zipf exponent ``--zipf``; real routers
are skewed, and the skew is what a neuron placement can use). The tokens/s are the cost model's
prediction from the hardware profile's bandwidths: a model, not a measurement.

    python benchmarks/bench_plan_moe.py [--zipf 1.0] [--budgets 8,12,16,23] [--time-limit 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import powerinfer_rs  # noqa: F401
except ImportError:  # run from a checkout without an installed wheel
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from powerinfer_rs.formats.profile import synthetic_profile  # noqa: E402
from powerinfer_rs.loading.types import ModelConfig  # noqa: E402
from powerinfer_rs.planning import ModelShape, load_hardware, make_plan  # noqa: E402
from powerinfer_rs.testing.synth_model import SynthSpec  # noqa: E402


def qwen3_30b_a3b() -> ModelConfig:
    """Qwen3-30B-A3B's hyper-parameters (its GGUF's keys)."""
    cfg = SynthSpec(2048, 6144, 48, 32, 4, 151936, max_context=4096).model_config()
    return cfg.replace(
        arch="qwen3moe",
        head_dim=128,
        qk_norm=True,
        n_expert=128,
        n_expert_used=8,
        expert_ffn_dim=768,
        expert_norm_weights=True,
        activation="silu",
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zipf", type=float, default=1.0, help="routing skew (Zipf exponent)")
    ap.add_argument("--budgets", default="8,12,16,23", help="GiB, comma-separated")
    ap.add_argument("--hardware", default="rtx4090")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=20_000, help="synthetic profile tokens")
    args = ap.parse_args(argv)

    cfg = qwen3_30b_a3b()
    shape = ModelShape.from_config(cfg, "Q4_K")
    routed = cfg.n_expert * cfg.expert_ffn_dim
    prof = synthetic_profile(
        cfg.n_layers,
        routed,
        args.tokens,
        zipf_a=args.zipf,
        mean_active=0.5,
        seed=0,
        n_expert=cfg.n_expert,
        n_expert_used=cfg.n_expert_used,
    )
    hw = load_hardware(args.hardware)
    total = sum(shape.tensor_bytes(n) for n in shape.dtypes)
    print(
        f"Qwen3-30B-A3B-shaped ({total / 2**30:.1f} GiB in Q4_K, {cfg.n_layers} layers x "
        f"{cfg.n_expert} experts of {cfg.expert_ffn_dim}, top-{cfg.n_expert_used}), synthetic "
        f"routing (Zipf a={args.zipf}, {args.tokens} tokens), dense experts, hardware "
        f"{hw.name}, context 4096; tokens/s predicted by the cost model\n"
    )
    print(
        "| budget | policy | tokens/s (predicted) | GPU GiB | neurons on GPU | solve s | status |"
    )
    print("|---|---|---|---|---|---|---|")
    for gib in (float(b) for b in args.budgets.split(",")):
        for policy in ("n-cpu-moe", "neurons"):
            t0 = time.perf_counter()
            plan = make_plan(
                shape,
                prof,
                hw,
                int(gib * 2**30),
                sparsity="dense",
                moe_policy=policy,
                time_limit=args.time_limit,
                check_fingerprint=False,
            )
            hot = sum(int(i.size) for i in plan.gpu_neurons) / (cfg.n_layers * cfg.n_neurons)
            print(
                f"| {gib:g} GiB | {policy} | {plan.predicted['tokens_per_s']:.1f} | "
                f"{plan.gpu_bytes / 2**30:.2f} | {hot:.1%} | {time.perf_counter() - t0:.1f} | "
                f"{plan.solver['status']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
