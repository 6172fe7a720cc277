#!/usr/bin/env python3
"""Hybrid CPU+GPU decode against PowerInfer's own CUDA build, on PowerInfer's file format, with
one placement and one VRAM budget for both.

For each dtype: the PowerInfer-format file of bench_powerinfer.py (a synthetic ReLU llama with
the planted power law, PWRI magic, rank-256 oracle predictors; written once into --cache), our
plan for it within --budget-share x its tensor bytes (``make_plan`` over the planted firing
rates, predictor mode, the file's predictor sizes), then that plan's GPU neurons written beside
the file as PowerInfer's GPU index (``<file>.generated.gpuidx``, as its ``export_split`` writes
it: PowerInfer loads that file instead of running its solver). Engines, alternating, medians of
--repeats:

- "powerinfer": its ``main`` (``--powerinfer-main``, a CUDA build), ``--vram-budget`` = the
  budget in GiB, ``-n --tokens -t --threads --ignore-eos``, tokens/s from its own
  ``eval time`` line (decode only);
- "hybrid": ours, ``Engine.from_pretrained(file, plan=..., device=--device)``, --tokens greedy
  single-token steps after the prompt;
- "cpu": ours without a plan.

PowerInfer's CUDA build puts its dense tensors (attention, head) on the GPU by its own rule
within the budget; only the FFN neurons come from the index. Without --powerinfer-main (or
$POWERINFER_MAIN) the PowerInfer rows are skipped with a message. Figures are synthetic.

    python benchmarks/bench_powerinfer_gpu.py --powerinfer-main /tmp/pi/build/bin/main
    python benchmarks/bench_powerinfer_gpu.py --device gpu-sim --small --shape 256,704,2,1000 \\
        --tokens 8 --repeats 2    # a smoke run without a GPU: no PowerInfer rows
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from _bench_common import (
    add_synthetic_args,
    bench_parser,
    children_cpu_seconds,
    median,
    race,
    require_powerinfer,
    write_json,
)

#: PowerInfer's (llama.cpp's) decode timing line.
EVAL_LINE = re.compile(
    r"^\s*llama_print_timings:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs", re.MULTILINE
)
PROMPT = "The history of the printing press begins in the fifteenth century, when Gutenberg"


def powerinfer_eval_tps(log: str) -> float:
    """Decode tokens/s from PowerInfer's ``llama_print_timings: eval time = T ms / N runs``."""
    m = EVAL_LINE.search(log)
    if m is None:
        raise RuntimeError("no 'eval time' line in PowerInfer's output")
    ms, runs = float(m.group(1)), int(m.group(2))
    if ms <= 0 or runs < 1:
        raise RuntimeError(f"PowerInfer's eval line says {runs} runs in {ms} ms")
    return runs / (ms / 1000.0)


#: What PowerInfer's loader says it put on the GPU (MiB): the FFN neurons of the index, and
#: the dense tensors and KV cache of its own placement.
FFN_LINE = re.compile(r"offloaded ([\d.]+) MiB of FFN weights to GPU")
VRAM_LINE = re.compile(r"VRAM used: ([\d.]+) MB")
KV_LINE = re.compile(r"VRAM kv self = ([\d.]+) MB")


def run_powerinfer(
    binary: str, path: Path, dense_budget: int, n_ctx: int, threads: int, tokens: int
) -> tuple[float, dict]:
    """One run of PowerInfer's ``main``: (decode tokens/s, what it placed on the GPU in MiB).
    ``--vram-budget`` is the budget less the index's neurons: PowerInfer fills it with its dense
    tensors (and KV cache), then adds the index's neurons on top, unchecked (capacity 0), so
    both engines hold the same neurons within the same total."""
    cmd = [binary, "-m", str(path), "-p", PROMPT, "-n", str(tokens), "-t", str(threads)]
    cmd += ["-c", str(n_ctx), "--vram-budget", f"{dense_budget / 2**30:.6f}"]
    cmd += ["--ignore-eos", "--temp", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=1800)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {log[-2000:]}")
    placed = {
        k: float(m.group(1)) if (m := rx.search(log)) else None
        for k, rx in (("ffn_mib", FFN_LINE), ("dense_mib", VRAM_LINE), ("kv_mib", KV_LINE))
    }
    if "failed to apply previously generated gpu split" in log:
        raise RuntimeError("PowerInfer refused the GPU index: " + log[-1500:])
    return powerinfer_eval_tps(log), placed


