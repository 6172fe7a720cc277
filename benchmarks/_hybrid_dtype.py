"""bench_hybrid.py's run of one dtype: plan the synthetic model within the VRAM budget, open
the hybrid engine, the CPU engine and llama.cpp beside it, race their greedy decodes, and the
row of figures that comes of it."""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

from _bench_common import children_cpu_seconds, import_llama, median, race, synthetic_gguf
from _decode_engines import LlamaCpp
from _hybrid_engines import LlamaBench, LlamaGpu, gpu_free, greedy, llama_layers
from _hybrid_inputs import profile_and_predictors
from _hybrid_report import plan_summary, projection_row

PROMPT = "The history of the printing press begins in the fifteenth century, when Gutenberg"


def plan_dtype(args, shape: dict, path: Path, model, budget: int, n_ctx: int, row: dict):
    """(profile, engine mode keywords, hardware, plan, plan path) of the model at ``path``
    within ``budget``; the predictors' and the planner's seconds go into ``row``."""
    from powerinfer_rs.formats.plan import save_plan
    from powerinfer_rs.planning import load_hardware, make_plan

    t0 = time.perf_counter()
    prof, sizes, mode = profile_and_predictors(args, shape, path, model, row["model_bytes"])
    hw = load_hardware(args.hardware)
    if args.device != "gpu-sim" or args.project:  # this machine's CPU, measured
        from powerinfer_rs.stages.plan import measured_cpu

        ffn_format = str(model.tensors["blk.0.ffn_up"].dtype)
        hw, _ = measured_cpu(hw, args.threads, ffn_format=ffn_format)
    t_plan = time.perf_counter()
    plan = make_plan(
        model,
        prof,
        hw,
        budget,
        context=n_ctx,
        solver="auto",
        objective=args.objective or ("mass" if args.small else "time"),
        predictors=sizes,
        min_neurons=0 if args.small else None,
        sparsity=args.sparsity,
    )
    plan_path = save_plan(
        plan,
        Path(args.model_dir) / f"{path.stem}-{args.budget_share}-{args.sparsity}.plan.safetensors",
    )
    row["predictors_s"] = t_plan - t0  # 0 when cached or not in predictor mode
    row["plan_s"] = time.perf_counter() - t_plan
    return prof, mode, hw, plan, plan_path


def add_llama(args, dtype: str, shape: dict, path: Path, model, engines: dict, row: dict):
    """Add llama.cpp to ``engines`` where it can run: with --project its CPU part (a file of
    the layers the budget-equal offload leaves on the CPU), on a GPU with as many layers
    offloaded as fit the budget (the Python binding, else --llama-bench); why not, in ``row``."""
    budget, n_ctx = row["budget"], row["n_ctx"]
    llama_cpp, why = import_llama()
    if args.project:
        why = None
        row["llama_n_gpu_layers"] = ngl = llama_layers(model, budget, n_ctx)
        row["llama_cpu_layers"] = cpu_layers = max(1, shape["layers"] - ngl)
        if llama_cpp is None:
            why = "llama-cpp-python is not installed"
        else:
            # llama.cpp runs the FFN dense whatever the regime: one file serves every regime.
            cpu_shape = {**shape, "layers": cpu_layers}
            cpu_shape.pop("active", None)
            cpu_shape.pop("gate_noise", None)
            cpu_path = synthetic_gguf(Path(args.model_dir), dtype, cpu_shape, seed=args.seed)
            engines["llama.cpp"] = LlamaCpp(cpu_path, args.threads, n_ctx)
    elif args.device == "gpu-sim":
        why = "device gpu-sim (no GPU to offload to)"
    elif llama_cpp is not None and not llama_cpp.llama_supports_gpu_offload():
        why = "llama-cpp-python was built without GPU offload"
    elif llama_cpp is not None:
        row["llama_n_gpu_layers"] = ngl = llama_layers(model, budget, n_ctx)
        try:
            engines["llama.cpp"] = LlamaGpu(path, args.threads, n_ctx, ngl)
        except Exception as e:  # report and go on
            why = f"cannot load: {e}"
    if "llama.cpp" not in engines and args.llama_bench:
        row["llama_n_gpu_layers"] = ngl = llama_layers(model, budget, n_ctx)
        engines["llama.cpp"] = LlamaBench(args.llama_bench, path, args.threads, ngl)
    if "llama.cpp" not in engines:
        row["llama_skipped"] = why
        print(f"[{dtype}] llama.cpp skipped: {why}", file=sys.stderr)


