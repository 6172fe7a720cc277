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

import gc
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    bench_parser,
    import_llama,
    machine_info,
    median,
    open_llama,
    require_powerinfer,
    synthetic_gguf,
    write_json,
)
from _decode_engines import LlamaCpp  # noqa: E402

LLAMA7B = dict(dim=4096, ffn=11008, layers=32, heads=32, kv_heads=32, vocab=32000)
SMALL = dict(dim=256, ffn=704, layers=4, heads=8, kv_heads=8, vocab=1000)  # ffn % 32 for Q4_0
PROMPT = "The history of the printing press begins in the fifteenth century, when Gutenberg"
CACHE = os.environ.get(
    "POWERINFER_RS_BENCH_CACHE", str(Path.home() / ".cache" / "powerinfer_rs" / "bench")
)


class LlamaGpu(LlamaCpp):
    """llama.cpp with ``n_gpu_layers`` offloaded."""

    def __init__(self, path: Path, threads: int, n_ctx: int, n_gpu_layers: int):
        self.llm = open_llama(path, n_ctx, threads, logits_all=False, n_gpu_layers=n_gpu_layers)
        self.lib = import_llama()[0]
        self.n_vocab = self.llm.n_vocab()


class LlamaBench:
    """llama.cpp's own ``llama-bench`` binary (a CUDA build of the same source, where the Python
    binding cannot be built: the lent GPU machine has no registry), ``-ngl`` layers offloaded,
    flash attention off, one decode run of ``n`` tokens per call (``-p 0 -n n -r 1``)."""

    def __init__(self, binary: str, path: Path, threads: int, n_gpu_layers: int):
        self.cmd = [binary, "-m", str(path), "-ngl", str(n_gpu_layers), "-t", str(threads)]
        self.cmd += ["-fa", "off", "-p", "0", "-r", "1", "-o", "json"]

    def decode(self, prompt: list[int], n: int) -> tuple[int, float]:
        import json
        import subprocess

        r = subprocess.run(self.cmd + ["-n", str(n)], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr[-2000:]}")
        tps = json.loads(r.stdout)[0]["avg_ts"]
        return n, n / tps


def greedy(eng, prompt: list[int], n: int, phases: dict | None = None):
    """Our engine: prefill ``prompt``, then ``n`` single-token greedy steps; (tokens, tok/s,
    the decode steps' transfers summed over layers, or None without a GPU side). With
    ``phases`` (a dict), the steps' phase times, cold bytes and transfers per slot are added
    into it (for the projection)."""
    eng.reset()
    logits = eng.prefill(prompt)
    info0 = eng.gpu_info()
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = eng.prefill([out[-1]])
    tps = n / (time.perf_counter() - t0)
    if info0 is None:
        return out, tps, None
    info1 = eng.gpu_info()
    xfer = np.array(info1["transfers"]) - np.array(info0["transfers"])
    if phases is not None:
        p0, p1 = info0["phases"], info1["phases"]
        phases["names"] = p1["names"]
        for key in ("per_layer", "cold_bytes", "predictor_bytes"):
            d = np.array(p1[key], dtype=float) - np.array(p0[key], dtype=float)
            phases[key] = phases.get(key, 0) + d
        phases["transfers"] = phases.get("transfers", 0) + xfer
        phases["steps"] = phases.get("steps", 0) + p1["steps"] - p0["steps"]
    return out, tps, np.append(xfer.sum(axis=0), info1["steps"] - info0["steps"])


def regime_tag(shape: dict) -> str:
    """The file-name tag of a synthetic regime other than the default (10% active, the gate
    exactly low rank)."""
    tag = f"-a{shape['active']:g}" if "active" in shape else ""
    return tag + (f"-n{shape['gate_noise']:g}" if shape.get("gate_noise") else "")


def planted_profile(shape: dict, seed: int, fingerprint: str, tokens: int = 100_000):
    """A profile whose counts are the model's planted firing rates x ``tokens``."""
    from powerinfer_rs.formats.profile import Profile
    from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights

    sw = SynthWeights(SynthSpec(**shape, activation="relu", seed=seed, max_context=4096))
    p = [sw.firing_probabilities(i) for i in range(shape["layers"])]
    counts = [np.round(x * tokens).astype(np.int64) for x in p]
    meta = {"model_fingerprint": fingerprint, "corpus": '["planted synthetic power law"]'}
    return Profile(counts, tokens, meta)