def plan_and_index(args, path: Path, shape: tuple) -> tuple[Path, int, dict]:
    """Our plan for ``path`` (saved beside it) and PowerInfer's GPU index from it; (plan file,
    budget, facts)."""
    from _hybrid_inputs import planted_profile

    from powerinfer_rs.formats.plan import save_plan
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.planning import ModelShape, load_hardware, make_plan
    from powerinfer_rs.planning.predictor_size import predictor_set_sizes
    from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gpu_index

    dim, ffn, layers, vocab = shape
    heads = max(1, dim // 128)
    pwri = load_powerinfer_gguf(path)
    model = pwri.model
    model_bytes = sum(t.nbytes for t in model.tensors.values())
    budget = int(args.budget_share * model_bytes)
    syn = dict(dim=dim, ffn=ffn, layers=layers, heads=heads, kv_heads=heads, vocab=vocab)
    syn["active"] = args.active
    prof = planted_profile(syn, args.seed, model.fingerprint)
    hw = load_hardware(args.hardware)
    plan = make_plan(
        model,
        prof,
        hw,
        budget,
        context=args.tokens + 128,
        solver="auto",
        predictors=predictor_set_sizes(pwri.predictors, model.config),
        sparsity="predictor",
        objective=args.objective,
        min_neurons=0 if args.small else None,
    )
    plan_path = save_plan(plan, path.with_name(f"{path.stem}-{args.budget_share}.plan.safetensors"))
    ms = ModelShape.from_model(model)
    capacity = sum(len(ids) * ms.neuron_read_bytes(i) for i, ids in enumerate(plan.gpu_neurons))
    # Capacity 0: PowerInfer checks an index's capacity against what its dense placement left
    # of --vram-budget, which it is given as the budget less these neurons (run_powerinfer).
    write_powerinfer_gpu_index(
        path.with_name(path.name + ".generated.gpuidx"), plan.gpu_neurons, ffn, 0
    )
    hot = sum(len(h) for h in plan.gpu_neurons)
    facts = {
        "model_bytes": model_bytes,
        "budget": budget,
        "plan_gpu_bytes": plan.gpu_bytes,
        "attention_layers": sum(plan.placement.attention),
        "output_on_gpu": bool(plan.placement.output),
        "hot_neurons": hot,
        "hot_share": hot / (layers * ffn),
        "index_capacity_bytes": capacity,
    }
    return plan_path, budget, facts


def bench_dtype(args, dtype: str, shape: tuple) -> dict:
    from _hybrid_engines import greedy
    from bench_powerinfer import pwri_file

    pi = require_powerinfer()
    path = pwri_file(Path(args.cache), dtype, args.active, shape, args.seed)
    plan_path, budget, facts = plan_and_index(args, path, shape)
    n_ctx = args.tokens + 128
    kw = dict(threads=args.threads, n_ctx=n_ctx)
    engines = {
        "hybrid": pi.Engine.from_pretrained(
            str(path), plan=str(plan_path), device=args.device, vram_budget=budget, **kw
        ),
        "cpu": pi.Engine.from_pretrained(str(path), **kw),
    }
    prompt = list(engines["cpu"].tokenizer.encode(PROMPT))
    binary = args.powerinfer_main
    names = list(engines) + (["powerinfer"] if binary else [])

    placed: dict = {}

    def once(who: str, n: int) -> float:
        if who == "powerinfer":
            dense = budget - facts["index_capacity_bytes"]
            tps, got = run_powerinfer(binary, path, dense, n_ctx, args.threads, n)
            placed.update(got)
            if facts["hot_neurons"] and not got["ffn_mib"]:
                raise RuntimeError(f"PowerInfer put no FFN neuron on the GPU ({got})")
            return tps
        return greedy(engines[who], prompt, n)[1]

    for who in names:
        once(who, min(args.tokens, 8))
    runs = race(
        {who: (lambda w=who: once(w, args.tokens)) for who in names},
        args.repeats,
        own_cpu={"powerinfer": children_cpu_seconds},
    )
    tps = {k: [r.value for r in rs] for k, rs in runs.items()}
    others = {k: median([r.others_util for r in rs]) for k, rs in runs.items()}
    row = {
        "dtype": dtype,
        "file": str(path),
        "device": args.device,
        **facts,
        "tokens_per_s": tps,
        "others_cpu_per_wall": others,
        "median_tokens_per_s": {k: median(v) for k, v in tps.items()},
        "powerinfer_placed_mib": placed or None,
        "synthetic": True,
    }
    if not binary:
        row["powerinfer_skipped"] = "no --powerinfer-main (PowerInfer's CUDA build of main)"
    return row


def print_row(row: dict) -> None:
    m = row["median_tokens_per_s"]
    mib = 2**20
    print(
        f"[{row['dtype']}] budget {row['budget'] / mib:.1f} MiB of {row['model_bytes'] / mib:.1f}"
        f" MiB: plan {row['plan_gpu_bytes'] / mib:.1f} MiB (attention {row['attention_layers']}"
        f" layers, output {row['output_on_gpu']}, {row['hot_neurons']} hot neurons ="
        f" {row['hot_share']:.1%}); GPU index {row['index_capacity_bytes'] / mib:.1f} MiB"
    )
    for who, v in m.items():
        ratio = "" if "powerinfer" not in m else f"  {v / m['powerinfer']:.2f}x PowerInfer"
        print(f"    {who:<10} {v:9.2f} tok/s{ratio}")
    if row.get("powerinfer_placed_mib"):
        print(f"    PowerInfer placed (MiB, from its log): {row['powerinfer_placed_mib']}")
    if "powerinfer_skipped" in row:
        print(f"    powerinfer skipped: {row['powerinfer_skipped']}")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or gpu-sim (default cuda)")
    ap.add_argument(
        "--powerinfer-main",
        default=os.environ.get("POWERINFER_MAIN"),
        help="PowerInfer's main, built with CUDA (default $POWERINFER_MAIN)",
    )
    ap.add_argument("--dtypes", default="q4_0", help="file formats: f16,q4_0 (default q4_0)")
    ap.add_argument("--active", type=float, default=0.1, help="planted firing fraction (0.1)")
    ap.add_argument("--shape", default="4096,11008,32,32000", help="dim,ffn,layers,vocab")
    ap.add_argument("--budget-share", type=float, default=0.4, help="VRAM budget / bytes (0.4)")
    ap.add_argument("--hardware", default="h200", help="hardware profile for the plan (h200)")
    ap.add_argument(
        "--small",
        action="store_true",
        help="tiny shapes (a smoke run): plan with min_neurons=0 and the mass objective",
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads")
    ap.add_argument("--tokens", type=int, default=32, help="decode steps per run (32)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per engine (3)")
    ap.add_argument("--json", help="write every figure to this file")
    add_synthetic_args(ap)
    args = ap.parse_args(argv)
    args.objective = "mass" if args.small else "time"
    shape = tuple(int(v) for v in args.shape.split(","))
    if len(shape) != 4:
        ap.error("--shape takes dim,ffn,layers,vocab")
    print(
        f"Hybrid decode vs PowerInfer (CUDA), device {args.device}, budget {args.budget_share:.0%}"
        f" of the bytes, {args.tokens} tokens x {args.repeats} (median), {args.threads} threads"
        " (synthetic)"
    )
    rows = []
    for dtype in args.dtypes.upper().split(","):
        row = bench_dtype(args, dtype, shape)
        print_row(row)
        rows.append(row)
    write_json(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