def race_engines(args, dtype: str, engines: dict, prompt: list[int]) -> dict:
    """Warm every engine up, then race their --tokens greedy decodes --repeats times; the
    tokens/s samples, first tokens and summed transfers by engine, the hybrid engine's timed
    phases and (with --project) the read bandwidth probed before each repeat."""
    from powerinfer_rs import _core

    phases: dict = {}

    def once(key, n, timed=False):
        if key == "llama.cpp":
            done, secs = engines[key].decode(prompt, n)
            return None, done / secs, None
        return greedy(engines[key], prompt, n, phases if timed and key == "hybrid" else None)

    for key in engines:  # warm-up (llama-bench warms up itself)
        if not isinstance(engines[key], LlamaBench):
            once(key, min(8, args.tokens))
    out = {"samples": {k: [] for k in engines}, "toks": {}, "xfer": None, "phases": phases}
    out["probe"] = []  # the read bandwidth (GB/s) before each repeat, for the CPU side's share

    def before(r: int) -> None:
        if args.project:
            out["probe"].append(float(_core.measure_read_bandwidth(256 << 20, 2, args.threads)))

    def ran(key: str, r: int, run) -> None:
        t, tps, x = run.value
        out["samples"][key].append(tps)
        out["toks"].setdefault(key, t)
        if x is not None:
            out["xfer"] = x if out["xfer"] is None else out["xfer"] + x
        print(f"[{dtype}] repeat {r + 1}: {key} {tps:.2f} tok/s", flush=True)

    fns = {k: (lambda k=k: once(k, args.tokens, timed=True)) for k in engines}
    own = {k: children_cpu_seconds for k, e in engines.items() if isinstance(e, LlamaBench)}
    race(fns, args.repeats, own_cpu=own, on_run=ran, before_round=before)
    return out


def run_dtype(args, dtype: str, shape: dict, path: Path) -> dict:
    """The row of one dtype's synthetic model at ``path``: plan, engines, raced decodes, and
    the projection (--project) or the hybrid engine's mismatches against the CPU engine."""
    from powerinfer_rs import Engine
    from powerinfer_rs.loading import load_model

    model = load_model(path)
    model_bytes = sum(t.nbytes for t in model.tensors.values())
    budget = int(args.budget_share * model_bytes)
    prompt = list(model.tokenizer.encode(PROMPT))
    n_ctx = -(-(len(prompt) + args.tokens + 1) // 64) * 64
    row = {"dtype": dtype, "model": str(path), "model_bytes": model_bytes, "budget": budget}
    row.update({"n_ctx": n_ctx, "prompt_tokens": len(prompt)})
    prof, mode, hw, plan, plan_path = plan_dtype(args, shape, path, model, budget, n_ctx, row)
    row["plan"] = plan_summary(plan, model, hw)
    row["mem_before"] = gpu_free() if args.device != "gpu-sim" else None
    kw = dict(threads=args.threads, n_ctx=n_ctx, **mode)
    engines = {
        "hybrid": Engine(model, plan=plan_path, device=args.device, vram_budget=budget, **kw)
    }
    info = engines["hybrid"].gpu_info() or {}  # free_bytes: cuMemGetInfo on cuda
    row["mem_after"] = {k: info.get(k) for k in ("allocated_bytes", "free_bytes", "total_bytes")}
    if not args.project:
        engines["cpu"] = Engine(model, **kw)
    add_llama(args, dtype, shape, path, model, engines, row)
    raced = race_engines(args, dtype, engines, prompt)
    samples, xfer = raced["samples"], raced["xfer"]
    if xfer is not None and xfer[-1] > 0:
        per = xfer[:4] / xfer[-1]
        row["transfers_per_token"] = dict(zip(("uploads", "downloads", "up_B", "down_B"), per))
    if args.project:
        ngl = row["llama_n_gpu_layers"]
        phases = raced["phases"]
        row["projection"] = projection_row(args, model, plan, prof, phases, samples, hw, ngl)
        row["projection"]["read_probe_gbs"] = median(raced["probe"])
        row["engines"] = {k: {"tok_s": median(v), "samples": v} for k, v in samples.items()}
    else:
        toks = raced["toks"]
        row["mismatches"] = sum(a != b for a, b in zip(toks["hybrid"], toks["cpu"]))
        row["engines"] = {
            k: {"tok_s": median(v), "samples": v, "vs_cpu": median(v) / median(samples["cpu"])}
            for k, v in samples.items()
        }
    engines.clear()
    gc.collect()  # free this dtype's device memory before the next one is measured
    return row
