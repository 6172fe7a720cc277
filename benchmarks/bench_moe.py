#!/usr/bin/env python3
"""Mixture-of-experts decode and prefill: powerinfer-rs against llama.cpp on the same GGUF, side
by side in one run (synthetic Qwen3-MoE, quantized by llama.cpp's own quantizer).

The models are synthetic mixtures of experts (random weights, llama.cpp's converter keys) of
realistic ratios scaled to this machine, one per ``--shapes`` entry, all dim 1024, 12 layers,
16 query heads, vocabulary 32000:

- ``qwen3moe``: 32 experts of width 512, top-4, 4 KV heads (issue 59's acceptance shape);
- ``olmoe``: 64 experts of width 512, top-8, one KV head per query head (OLMoE's);
- ``mixtral``: 8 experts of width 3584 (3.5x dim, Mixtral's ratio), top-2, 4 KV heads;
- ``glm4moe``: GLM-4.5-Air's ratios at a quarter of its width: 64 experts of 352 (1408 / 4),
  top-8 by sigmoid with the correction bias, one shared expert of 352, layer 0 dense of 2736
  (10944 / 4), half of each head rotating, 4 KV heads, and its NextN block (skipped by both);
- ``gpt-oss``: gpt-oss-20b's ratios: 32 experts as wide as dim (2880 / 2880), top-4, 8 query
  heads per KV head, heads of 64, even layers sliding over 128 positions, attention sinks,
  biased experts with the clamped SwiGLU, YaRN (synth_gptoss's writer; its experts are
  written F16 and quantized with the rest, ``MXFP4`` = llama.cpp's MXFP4_MOE ftype 38, the
  format gpt-oss ships in);
- ``deepseek2``: DeepSeek-V2-Lite's ratios at half its width: multi-head latent attention
  (16 heads, a latent of 256 = 512 / 2, nope 64 / rope 32 / value 64 per head: 128 / 64 /
  128 halved; the query through a LoRA of 512 as V2 has, since llama.cpp reads V2-Lite's
  single q projection only at its layer counts), 64 experts of 704 (1408 / 2), top-6 by softmax
  (V2's routing), 2 shared experts, layer 0 dense of 5472 (10944 / 2); written all-F32 by
  synth_deepseek2's writer and quantized with the rest. ``--heads`` and ``--layers`` apply;
  ``--dim`` scales the latent and the head widths with it.

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
    Decode,
    Prefill,
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    import_llama,
    machine_info,
    measure_bandwidth,
    median,
    race_runners,
    require_powerinfer,
    write_json,
)
from _decode_engines import LlamaCpp, Ours  # noqa: E402
from _moe_phases import format_phases, hybrid_cpu_side, phase_table, print_hybrid  # noqa: E402
from _moe_smallthinker import print_smallthinker, race_exact_relu  # noqa: E402

#: llama.cpp's llama_ftype of each format the quantizer is asked for.
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "MXFP4": 38}


#: Each ``--shapes`` entry: its family and numbers (``ffn`` is the experts' width where the
#: family has no separate expert width).
SHAPES = {
    "qwen3moe": dict(arch="qwen3moe", kv_heads=4, experts=32, experts_used=4, expert_ffn=512),
    "olmoe": dict(arch="olmoe", kv_heads=16, experts=64, experts_used=8, ffn=512),
    "mixtral": dict(arch="mixtral", kv_heads=4, experts=8, experts_used=2, ffn=3584),
    "glm4moe": dict(
        arch="glm4moe",
        kv_heads=4,
        experts=64,
        experts_used=8,
        expert_ffn=352,
        ffn=2736,
        dense_lead=1,
        partial_rotary=0.5,
        nextn=1,
    ),
    "gpt-oss": dict(arch="gpt-oss", kv_heads=2, experts=32, experts_used=4, expert_ffn=1024),
    "deepseek2": dict(
        arch="deepseek2", kv_heads=16, experts=64, experts_used=6, expert_ffn=704, ffn=5472
    ),
}
#: The synth keywords only GLM-4.5's shape sets.
GLM_KEYS = ("dense_lead", "partial_rotary", "nextn")


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
    if arch == "gpt-oss":
        return _gptoss_f16(args, base)
    if arch == "deepseek2":
        return _deepseek2_f32(args, base)
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
        **{k: base[k] for k in GLM_KEYS if k in base},
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


def _gptoss_f16(args, base: dict) -> Path:
    """The synthetic gpt-oss of shape ``base`` as F16 (experts included), written once."""
    from powerinfer_rs.testing.synth_gptoss import write_gptoss_gguf

    shape = {k: base[k] for k in ("dim", "layers", "heads", "kv_heads", "experts")}
    shape.update(experts_used=base["experts_used"], expert_ffn=base["expert_ffn"])
    shape.update(head_dim=base["dim"] // base["heads"], vocab=args.vocab, seed=args.seed)
    shape.update(sliding_window=128, rope_factor=32.0, rope_original_context=128)
    tag = "-".join(f"{k}{v}" for k, v in shape.items())
    path = Path(args.cache) / f"synthetic-gpt-oss-f16-{tag}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part.gguf")
        write_gptoss_gguf(tmp, dtype="F16", expert_dtype=None, **shape)
        os.replace(tmp, path)
    return path


def _deepseek2_f32(args, base: dict) -> Path:
    """The synthetic DeepSeek-V2-Lite-like model of shape ``base``, all-F32 as the converter
    writes it from the float checkpoint (the file llama.cpp quantizes), written once."""
    from powerinfer_rs.testing.synth_deepseek2 import DeepseekSpec, write_deepseek_gguf

    dim = base["dim"]
    spec = DeepseekSpec(
        dim=dim, layers=base["layers"], heads=base["heads"], vocab=args.vocab, q_lora_rank=dim // 2,
        kv_lora_rank=dim // 4, qk_nope=dim // 16, qk_rope=dim // 32, v_head_dim=dim // 16,
        ffn=base["ffn"], expert_ffn=base["expert_ffn"], experts=base["experts"],
        experts_used=base["experts_used"], shared_experts=2, dense_lead=1, v3=False,
        groups=1, groups_used=1, scale=1.0, max_context=4096, seed=args.seed,
    )  # fmt: skip
    tag = f"d{dim}-l{spec.layers}-h{spec.heads}-e{spec.experts}x{spec.expert_ffn}-s{args.seed}"
    path = Path(args.cache) / f"synthetic-deepseek2-f16-{tag}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (all F32) ...", file=sys.stderr, flush=True)
        tmp = path.with_suffix(".part.gguf")
        write_deepseek_gguf(tmp, spec)
        os.replace(tmp, path)
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


def race_engines(args, path: Path, threads: int) -> dict:
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
    dec = race_runners(engines, Decode(prompt, args.tokens), args.repeats)
    dec = {k: [n / secs for n, secs in (r.value for r in rs)] for k, rs in dec.items()}
    if args.prefill:
        pre = race_runners(engines, Prefill(batch), args.repeats)
        pre = {k: [args.prefill / r.value for r in rs] for k, rs in pre.items()}
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
            row = race_engines(args, path, args.threads)
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
        print_hybrid(hybrid, args)
    st = None
    if args.smallthinker:
        st_path = quantized(synthetic_f16(args, "smallthinker"), args.st_format, args.threads)
        st = race_exact_relu(args, st_path, args.threads)
        print_smallthinker(st, args.st_format)
    report = {"machine": mi, "bandwidth_gbs": bw, "args": vars(args), "rows": rows}
    report["hybrid"] = hybrid
    report["smallthinker"] = st
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
