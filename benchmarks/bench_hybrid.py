#!/usr/bin/env python3
"""Decode tokens/s of the hybrid CPU+GPU engine against the CPU-only engine (and llama.cpp with
as many layers offloaded as fit the same VRAM budget), on a synthetic ReLU llama.

For each dtype: write (once, into --model-dir) the synthetic GGUF, build an activation profile
from its planted power law (``SynthWeights.firing_probabilities``: each neuron's planted firing
rate, exact for layer 0, close deeper in), plan it with ``make_plan`` (HiGHS warm-started from
greedy) within --budget-share x the model's tensor bytes, save the plan, and load in one
process: "hybrid" (``Engine(plan=..., device=--device, vram_budget=budget)``), "cpu" (no plan,
same sparsity) and, on --device cuda when llama-cpp-python was built with GPU offload,
"llama.cpp" (n_gpu_layers = the most whole layers, weights + f16 KV cache, that fit the
budget; it runs the FFN dense with SiLU whatever the file says, so it does other arithmetic
on the same bytes). Each repeat runs every engine once, in alternating order (this machine is
noisy); the table gives median tokens/s and the ratio to the CPU engine. Timing: the wall time
of --tokens single-token greedy steps (argmax in numpy) after the prompt's prefill.

Also recorded (--json): the plan's placement and gpu_bytes against the budget, gpu_info()'s
allocated_bytes and device free/total memory before (nvidia-smi/pynvml) and after loading,
host<->device transfers per decode step (gpu_info transfers / steps), and how many greedy
tokens of the hybrid engine differ from the CPU engine's: 0 with exact-relu; dense on a quantized
model may differ (the GPU side reads hot neurons' down rows re-quantized from the transposed
projection) and one different token changes the ones after it.

    python benchmarks/bench_hybrid.py                          # 7B shape, F16 and Q4_0, cuda
    python benchmarks/bench_hybrid.py --dtype Q4_0 --tokens 128 --repeats 5 --json out.json
    python benchmarks/bench_hybrid.py --device gpu-sim --small # tiny model, seconds, no GPU
    python benchmarks/bench_hybrid.py --project --dtype Q4_0     # the headline projected here

The 7B shape's GGUFs (F16 13.5 GB, Q4_0 3.8 GB) are written in parallel on the first run (about
2-3 min on 2 cores). --small plans with min_neurons=0 so that its tiny layers get hot neurons.
No CUDA device with --device cuda: a message, exit status 2.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_common as bench  # noqa: E402
from _hybrid_dtype import run_dtype  # noqa: E402
from _hybrid_inputs import regime_tag  # noqa: E402
from _hybrid_report import report  # noqa: E402

LLAMA7B = dict(dim=4096, ffn=11008, layers=32, heads=32, kv_heads=32, vocab=32000)
SMALL = dict(dim=256, ffn=704, layers=4, heads=8, kv_heads=8, vocab=1000)  # ffn % 32 for Q4_0
CACHE = os.environ.get(
    "POWERINFER_RS_BENCH_CACHE", str(Path.home() / ".cache" / "powerinfer_rs" / "bench")
)


def add_model_args(ap) -> None:
    """The options of the model, its plan and the engines' sparsity."""
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or gpu-sim (default cuda)")
    ap.add_argument("--small", action="store_true", help=f"tiny model {SMALL}")
    ap.add_argument(
        "--dtype",
        type=str.upper,
        choices=["F16", "Q4_0", "Q8_0", "F32"],
        action="append",
        help="repeatable (default F16 and Q4_0)",
    )
    ap.add_argument("--budget-share", type=float, default=0.4, help="VRAM budget / model bytes")
    ap.add_argument(
        "--sparsity",
        default="exact-relu",
        choices=["exact-relu", "dense", "predictor"],
        help="predictor: profile the model on the calibration text and train its predictors "
        "first (cached beside the model), as `prepare` does; the CPU engine runs them too",
    )
    ap.add_argument(
        "--predictors",
        choices=["trained", "oracle"],
        default="trained",
        help="with --sparsity predictor: trained on the calibration text (as prepare does), or "
        "oracle (built from the planted gate, marking exactly the firing neurons: the upper "
        "bound, synthetic)",
    )
    ap.add_argument(
        "--profile-tokens",
        type=int,
        help="tokens profiled for --sparsity predictor (default prepare's for the model's size)",
    )
    ap.add_argument(
        "--predictor-dtype",
        choices=["f16", "q8_0", "q4_0"],
        default="f16",
        help="storage format of trained predictors (train_predictors --dtype): the bytes the "
        "plan places and a token reads",
    )


