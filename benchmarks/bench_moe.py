#!/usr/bin/env python3
"""Mixture-of-experts decode and prefill: powerinfer-rs against llama.cpp on the same GGUF, side
by side in one run (synthetic Qwen3-MoE, quantized by llama.cpp's own quantizer).

The models are synthetic mixtures of experts (random weights, llama.cpp's converter keys) of
realistic ratios scaled to this machine, one per ``--shapes`` entry, all dim 1024, 12 layers,
16 query heads, vocabulary 32000:

- ``qwen3moe``: 32 experts of width 512, top-4, 4 KV heads (issue 59's acceptance shape);
- ``olmoe``: 64 experts of width 512, top-8, one KV head per query head (OLMoE's);
- ``mixtral``: 8 experts of width 3584 (3.5x dim, Mixtral's ratio), top-2, 4 KV heads.

``--dim``/``--layers``/``--experts``/... override a shape's numbers. Each is written once as F16
and quantized by llama.cpp (``llama_cpp.llama_model_quantize``) to each ``--formats`` entry
(Q4_K_M = llama.cpp's ftype 15, Q4_0 = 2); everything measured on them is "synthetic".

For each file both engines load it with the same thread count, warm up, then alternate
(ours, llama, llama, ours, ...) ``--repeats`` times: decode tokens/s (the single-token steps
after the prompt, greedy) and prefill tokens/s (one batched pass over ``--prefill`` token ids
on an empty context). Medians and the ratio ours/llama.cpp are reported, with the weight bytes
one token reads (the router, ``n_expert_used`` experts and attention per layer, one embedding
row, the head: ``Engine.bytes_per_token``) and the machine's read bandwidth measured in the
same run (floor = bandwidth / bytes per token).

Then where our decode's time goes, from the engine's phase clock over one more run: per phase
(attention: q/k/v/o and the attention itself; ffn: the router and the routed experts (and any
shared expert); output: the head) its milliseconds per token, the weight bytes it reads per
token, the GB/s that makes and its share of the read probe; beside them the rate of our matvec
kernel on each weight format the phase reads (``_core.measure_format_bandwidth``, 2 threads,
out of cache): where that rate is below the probe, the kernel's arithmetic, not memory, is the
floor a phase can reach.

With ``--smallthinker``: a synthetic SmallThinker (ReGLU experts with a planted activation law,
``--st-active`` of each expert's neurons firing on average; by default 32 experts of width
1024, top-4), quantized by llama.cpp to ``--st-format``, decoded by our dense and our
exact-relu modes alternately. The ideal ratio counts the bytes exact-relu skips: the up and
down_t rows of the routed experts' neurons that do not fire (the share measured by a profile
run over the same tokens). With ``--st-predictor-tokens N`` also predictor mode inside the
experts: a profile of N random tokens with samples, predictors trained per expert and kept
where they pay (the trainer's table is printed), raced against exact-relu in the same rounds.

Examples::

    python benchmarks/bench_moe.py                          # qwen3moe, Q4_K_M and Q4_0
    python benchmarks/bench_moe.py --shapes qwen3moe olmoe mixtral --formats Q4_K_M --repeats 7
    python benchmarks/bench_moe.py --experts 128 --expert-ffn 384 --layers 6
    python benchmarks/bench_moe.py --formats --smallthinker  # exact-relu vs dense only
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    import_llama,
    machine_info,
    measure_bandwidth,
    median,
    require_powerinfer,
    write_json,
)
from _decode_engines import LlamaCpp, Ours  # noqa: E402

#: llama.cpp's llama_ftype of each format the quantizer is asked for.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


#: Each ``--shapes`` entry: its family and numbers (``ffn`` is the experts' width where the
#: family has no separate expert width).
SHAPES = {
    "qwen3moe": dict(arch="qwen3moe", kv_heads=4, experts=32, experts_used=4, expert_ffn=512),
    "olmoe": dict(arch="olmoe", kv_heads=16, experts=64, experts_used=8, ffn=512),
    "mixtral": dict(arch="mixtral", kv_heads=4, experts=8, experts_used=2, ffn=3584),
}


def shape_of(args, name: str) -> dict:
    """The synth keywords of shape ``name``: the preset, then any number given on the line."""
    preset = {"dim": 1024, "layers": 12, "heads": 16, "ffn": 3 * 1024, **SHAPES[name]}
    for key in ("dim", "layers", "heads", "kv_heads", "experts", "experts_used", "expert_ffn"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    if args.ffn is not None:
        preset["ffn"] = args.ffn
    return preset


def synthetic_f16(args, arch: str = "qwen3moe") -> Path:
    """The synthetic F16 file of shape ``arch`` (or the SmallThinker), written once into
    ``args.cache``."""
    require_powerinfer()
    from powerinfer_rs.testing.synth import write_gguf_model

    base = shape_of(args, "qwen3moe" if arch == "smallthinker" else arch)
    shape = dict(
        dim=base["dim"],
        ffn=base["ffn"],
        layers=base["layers"],
        heads=base["heads"],
        kv_heads=base["kv_heads"],
        vocab=args.vocab,
        activation="silu",
        arch=base["arch"] if arch != "smallthinker" else arch,
        experts=base["experts"],
        experts_used=base["experts_used"],
        expert_ffn=base.get("expert_ffn", 0),
        max_context=4096,
        seed=args.seed,
    )
    if arch == "smallthinker":  # ReGLU experts with a planted activation law; no window
        shape.update(
            activation="relu",
            ffn=args.st_expert_ffn,
            expert_ffn=0,
            experts=args.st_experts,
            experts_used=args.st_experts_used,
            active=args.st_active,
        )
        if args.st_gate_rank is not None:
            shape["gate_rank"] = args.st_gate_rank
    tag = "-".join(f"{k}{v}" for k, v in shape.items() if k not in ("activation", "arch"))
    path = Path(args.cache) / f"synthetic-{arch}-f16-{tag}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        tmp = path.with_suffix(".part.gguf")
        write_gguf_model(tmp, dtype="F16", **shape)
        os.replace(tmp, path)
        print(f"  done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return path


def quantized(f16: Path, fmt: str, threads: int) -> Path:
    """``f16`` quantized to ``fmt`` by llama.cpp's quantizer (once)."""
    out = f16.with_name(f16.name.replace("-f16-", f"-{fmt.lower()}-"))
    if out.is_file():
        return out
    llama_cpp, why = import_llama()
    if llama_cpp is None:
        raise SystemExit(f"llama-cpp-python is needed to quantize: {why}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[fmt]
    params.nthread = threads
    print(f"quantizing to {fmt} with llama.cpp ...", file=sys.stderr, flush=True)
    tmp = out.with_suffix(".part.gguf")
    rc = llama_cpp.llama_model_quantize(str(f16).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")
    os.replace(tmp, out)
    return out


def race(args, path: Path, threads: int) -> dict:
    """Decode and prefill of both engines on ``path``, alternating ABBA."""
    n_ctx = max(512, args.prefill + args.tokens + 64)
    engines = {"ours": Ours(path, threads, n_ctx), "llama": LlamaCpp(path, threads, n_ctx)}
    rng = np.random.default_rng(args.seed)
    vocab = engines["llama"].n_vocab
    prompt = [int(t) for t in rng.integers(100, vocab - 100, 16)]
    batch = [int(t) for t in rng.integers(100, vocab - 100, args.prefill)]
    row: dict = {"file": str(path), "threads": threads, "tokens": args.tokens}
    row["ours_bytes_per_token"] = engines["ours"].bytes_per_token()
    # Same greedy tokens on both sides (a check that both run the same model).
    steps = engines["ours"].eng.stream_tokens(
        prompt, max_new_tokens=8, temperature=0.0, seed=0, ignore_eos=True
    )
    ours_toks = [s.token for s in steps if s.token is not None]
    row["greedy_agree"] = ours_toks == engines["llama"].greedy_ids(prompt, 8)
    for e in engines.values():
        e.decode(prompt, 8)
        if batch:
            e.prefill(batch[:16])
    dec = {k: [] for k in engines}
    pre = {k: [] for k in engines}
    order = list(engines)
    for r in range(args.repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            n, secs = engines[key].decode(prompt, args.tokens)
            dec[key].append(n / secs)
            if args.prefill:
                pre[key].append(args.prefill / engines[key].prefill(batch))
    for key in engines:
        row[f"{key}_tok_s"] = median(dec[key])
        row[f"{key}_samples"] = dec[key]
        if args.prefill:
            row[f"{key}_prefill_tok_s"] = median(pre[key])
            row[f"{key}_prefill_samples"] = pre[key]
    row["ratio"] = row["ours_tok_s"] / row["llama_tok_s"]
    if args.prefill:
        row["prefill_ratio"] = row["ours_prefill_tok_s"] / row["llama_prefill_tok_s"]
    for e in engines.values():
        e.close()
    return row


def phase_bytes(loaded) -> dict[str, float]:
    """Weight bytes one decode token reads per phase of the engine's clock: attention (q, k,
    v, o), ffn (the router, ``n_expert_used`` experts' gate, up and down, any shared expert and
    its gate) and output (the head), each with its bytes per weight format."""
    c = loaded.config
    t = loaded.tensors
    k = c.n_expert_used
    out: dict[str, dict[str, float]] = {"attention": {}, "ffn": {}, "output": {}}

    def add(phase: str, name: str, share: float = 1.0) -> None:
        if name in t:
            data = t[name]
            fmt = str(data.dtype)
            out[phase][fmt] = out[phase].get(fmt, 0.0) + share * data.nbytes

    for i in range(c.n_layers):
        for w in ("q", "k", "v", "output"):
            add("attention", f"blk.{i}.attn_{w}")
        add("ffn", f"blk.{i}.ffn_gate_inp")
        for w in ("gate", "up", "down"):
            add("ffn", f"blk.{i}.ffn_{w}_exps", k / c.n_expert)
            add("ffn", f"blk.{i}.ffn_{w}_shexp")
        add("ffn", f"blk.{i}.ffn_gate_inp_shexp")
    add("output", "output" if "output" in t else "token_embd")
    return out


def phase_table(path: Path, threads: int, bw: float, tokens: int) -> dict:
    """Our decode by phase on ``path`` (one warm run, then ``tokens`` timed steps): per phase
    ms/token, bytes/token (by format), GB/s, share of the read probe ``bw``, and our kernel's
    rate on each format it reads."""
    pi = require_powerinfer()
    from powerinfer_rs.loading import load_model

    loaded = load_model(path)
    need = phase_bytes(loaded)
    eng = pi.Engine(loaded, threads=threads, n_ctx=max(512, tokens + 64))
    prompt = list(range(100, 116))
    eng.generate(prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    session = eng.core_session
    best: dict[str, float] = {}
    for _ in range(3):  # the best of three runs per phase: the VM's noise only slows
        eng.reset()
        eng.prefill(prompt)
        session.set_phase_timing(True)
        try:
            eng.generate([prompt[-1]], max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
            times = session.phase_times() or {}
        finally:
            session.set_phase_timing(False)
        steps = max(1, int(times.get("tokens", tokens)))
        for name, secs in times.items():
            if isinstance(secs, float) and secs > 0:
                best[name] = min(best.get(name, float("inf")), secs / steps)
    rates: dict[str, float] = {}
    for fmts in need.values():
        for fmt in fmts:
            if fmt not in rates:
                try:
                    rates[fmt] = float(pi._core.measure_format_bandwidth(fmt, 64 << 20, 3, threads))
                except Exception:
                    rates[fmt] = float("nan")
    table = {}
    for name, secs in best.items():
        nbytes = sum(need.get(name, {}).values())
        gbs = nbytes / secs / 1e9
        table[name] = {
            "ms_per_token": 1e3 * secs,
            "bytes_per_token": nbytes,
            "bytes_by_format": need.get(name, {}),
            "gbs": gbs,
            "share_of_probe": gbs / bw,
            # The time the bytes take at our kernel's rate on each format (no overheads).
            "kernel_ms": 1e3 * sum(b / (rates[f] * 1e9) for f, b in need.get(name, {}).items()),
        }
    return {"phases": table, "format_gbs": rates}


def format_phases(p: dict, bw: float) -> str:
    """The phase table as text."""
    lines = ["  phase       ms/token   MB/token   GB/s   of probe   kernel-only ms   formats"]
    total_ms = total_b = 0.0
    for name, r in sorted(p["phases"].items(), key=lambda kv: -kv[1]["ms_per_token"]):
        total_ms += r["ms_per_token"]
        total_b += r["bytes_per_token"]
        fmts = ", ".join(f"{f} {b / 1e6:.1f} MB" for f, b in r["bytes_by_format"].items())
        lines.append(
            f"  {name:<10} {r['ms_per_token']:8.3f} {r['bytes_per_token'] / 1e6:10.2f} "
            f"{r['gbs']:6.1f} {100 * r['share_of_probe']:8.0f}% {r['kernel_ms']:14.3f}   {fmts}"
        )
    lines.append(
        f"  total      {total_ms:8.3f} {total_b / 1e6:10.2f} {total_b / total_ms / 1e6:6.1f} "
        f"{100 * total_b / total_ms / 1e6 / bw:8.0f}%"
    )
    rates = ", ".join(f"{f} {g:.1f}" for f, g in p["format_gbs"].items())
    lines.append(f"  our matvec kernel, GB/s out of cache: {rates} (read probe {bw:.1f})")
    return "\n".join(lines)


#: The hybrid executor's phases on the CPU (the rest: the GPU side and the link).
CPU_PHASES = (
    "cpu_norm",
    "cpu_predictor",
    "cpu_route",
    "cold_ffn",
    "dispatch",
    "cpu_attention",
    "cpu_ffn",
    "cpu_output",
)


def hybrid_cpu_side(path: Path, threads: int, share: float, tokens: int, hardware: str) -> dict:
    """Plans of ``path`` at ``share`` of its weight bytes on ``hardware``'s GPU, by the neuron
    policy and by llama.cpp's ``--n-cpu-moe``, decoded on gpu-sim: per policy the CPU side's
    milliseconds per token (the phases in :data:`CPU_PHASES`, from ``gpu_info()["phases"]``),
    its cold FFN bytes per token, and the whole step (gpu-sim runs the GPU's part on this CPU
    too: only the CPU phases are what a real GPU would leave to the CPU)."""
    import tempfile
    import warnings

    pi = require_powerinfer()
    from powerinfer_rs.formats.plan import save_plan
    from powerinfer_rs.formats.profile import Profile
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.planning import load_hardware, make_plan

    loaded = load_model(path)
    c = loaded.config
    eng = pi.Engine(loaded, threads=threads, n_ctx=512)
    rng = np.random.default_rng(3)
    eng.start_profiling()
    eng.prefill([int(t) for t in rng.integers(100, c.vocab_size - 100, 256)])
    counts, n = eng.profile_counts()
    routed = eng.profile_expert_counts()
    eng.stop_profiling()
    prof = Profile(
        [np.asarray(x, np.int64) for x in counts],
        int(n),
        {"model_fingerprint": loaded.fingerprint},
        expert_counts=[np.asarray(r, np.int64) for r in routed],
    )
    total = sum(t.nbytes for t in loaded.tensors.values())
    out: dict = {"share": share, "hardware": hardware, "budget_bytes": int(share * total)}
    prompt = [int(t) for t in rng.integers(100, c.vocab_size - 100, 16)]
    for policy in ("neurons", "n-cpu-moe"):
        plan = make_plan(
            loaded,
            prof,
            load_hardware(hardware),
            int(share * total),
            context=512,
            sparsity="dense",
            moe_policy=policy,
            solver="greedy",
        )
        with tempfile.TemporaryDirectory() as tmp:
            plan_path = save_plan(plan, Path(tmp) / "plan.safetensors")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hyb = pi.Engine(loaded, plan=str(plan_path), device="gpu-sim", threads=threads)
            hyb.generate(prompt, max_new_tokens=4, temperature=0.0, ignore_eos=True)
            p0 = hyb.gpu_info()["phases"]
            hyb.generate(prompt, max_new_tokens=tokens + 1, temperature=0.0, ignore_eos=True)
            p1 = hyb.gpu_info()["phases"]
        steps = max(1, p1["steps"] - p0["steps"])
        per = {k: 1e3 * (p1["total"][k] - p0["total"][k]) / steps for k in p1["names"]}
        cold = (sum(p1["cold_bytes"]) - sum(p0["cold_bytes"])) / steps
        out[policy] = {
            "gpu_bytes": int(plan.gpu_bytes),
            "experts_hot_neurons": int(sum(len(ids) for ids in plan.gpu_neurons)),
            "cpu_ms_per_token": sum(per[k] for k in CPU_PHASES if k in per),
            "phase_ms_per_token": per,
            "step_ms": 1e3 * (p1["step_seconds"] - p0["step_seconds"]) / steps,
            "cold_bytes_per_token": cold,
        }
    return out


def expert_bytes(loaded, layer: int) -> tuple[int, int, int]:
    """Bytes of one expert's gate, up and down in ``layer`` of a loaded model."""
    n = loaded.config.n_expert
    t = loaded.tensors
    return tuple(
        int(t[f"blk.{layer}.ffn_{k}_exps"].data.nbytes) // n for k in ("gate", "up", "down")
    )


def race_exact_relu(args, path: Path, threads: int) -> dict:
    """Our dense against our exact-relu decode on a ReGLU-expert file (alternating), with the
    ideal speed-up from bytes: the active share inside routed experts comes from a profile run
    over the same prompt and tokens."""
    pi = require_powerinfer()
    from powerinfer_rs.loading import load_model

    loaded = load_model(path)
    c = loaded.config
    n_ctx = max(512, args.tokens + 64)
    dense = pi.Engine(loaded, threads=threads, n_ctx=n_ctx)
    relu = pi.Engine(loaded, threads=threads, n_ctx=n_ctx, sparsity="exact-relu")
    rng = np.random.default_rng(args.seed)
    prompt = [int(t) for t in rng.integers(100, c.vocab_size - 100, 16)]
    seq = list(prompt)  # the greedy continuation the timed runs decode
    logits = dense.prefill(prompt)
    for _ in range(args.tokens):
        seq.append(int(np.argmax(logits)))
        logits = dense.prefill([seq[-1]])
    dense.reset()
    dense.start_profiling()
    dense.prefill(seq)
    counts, tokens = dense.profile_counts()
    routed = dense.profile_expert_counts()
    dense.stop_profiling()
    ef = c.expert_ffn_dim or c.ffn_dim
    active = float(counts.sum() / max(1, routed.sum() * ef))
    full = dense.bytes_per_token
    saved = 0.0
    for layer in range(c.n_layers):
        g, u, d = expert_bytes(loaded, layer)
        saved += c.n_expert_used * (1.0 - active) * (u + d)
    ideal = full / (full - saved)
    rates = {"dense": [], "exact-relu": []}
    engines = {"dense": dense, "exact-relu": relu}
    trained = None
    if args.st_predictor_tokens:
        trained = expert_predictors(args, loaded, path, threads)
        engines["predictor"] = pi.Engine(
            loaded, threads=threads, n_ctx=n_ctx, sparsity="predictor", predictors=trained["file"]
        )
        rates["predictor"] = []
    for e in engines.values():
        e.generate(prompt, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    order = list(engines)
    for r in range(args.repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            eng = engines[key]
            eng.reset()
            eng.generate(
                prompt, max_new_tokens=args.tokens + 1, temperature=0.0, seed=0, ignore_eos=True
            )
            st = eng.last_stats
            rates[key].append(st.decode_tokens / st.decode_seconds)
    row = {
        "file": str(path),
        "active_in_routed_experts": active,
        "bytes_dense": full,
        "bytes_exact_relu": full - saved,
        "ideal_speedup": ideal,
        "dense_tok_s": median(rates["dense"]),
        "relu_tok_s": median(rates["exact-relu"]),
        "dense_samples": rates["dense"],
        "relu_samples": rates["exact-relu"],
    }
    if trained is not None:
        row["predictor"] = trained["summary"]
        row["predictor_tok_s"] = median(rates["predictor"])
        row["predictor_samples"] = rates["predictor"]
        row["predictor_vs_relu"] = row["predictor_tok_s"] / row["relu_tok_s"]
        # The ideal from bytes: per layer, k routed experts each saving the kept predictors'
        # mean (without - with) on held-out samples (experts without one save nothing).
        saved_pred = 0.0
        per_layer = trained["saved_per_expert"]
        for layer in range(c.n_layers):
            saved_pred += c.n_expert_used * per_layer.get(layer, 0.0)
        relu_bytes = full - saved
        row["predictor_ideal_vs_relu"] = relu_bytes / (relu_bytes - saved_pred)
    row["speedup"] = row["relu_tok_s"] / row["dense_tok_s"]
    row["share_of_ideal"] = (row["speedup"] - 1) / (ideal - 1) if ideal > 1 else None
    row["ratio_of_ideal"] = row["speedup"] / ideal
    return row


def expert_predictors(args, loaded, path: Path, threads: int) -> dict:
    """Predictors per expert for ``path``: a dense profile over ``--st-predictor-tokens``
    random token ids (windows of 256) with samples, then the trainer, which keeps an expert's
    predictor only where it pays (cached next to the model)."""
    pi = require_powerinfer()
    from powerinfer_rs.predictors import TrainConfig, format_table, train_predictors
    from powerinfer_rs.stages.profile import profile_model

    out = path.with_name(path.stem + f"-pred{args.st_predictor_tokens}.safetensors")
    prof = path.with_name(path.stem + f"-prof{args.st_predictor_tokens}")
    if not out.is_file():
        eng = pi.Engine(loaded, threads=threads, n_ctx=256)
        rng = np.random.default_rng(args.seed + 1)
        ids = [
            int(t)
            for t in rng.integers(100, loaded.config.vocab_size - 100, args.st_predictor_tokens)
        ]
        t0 = time.perf_counter()
        profile_model(eng, ids, window=256, samples_to=prof, progress=True)
        print(f"  profiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        t0 = time.perf_counter()
        train_predictors(
            prof,
            out,
            model=loaded,
            config=TrainConfig(),
            progress=True,
            log=lambda s: print(s, file=sys.stderr),
        )
        print(f"  trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    from powerinfer_rs.formats.predictors import load_predictors

    pset = load_predictors(out)
    table = format_table(pset)
    print(table)
    kept = list(pset.experts.values())
    summary = {
        "tokens": args.st_predictor_tokens,
        "experts_kept": len(kept),
        "experts": loaded.config.n_layers * loaded.config.n_expert,
        "mean_precision": float(np.mean([p.stats["precision"] for p in kept])) if kept else None,
        "mean_recall": float(np.mean([p.stats["recall"] for p in kept])) if kept else None,
        "read_with_over_without": (
            sum(p.stats["bytes_with"] for p in kept) / sum(p.stats["bytes_without"] for p in kept)
            if kept
            else None
        ),
        "table": table,
    }
    n_expert = loaded.config.n_expert
    saved: dict[int, float] = {}
    for (layer, _e), p in pset.experts.items():
        gain = p.stats["bytes_without"] - p.stats["bytes_with"]
        saved[layer] = saved.get(layer, 0.0) + gain / n_expert
    return {"file": str(out), "summary": summary, "saved_per_expert": saved}


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--formats", nargs="*", default=["Q4_K_M", "Q4_0"], choices=list(FTYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per run")
    ap.add_argument("--prefill", type=int, default=128, help="prefill tokens (0: skip)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--shapes",
        nargs="*",
        default=["qwen3moe"],
        choices=list(SHAPES),
        help="the synthetic models raced (see the top of this file)",
    )
    ap.add_argument("--dim", type=int, default=None, help="override every shape's dim")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=None, help="mixtral/olmoe: the experts' width")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--experts", type=int, default=None)
    ap.add_argument("--experts-used", type=int, default=None)
    ap.add_argument("--expert-ffn", type=int, default=None, help="qwen3moe: the experts' width")
    ap.add_argument(
        "--smallthinker",
        action="store_true",
        help="also a synthetic SmallThinker (ReGLU experts): exact-relu against dense, ours",
    )
    ap.add_argument("--st-experts", type=int, default=32)
    ap.add_argument("--st-experts-used", type=int, default=4)
    ap.add_argument("--st-expert-ffn", type=int, default=1024)
    ap.add_argument(
        "--st-active", type=float, default=0.3, help="planted share of expert neurons firing"
    )
    ap.add_argument("--st-format", default="Q4_0", choices=list(FTYPES))
    ap.add_argument(
        "--st-gate-rank",
        type=int,
        default=None,
        help="rank of the planted low-rank gate structure that makes the SmallThinker's "
        "activity predictable (default: the synthetic writer's, 64)",
    )
    ap.add_argument(
        "--st-predictor-tokens",
        type=int,
        default=0,
        help="also predictor mode inside the SmallThinker's experts: profile this many tokens "
        "with samples, train predictors per expert (kept where they pay), race them against "
        "exact-relu (0: skip)",
    )
    ap.add_argument(
        "--hybrid-share",
        type=float,
        default=0.0,
        help="also plan the first shape's first format at this share of its weight bytes on "
        "--hardware's GPU (neuron policy and --n-cpu-moe) and give the CPU side's time per "
        "token on gpu-sim, from the executor's phase clock (0: skip)",
    )
    ap.add_argument("--hardware", default="rtx4090", help="hardware profile of --hybrid-share")
    ap.add_argument("--json", default=None)
    add_synthetic_args(ap)
    add_bandwidth_args(ap)
    args = ap.parse_args(argv)
    mi = machine_info()
    print(f"machine: {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    bw, how = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)
    print(f"read bandwidth: {bw:.1f} GB/s ({how})")
    print("NOTE: synthetic model (random weights): every figure here is 'synthetic'.\n")
    rows = []
    for shape in args.shapes if args.formats else []:
        f16 = synthetic_f16(args, shape)
        for fmt in args.formats:
            path = quantized(f16, fmt, args.threads)
            row = race(args, path, args.threads)
            row["shape"], row["format"] = shape, fmt
            bpt = row["ours_bytes_per_token"] or 0
            row["floor_tok_s"] = bw * 1e9 / bpt if bpt else None
            row["ours_share_of_floor"] = row["ours_tok_s"] / row["floor_tok_s"] if bpt else None
            row["llama_share_of_floor"] = row["llama_tok_s"] / row["floor_tok_s"] if bpt else None
            row["phases"] = phase_table(path, args.threads, bw, args.tokens)
            rows.append(row)
            print(
                f"{shape} {fmt}: decode ours {row['ours_tok_s']:.1f} vs llama.cpp "
                f"{row['llama_tok_s']:.1f} tok/s = {row['ratio']:.2f}x; prefill {args.prefill}: "
                f"{row.get('ours_prefill_tok_s', 0):.0f} vs "
                f"{row.get('llama_prefill_tok_s', 0):.0f} tok/s = "
                f"{row.get('prefill_ratio', 0):.2f}x; {bpt / 1e6:.1f} MB/token, floor "
                f"{row['floor_tok_s'] or 0:.0f} tok/s (ours at "
                f"{100 * (row['ours_share_of_floor'] or 0):.0f}% of it, llama.cpp at "
                f"{100 * (row['llama_share_of_floor'] or 0):.0f}%); greedy tokens agree: "
                f"{row['greedy_agree']}",
                flush=True,
            )
            print("  samples ours", " ".join(f"{x:.1f}" for x in row["ours_samples"]))
            print("  samples llama", " ".join(f"{x:.1f}" for x in row["llama_samples"]))
            print(format_phases(row["phases"], bw))
    hybrid = None
    if args.hybrid_share > 0 and args.shapes and args.formats:
        path = quantized(synthetic_f16(args, args.shapes[0]), args.formats[0], args.threads)
        hybrid = hybrid_cpu_side(path, args.threads, args.hybrid_share, args.tokens, args.hardware)
        print(
            f"hybrid on gpu-sim, {args.shapes[0]} {args.formats[0]}, plans at "
            f"{100 * args.hybrid_share:.0f}% of the weights on {args.hardware}:"
        )
        for policy in ("neurons", "n-cpu-moe"):
            h = hybrid[policy]
            top = sorted(
                ((k, v) for k, v in h["phase_ms_per_token"].items() if k in CPU_PHASES),
                key=lambda kv: -kv[1],
            )[:4]
            print(
                f"  {policy:<9}: CPU side {h['cpu_ms_per_token']:.2f} ms/token ("
                + ", ".join(f"{k} {v:.2f}" for k, v in top)
                + f"), cold rows of split experts {h['cold_bytes_per_token'] / 1e6:.1f} MB/token; "
                f"whole gpu-sim step {h['step_ms']:.2f} ms; "
                f"{h['gpu_bytes'] / 1e6:.0f} MB on the GPU",
                flush=True,
            )
    st = None
    if args.smallthinker:
        st_path = quantized(synthetic_f16(args, "smallthinker"), args.st_format, args.threads)
        st = race_exact_relu(args, st_path, args.threads)
        print(
            f"SmallThinker {args.st_format}: dense {st['dense_tok_s']:.1f} vs exact-relu "
            f"{st['relu_tok_s']:.1f} tok/s = {st['speedup']:.2f}x; ideal from bytes "
            f"{st['ideal_speedup']:.2f}x ({st['active_in_routed_experts']:.3f} of routed "
            f"experts' neurons fire) -> {100 * st['ratio_of_ideal']:.0f}% of the ideal ratio",
            flush=True,
        )
        print("  samples dense", " ".join(f"{x:.1f}" for x in st["dense_samples"]))
        print("  samples exact-relu", " ".join(f"{x:.1f}" for x in st["relu_samples"]))
        if "predictor" in st:
            pr = st["predictor"]
            ratio = pr["read_with_over_without"]
            print(
                f"  predictor per expert ({pr['experts_kept']} of {pr['experts']} experts kept, "
                f"trained on {pr['tokens']} profiled tokens): {st['predictor_tok_s']:.1f} tok/s "
                f"= {st['predictor_vs_relu']:.2f}x exact-relu (ideal from bytes "
                f"{st['predictor_ideal_vs_relu']:.3f}x); "
                + (
                    f"where kept, a routed token reads {ratio:.3f}x the bytes"
                    if ratio is not None
                    else "none paid: every expert ran exact-relu"
                ),
                flush=True,
            )
            print("  samples predictor", " ".join(f"{x:.1f}" for x in st["predictor_samples"]))
    report = {"machine": mi, "bandwidth_gbs": bw, "args": vars(args), "rows": rows}
    report["hybrid"] = hybrid
    report["smallthinker"] = st
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