def trained_predictors(args, path: Path, model_bytes: int):
    """Predictor mode: the model's profile (with samples) on the package's calibration text and
    predictors trained on it, by the same stages as ``python -m powerinfer_rs prepare`` with its
    token counts (``--profile-tokens`` overrides), cached beside the model; (profile, file)."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.runtime.autofit import CORPUS, _run_stage, stage_tokens

    d = Path(args.model_dir) / f"{path.stem}-predictors"
    prof_dir, pred = d / "profile", d / "predictors.safetensors"
    if not pred.is_file():
        tokens = args.profile_tokens or stage_tokens(model_bytes)[1]
        common = ["--model", str(path), "--threads", str(args.threads)]
        argv = common + ["--corpus", str(CORPUS), "--tokens", str(tokens), "--samples"]
        _run_stage("profile", argv + ["--out", str(prof_dir), "--no-plot"], quiet=True)
        tmp = d / "predictors.part.safetensors"
        argv = ["--model", str(path), "--profile", str(prof_dir), "--out", str(tmp)]
        _run_stage("train-predictors", argv, quiet=True)
        tmp.replace(pred)
    return read_profile(prof_dir), pred


def oracle_predictor_file(args, shape: dict, path: Path, fingerprint: str) -> Path:
    """Predictor mode's upper bound: rank-256 predictors built from the planted gate that mark
    exactly the firing neurons (``testing.powerinfer_files.oracle_predictors``; synthetic,
    F16), written once beside the model."""
    from powerinfer_rs.formats.predictors import save_predictors
    from powerinfer_rs.predictors.model import PredictorSet
    from powerinfer_rs.testing.powerinfer_files import oracle_predictors
    from powerinfer_rs.testing.synth_model import SynthSpec

    out = Path(args.model_dir) / f"{path.stem}-oracle-predictors.safetensors"
    if not out.is_file():
        spec = SynthSpec(**shape, activation="relu", seed=args.seed, max_context=4096)
        layers = oracle_predictors(spec)
        pset = PredictorSet(layers, model_fingerprint=fingerprint, input="ffn_inp")
        save_predictors(out, pset)
    return out


def llama_layers(model, budget: int, n_ctx: int) -> int:
    """llama.cpp's n_gpu_layers for ``budget``: whole layers (weights + f16 K/V cache), then
    the output head (n_layers + 1) when it fits too."""
    c, used = model.config, 0
    kv = 2 * n_ctx * c.n_kv_heads * c.head_dim * 2
    for i in range(c.n_layers):
        used += kv + sum(t.nbytes for k, t in model.tensors.items() if k.startswith(f"blk.{i}."))
        if used > budget:
            return i
    head = sum(t.nbytes for k, t in model.tensors.items() if k.startswith("output"))
    return c.n_layers + (used + head <= budget)


def gpu_free() -> dict | None:
    from powerinfer_rs.planning.gpu_probe import detect_gpu

    g = detect_gpu()
    return None if g is None else {"name": g.name, "free": g.free_bytes, "total": g.total_bytes}


def run_dtype(args, dtype: str, shape: dict, path: Path) -> dict:
    from powerinfer_rs import Engine, _core
    from powerinfer_rs.formats.plan import save_plan
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.planning import load_hardware, make_plan
    from powerinfer_rs.planning.predictor_size import fixed_predictor_sizes, read_predictor_sizes

    model = load_model(path)
    model_bytes = sum(t.nbytes for t in model.tensors.values())
    budget = int(args.budget_share * model_bytes)
    prompt = list(model.tokenizer.encode(PROMPT))
    n_ctx = -(-(len(prompt) + args.tokens + 1) // 64) * 64
    t0 = time.perf_counter()
    mode = dict(sparsity=args.sparsity)
    if args.sparsity == "predictor" and args.predictors == "oracle":
        prof = planted_profile(shape, args.seed, model.fingerprint)
        pred = oracle_predictor_file(args, shape, path, model.fingerprint)
        sizes = read_predictor_sizes(pred, model.config)
        mode["predictors"] = str(pred)
    elif args.sparsity == "predictor":
        prof, pred = trained_predictors(args, path, model_bytes)
        sizes = read_predictor_sizes(pred, model.config)
        mode["predictors"] = str(pred)
    else:
        prof = planted_profile(shape, args.seed, model.fingerprint)
        sizes = fixed_predictor_sizes(model.config, 0)  # no predictors in these modes
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
    pl = plan.placement
    hot = sum(len(h) for h in plan.gpu_neurons)
    row = {
        "dtype": dtype,
        "model": str(path),
        "model_bytes": model_bytes,
        "budget": budget,
        "n_ctx": n_ctx,
        "prompt_tokens": len(prompt),
        "predictors_s": t_plan - t0,  # 0 when cached or not in predictor mode
        "plan_s": time.perf_counter() - t_plan,
        "plan": {
            "gpu_bytes": plan.gpu_bytes,
            "attention_layers": sum(pl.attention),
            "predictor_layers": sum(pl.predictor),
            "output": bool(pl.output),
            "hot_neurons": hot,
            "hot_share": hot / (model.config.n_layers * model.config.ffn_dim),
            "mass_share": plan.predicted["mass_share"],
            "predicted_tok_s": plan.predicted["tokens_per_s"],
            "cpu_mem_bw": hw.cpu_mem_bw,  # GB/s the planner assumed (measured on cuda)
            "solver": plan.solver,
        },
        "mem_before": gpu_free() if args.device != "gpu-sim" else None,
    }
    kw = dict(threads=args.threads, n_ctx=n_ctx, **mode)
    engines = {
        "hybrid": Engine(model, plan=plan_path, device=args.device, vram_budget=budget, **kw)
    }
    info = engines["hybrid"].gpu_info() or {}  # free_bytes: cuMemGetInfo on cuda
    row["mem_after"] = {k: info.get(k) for k in ("allocated_bytes", "free_bytes", "total_bytes")}
    if not args.project:
        engines["cpu"] = Engine(model, **kw)
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

    phases: dict = {}

    def once(key, n, timed=False):
        if key == "llama.cpp":
            done, secs = engines[key].decode(prompt, n)
            return None, done / secs, None
        return greedy(engines[key], prompt, n, phases if timed and key == "hybrid" else None)

    for key in engines:  # warm-up (llama-bench warms up itself)
        if not isinstance(engines[key], LlamaBench):
            once(key, min(8, args.tokens))
    samples = {k: [] for k in engines}
    toks, xfer = {}, None
    order = list(engines)
    probe = []  # the read bandwidth (GB/s) before each repeat, for the CPU side's share of it
    for r in range(args.repeats):
        if args.project:
            probe.append(float(_core.measure_read_bandwidth(256 << 20, 2, args.threads)))
        for key in order if r % 2 == 0 else order[::-1]:
            t, tps, x = once(key, args.tokens, timed=True)
            samples[key].append(tps)
            toks.setdefault(key, t)
            if x is not None:
                xfer = x if xfer is None else xfer + x
        print(
            f"[{dtype}] repeat {r + 1}: "
            + ", ".join(f"{k} {v[-1]:.2f}" for k, v in samples.items())
            + " tok/s",
            flush=True,
        )
    if xfer is not None and xfer[-1] > 0:
        per = xfer[:4] / xfer[-1]
        row["transfers_per_token"] = dict(zip(("uploads", "downloads", "up_B", "down_B"), per))
    if args.project:
        ngl = row["llama_n_gpu_layers"]
        row["projection"] = projection_row(args, model, plan, prof, phases, samples, hw, ngl)
        row["projection"]["read_probe_gbs"] = median(probe)
        row["engines"] = {k: {"tok_s": median(v), "samples": v} for k, v in samples.items()}
        engines.clear()
        gc.collect()
        return row
    row["mismatches"] = sum(a != b for a, b in zip(toks["hybrid"], toks["cpu"]))
    row["engines"] = {
        k: {"tok_s": median(v), "samples": v, "vs_cpu": median(v) / median(samples["cpu"])}
        for k, v in samples.items()
    }
    engines.clear()
    gc.collect()  # free this dtype's device memory before the next one is measured
    return row


def projection_row(args, model, plan, prof, phases: dict, samples: dict, hw, ngl: int) -> dict:
    """The projected hybrid ratio over llama.cpp -ngl from the timed repeats (see
    ``_hybrid_projection``)."""
    from _hybrid_projection import format_projection, llama_seconds, project

    from powerinfer_rs.planning.bandwidth import gpu_traffic_by_slot

    c = model.config
    traffic = gpu_traffic_by_slot(plan, model, prof, args.sparsity)
    names = phases["names"]
    ph = {
        "names": names,
        "per_layer": phases["per_layer"].tolist(),
        "cold_bytes": phases["cold_bytes"].tolist(),
    }
    proj = project(ph, phases["transfers"].tolist(), phases["steps"], traffic, hw.sync_latency_us)
    out = {"llama_cpu_ms": None}
    out["cpu_side_ms"] = 1e3 * (
        proj.total("cpu_serial") + proj.total("cpu_overlapped") + proj.total("handoff_host")
    )
    out["cold_bytes_per_token"] = proj.total("cold_bytes")
    out["cpu_predictor_bytes_per_token"] = float(phases["predictor_bytes"].sum()) / phases["steps"]
    per_phase = np.array(ph["per_layer"]).sum(axis=0) / phases["steps"]
    out["phases_ms"] = {n: 1e3 * float(v) for n, v in zip(names, per_phase)}
    # The cold FFN with its parallel regions' start (the dispatch phase): the bandwidth it
    # reached over the whole time its rows took.
    cold_at = [names.index("cold_ffn"), names.index("dispatch")]
    cold_s = sum(p[i] for p in ph["per_layer"] for i in cold_at) / phases["steps"]
    out["cold_ffn_ms"] = 1e3 * cold_s
    out["cold_ffn_gbs"] = proj.total("cold_bytes") / cold_s / 1e9 if cold_s > 0 else None
    out["handoff_host_us_per_layer"] = 1e6 * proj.total("handoff_host") / c.n_layers
    out["link_us_per_layer"] = 1e6 * proj.total("link") / c.n_layers
    out["gpu_attention_ms"] = 1e3 * proj.total("gpu_attention")
    out["gpu_ffn_ms"] = 1e3 * proj.total("gpu_ffn")
    out["hybrid_ms"] = 1e3 * proj.seconds
    # The planner's cost model (this machine's CPU bandwidth, measured) for the same CPU side.
    out["planner_cpu_side_ms"] = 1e3 * plan.predicted["cpu_time_per_token_s"]
    if samples.get("llama.cpp"):
        ngl = min(ngl, c.n_layers)
        layer_bytes = sum(
            t.nbytes
            for k, t in model.tensors.items()
            if k.startswith("blk.") and int(k.split(".")[1]) < ngl
        )
        llama_cpu = 1.0 / median(samples["llama.cpp"])
        llama_s = llama_seconds(llama_cpu, layer_bytes, hw.sync_latency_us)
        out["llama_cpu_ms"] = 1e3 * llama_cpu
        out["llama_ms"] = 1e3 * llama_s
        out["ratio"] = llama_s / proj.seconds
        out["table"] = format_projection(proj, llama_s, c.n_layers)
    return out


def mib(x):
    return "-" if x is None else f"{x / 2**20:.1f} MiB"


def report(rows: list[dict], args) -> None:
    print(
        f"\nHybrid decode, device {args.device}, sparsity {args.sparsity}, {args.tokens} "
        f"tokens x {args.repeats} repeats (median), {args.threads} threads (synthetic)"
    )
    for r in rows:
        p, m = r["plan"], r["mem_after"]
        print(
            f"[{r['dtype']}] model {mib(r['model_bytes'])}, budget {mib(r['budget'])}, plan "
            f"gpu_bytes {mib(p['gpu_bytes'])} (attention {p['attention_layers']} layers, "
            f"predictors {p.get('predictor_layers', 0)} layers, output "
            f"{p['output']}, {p['hot_neurons']} hot neurons = {p['hot_share']:.1%} of FFN, "
            f"{p['mass_share']:.1%} of activation mass), allocated {mib(m['allocated_bytes'])}, "
            f"free {mib((r['mem_before'] or {}).get('free'))} -> {mib(m['free_bytes'])} of "
            f"{mib(m['total_bytes'])}"
        )
        t = r.get("transfers_per_token")
        if t:
            print(
                f"    per token: {t['uploads']:.1f} uploads ({t['up_B'] / 1e3:.1f} kB), "
                f"{t['downloads']:.1f} downloads ({t['down_B'] / 1e3:.1f} kB)"
            )
        if "mismatches" in r:
            print(f"    greedy tokens hybrid vs cpu: {r['mismatches']} of {args.tokens} differ")
        if "llama_n_gpu_layers" in r:
            print(f"    llama.cpp n_gpu_layers {r['llama_n_gpu_layers']} (dense SiLU FFN)")
    if args.project:
        for r in rows:
            pr = r["projection"]
            print(
                f"\n[{r['dtype']}] projection ({args.sparsity}; llama.cpp -ngl "
                f"{r['llama_n_gpu_layers']}, its CPU part a {r['llama_cpu_layers']}-layer file "
                f"run here): CPU side {pr['cpu_side_ms']:.2f} ms/token measured, "
                f"{pr['planner_cpu_side_ms']:.2f} predicted by the planner"
            )
            print(pr.get("table", f"  llama.cpp skipped: {r.get('llama_skipped')}"))
            top = sorted(pr["phases_ms"].items(), key=lambda kv: -kv[1])
            print(
                "  measured ms/token by phase (gpu_submit and gpu_wait: the host running the GPU "
                "side on gpu-sim, not projected; kv_sync: the prompt's K/V rows, not a decode "
                "step's): " + ", ".join(f"{k} {v:.3f}" for k, v in top if v > 0)
            )
            print(
                f"  the CPU's predictors read {pr['cpu_predictor_bytes_per_token'] / 1e6:.1f} "
                f"MB/token ({r['plan']['predictor_layers']} layers' predictors on the GPU)"
            )
            if pr["cold_ffn_gbs"]:
                print(
                    f"  cold FFN + dispatch {pr['cold_ffn_ms']:.2f} ms/token at "
                    f"{pr['cold_ffn_gbs']:.1f} GB/s "
                    f"= {pr['cold_ffn_gbs'] / pr['read_probe_gbs']:.0%} of the read probe "
                    f"({pr['read_probe_gbs']:.1f} GB/s, median, measured between the repeats)"
                )
        return
    hdr = f"{'device':<8} | {'dtype':<5} | {'engine':<9} | {'tok/s':>8} | {'vs cpu':>6}"
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        for k, e in r["engines"].items():
            dev = args.device if k == "hybrid" else ("cpu" if k == "cpu" else "cuda")
            print(f"{dev:<8} | {r['dtype']:<5} | {k:<9} | {e['tok_s']:>8.2f} | {e['vs_cpu']:>6.2f}")
        if "llama_skipped" in r:
            print(f"{'-':<8} | {r['dtype']:<5} | {'llama.cpp':<9} | skipped: {r['llama_skipped']}")


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
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
    pi = require_powerinfer()
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
    if args.layers:
        shape["layers"] = args.layers
    if args.active is not None:
        shape["active"] = args.active
    if args.gate_noise:
        shape["gate_noise"] = args.gate_noise
    dtypes = list(dict.fromkeys(args.dtype or ["F16", "Q4_0"]))
    cache = Path(args.model_dir)
    cache.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(len(dtypes), mp_context=get_context("spawn")) as pool:  # in parallel
        write = partial(synthetic_gguf, cache, shape=shape, seed=args.seed, tag=regime_tag(shape))
        paths = list(pool.map(write, dtypes))
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
    mi = {**machine_info(), "simd": pi._core.simd_level()}
    write_json(args.json, dict(args=vars(args), shape=shape, machine=mi, rows=rows))
    return 0 if len(good) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