def add_run_args(ap) -> None:
    """The options of the runs, the planner and the synthetic model's regime."""
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="default all cores")
    ap.add_argument(
        "--hardware",
        default="h200",
        help="planner's hardware profile (its CPU replaced by this machine's, measured, on cuda)",
    )
    ap.add_argument(
        "--objective",
        choices=["time", "mass"],
        default=None,
        help="planner objective (default: time; mass with --small, whose tiny layers the time "
        "objective rightly keeps on the CPU)",
    )
    ap.add_argument(
        "--llama-bench",
        help="llama.cpp's llama-bench binary (a CUDA build) to run with -ngl when the Python "
        "binding has no GPU offload",
    )
    ap.add_argument(
        "--layers",
        type=int,
        help="layers of the synthetic model (default the shape's: 32, --small 4); fewer make a "
        "7B-wide model that is quick to write, e.g. for the whole-model-on-the-GPU floor",
    )
    ap.add_argument(
        "--project",
        action="store_true",
        help="project the headline without a GPU: run the plan's CPU side here (device "
        "gpu-sim, its phases timed), the GPU side from the bandwidth model at the last lease's "
        "rates, against llama.cpp's CPU part at the budget-equal -ngl measured here (a file of "
        "the layers it leaves on the CPU); see benchmarks/_hybrid_projection.py",
    )
    ap.add_argument(
        "--active",
        type=float,
        help="mean share of FFN neurons active per token in the synthetic model (default 0.1, "
        "ProSparse-like; 0.3 is close to ReluLLaMA)",
    )
    ap.add_argument(
        "--gate-noise",
        type=float,
        default=0.0,
        help="share of each gate row's variance from a full-rank part beside the planted "
        "low-rank one (0: exactly low rank; a low-rank predictor cannot then be exact)",
    )
    ap.add_argument(
        "--pool-spin-us",
        type=int,
        help="POWERINFER_RS_POOL_SPIN_US for the hybrid engine: how long the CPU pool's "
        "threads, woken as a layer starts, spin for its CPU part (engine default 1000, longer "
        "than a 7B layer's GPU part on an H200; with --project on gpu-sim the host runs the "
        "GPU part for tens of ms, so a value above that keeps the threads warm as a GPU would)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights")
    ap.add_argument("--model-dir", default=CACHE, help=f"synthetic GGUFs and plans ({CACHE})")
    ap.add_argument("--json", help="write all figures to this JSON file")


def parse_args(argv=None):
    """The parsed and checked command line (--project implies device gpu-sim; --pool-spin-us
    set in the environment)."""
    ap = bench.bench_parser(__doc__)
    add_model_args(ap)
    add_run_args(ap)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.tokens < 1 or not 0 < args.budget_share <= 1:
        ap.error("--repeats and --tokens must be >= 1, --budget-share in (0, 1]")
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be >= 1")
    if args.project:
        args.device = "gpu-sim"
    if args.pool_spin_us is not None:
        # Read by each hybrid executor as it opens.
        os.environ["POWERINFER_RS_POOL_SPIN_US"] = str(args.pool_spin_us)
    return ap, args


def write_models(args, shape: dict, dtypes: list[str]) -> list[Path]:
    """The synthetic GGUF of each dtype, written (once) into --model-dir in parallel."""
    cache = Path(args.model_dir)
    cache.mkdir(parents=True, exist_ok=True)
    write = partial(bench.synthetic_gguf, cache, shape=shape, seed=args.seed, tag=regime_tag(shape))
    with ProcessPoolExecutor(len(dtypes), mp_context=get_context("spawn")) as pool:  # in parallel
        return list(pool.map(write, dtypes))


def main(argv=None) -> int:
    """Run every dtype, report, write the JSON; 1 if a dtype failed, 2 without a CUDA device."""
    ap, args = parse_args(argv)
    pi = bench.require_powerinfer()
    from powerinfer_rs.errors import CudaError, PowerInferError
    from powerinfer_rs.runtime.placement import check_device

    try:
        if check_device(args.device) == "cpu":
            ap.error("--device cpu has no GPU side: use cuda, cuda:N or gpu-sim")
    except CudaError as e:
        print(f"no CUDA device: run with --device gpu-sim ({e})", file=sys.stderr)
        return 2
    except PowerInferError as e:
        ap.error(str(e))
    shape = dict(SMALL if args.small else LLAMA7B)
    regime = {"layers": args.layers, "active": args.active, "gate_noise": args.gate_noise or None}
    shape.update({k: v for k, v in regime.items() if v is not None})
    dtypes = list(dict.fromkeys(args.dtype or ["F16", "Q4_0"]))
    paths = write_models(args, shape, dtypes)
    rows = []
    for dtype, path in zip(dtypes, paths):
        try:
            rows.append(run_dtype(args, dtype, shape, path))
        except CudaError as e:
            print(f"no CUDA device: run with --device gpu-sim ({e})", file=sys.stderr)
            return 2
        except PowerInferError as e:
            print(f"[{dtype}] failed: {type(e).__name__}: {e}", file=sys.stderr)
            rows.append({"dtype": dtype, "error": f"{type(e).__name__}: {e}"})
    good = [r for r in rows if "engines" in r]
    if good:
        report(good, args)
    mi = {**bench.machine_info(), "simd": pi._core.simd_level()}
    bench.write_json(args.json, dict(args=vars(args), shape=shape, machine=mi, rows=rows))
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
