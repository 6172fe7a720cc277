#!/usr/bin/env python3
"""Sparse decode against PowerInfer's own CPU path, on the same PowerInfer-format files.

Files (synthetic, written once into --cache by powerinfer_rs.testing.powerinfer_files): a ReLU
llama (default dim 2048, ffn 5504, 8 layers, vocab 32000) with the planted power law at each
--active fraction, stored in each of --dtypes (F16, or Q4_0 with Q4_0 predictors as PowerInfer's
quantizer writes them), magic PWRI, rank-256 *oracle* predictors (``oracle_predictors``: they
mark exactly the neurons that fire, up to weight rounding, so "predicted active" is the firing
fraction), sparse threshold 0.

Engines: PowerInfer's CPU build (``llama-bench -m FILE -p 0 -n N -t T -r 1 -ngl 0``, one process
per run, its tokens/s) and ours (``Engine.from_pretrained(FILE)``, predictor mode with the
file's predictors, N single-token steps after one token, as llama-bench's ``tg N``), alternating
(PowerInfer first on even repeats, ours first on odd), medians of --repeats. Also printed:
weight bytes each engine must read per token (attention and norms, the predictor as the engine
holds it (fc2 in full; ours reads only the fc2 rows of hidden units ReLU leaves nonzero, so its
figure is an upper bound), the gate/up/down_t rows of the active neurons, the output head, one
embedding row; the active fraction per layer from our profiler over the same greedy decode), and
both
engines' bytes/token x tokens/s as a share of the read bandwidth measured in the same run with
the same threads. CPU use per wall-second is printed for both: well below the thread count
means another process took the cores and the figures should be thrown away.

PowerInfer is built by hand (see the project's PEERS.md; its code is not in this repository):
pass its ``llama-bench`` with --llama-bench or $POWERINFER_LLAMA_BENCH; without it the script
says so and exits 0.

    python benchmarks/bench_powerinfer.py --llama-bench /tmp/peers/PowerInfer/build/bin/llama-bench
    python benchmarks/bench_powerinfer.py --dtypes f16 --active 0.1 --threads 2 --repeats 7
    python benchmarks/bench_powerinfer.py --shape 512,1376,2,4096 --tokens 16 --repeats 1  # smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _bench_common import (
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    children_cpu_seconds,
    machine_info,
    measure_bandwidth,
    median,
    race,
    require_powerinfer,
    write_json,
)
from _sparse_parts import decode_activity, decode_once

RANK = 256


def pwri_file(cache: Path, dtype: str, active: float, shape: tuple, seed: int) -> Path:
    """The PowerInfer-format file of ``dtype`` and ``active`` (written once)."""
    from powerinfer_rs.testing.powerinfer_files import oracle_predictors, write_powerinfer_gguf
    from powerinfer_rs.testing.synth_model import SynthSpec

    dim, ffn, layers, vocab = shape
    heads = max(1, dim // 128)
    name = f"pwri-{dtype.lower()}-d{dim}-f{ffn}-l{layers}-v{vocab}-a{active:g}-r{RANK}-s{seed}.gguf"
    path = cache / name
    if path.is_file():
        return path
    print(f"writing {path} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    spec = SynthSpec(dim, ffn, layers, heads, heads, vocab, "relu", 4096, seed, active)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_powerinfer_gguf(
        path,
        dim=dim,
        ffn=ffn,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        vocab=vocab,
        predictors=oracle_predictors(spec, RANK),
        sparse_threshold=0.0,
        dtype=dtype,
        predictor_dtype=dtype,
        seed=seed,
        active=active,
        max_context=4096,
    )
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path


def tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of every tensor in the file (names without ``.weight``)."""
    from powerinfer_rs.loading.gguf_file import GGUFFile

    gf = GGUFFile(str(path), allow_powerinfer=True)
    return {t.name.removesuffix(".weight"): int(t.nbytes) for t in gf.tensors}


def bytes_per_token(tb: dict[str, int], layers: int, vocab: int, active: list[float], ours):
    """Weight bytes a predictor-mode decode step must read. ``ours``: the engine whose stored
    predictor bytes replace the file's (ours holds them in f16 or f32), else None (PowerInfer:
    as stored)."""
    total = tb["output"] + tb["output_norm"] + tb["token_embd"] // vocab
    for i, a in enumerate(active):
        b = f"blk.{i}."
        total += sum(tb[b + k] for k in ("attn_q", "attn_k", "attn_v", "attn_output"))
        total += tb[b + "attn_norm"] + tb[b + "ffn_norm"]
        if ours is None:
            total += tb[b + "fc1"] + tb[b + "fc2"]
        else:  # held as stored (block formats), else as f16/f32 copies; fc2 counted in full
            p = ours.predictors.layers[i]
            if p.stored is not None:
                total += sum(int(t.data.nbytes) for t in p.stored)
            else:
                item = 4 if str(ours.predictors.dtype).upper() == "F32" else 2
                total += item * (p.fc1.size + p.fc2.size)
        total += a * (tb[b + "ffn_gate"] + tb[b + "ffn_up"] + tb[b + "ffn_down_t"])
    return total


def phase_bytes(tb: dict[str, int], layers: int, active: list[float], ours) -> dict[str, float]:
    """Weight bytes per decode step of each phase the engine times (predictor mode): attention
    and the output head read whole, the predictors as held, gate/up/down_t the active rows."""
    b = [f"blk.{i}." for i in range(layers)]
    out = {
        "attention": sum(
            tb[p + k] for p in b for k in ("attn_q", "attn_k", "attn_v", "attn_output", "attn_norm")
        ),
        "predictor": 0.0,
        # Gate, up and down_t rows of the active neurons, in one fused region.
        "ffn": sum(
            a * (tb[p + "ffn_gate"] + tb[p + "ffn_up"] + tb[p + "ffn_down_t"])
            for p, a in zip(b, active)
        ),
        "output": tb["output"] + tb["output_norm"],
    }
    for lp in (ours.predictors.layers[i] for i in range(layers)):
        if lp.stored is not None:
            out["predictor"] += sum(int(t.data.nbytes) for t in lp.stored)
        else:
            item = 4 if str(ours.predictors.dtype).upper() == "F32" else 2
            out["predictor"] += item * (lp.fc1.size + lp.fc2.size)
    return out


def phase_breakdown(engine, tokens: int, need: dict[str, float], bw_gbs: float) -> dict:
    """Per phase of one timed decode run: ms per token, bytes per token, GB/s, and the time the
    bytes alone would take at the measured read bandwidth (the phase's floor)."""
    session = engine.core_session
    session.set_phase_timing(True)
    try:
        decode_once(engine, [engine.tokenizer.bos_id], tokens)
        times = session.phase_times() or {}
    finally:
        session.set_phase_timing(False)
    steps = max(1, int(times.get("tokens", tokens)))
    rows = {}
    for name, secs in times.items():
        if not isinstance(secs, float):
            continue
        ms = 1e3 * secs / steps
        nbytes = need.get(name, 0.0)
        floor = 1e3 * nbytes / (bw_gbs * 1e9)
        rows[name] = {
            "ms_per_token": ms,
            "bytes_per_token": nbytes,
            "gbs": nbytes / max(ms, 1e-9) / 1e6,
            "floor_ms": floor,
            "floor_share": floor / ms if ms > 0 else None,
        }
    return rows


def print_phases(rows: dict) -> None:
    total = sum(r["ms_per_token"] for r in rows.values())
    floor = sum(r["floor_ms"] for r in rows.values())
    print(f"      {'phase':>10} | {'ms/token':>8} | {'share':>6} | {'MB/token':>8} | "
          f"{'GB/s':>6} | {'floor ms':>8} | floor/actual")  # fmt: skip
    for name, r in rows.items():
        fs = r["floor_share"]
        print(
            f"      {name:>10} | {r['ms_per_token']:8.3f} | {r['ms_per_token'] / total:6.1%} | "
            f"{r['bytes_per_token'] / 1e6:8.2f} | {r['gbs']:6.1f} | {r['floor_ms']:8.3f} | "
            + (f"{fs:.1%}" if fs is not None else "-")
        )
    print(f"      {'all':>10} | {total:8.3f} |        |          |        | {floor:8.3f} | "
          f"{floor / total:.1%}")  # fmt: skip


def run_powerinfer(bench: str, path: Path, threads: int, tokens: int) -> float:
    """Tokens/s of one llama-bench run (its CPU is the race's children's counter; the
    subprocess's wall time includes loading the file, what others used over it does not
    depend on that)."""
    cmd = [bench, "-m", str(path), "-p", "0", "-n", str(tokens), "-t", str(threads)]
    cmd += ["-r", "1", "-ngl", "0", "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return float(json.loads(out.stdout)[0]["avg_ts"])


def run_ours(engine, tokens: int) -> float:
    """Tokens/s of one decode run after the BOS token."""
    return decode_once(engine, [engine.tokenizer.bos_id], tokens)


def bench_file(args, path: Path, dtype: str, active: float, shape: tuple) -> list[dict]:
    pi = require_powerinfer()
    tb = tensor_bytes(path)
    rows = []
    for threads in args.threads:
        bw, how = measure_bandwidth(threads, args.bw_bytes, args.bw_iters)
        eng = pi.Engine.from_pretrained(str(path), threads=threads, n_ctx=args.tokens + 64)
        assert eng.sparsity == "predictor"
        bos = [eng.tokenizer.bos_id]
        act = decode_activity(eng, bos, args.tokens)
        eng.set_sparsity("predictor", predictors=eng.predictors)
        for _ in range(args.warmup):
            run_ours(eng, min(args.tokens, 16))
            run_powerinfer(args.llama_bench, path, threads, min(args.tokens, 16))
        runs = race(
            {
                "powerinfer": lambda t=threads: run_powerinfer(
                    args.llama_bench, path, t, args.tokens
                ),
                "ours": lambda e=eng: run_ours(e, args.tokens),
            },
            args.repeats,
            own_cpu={"powerinfer": children_cpu_seconds},
        )
        tps = {k: [r.value for r in rs] for k, rs in runs.items()}
        others = {k: [r.others_util for r in rs] for k, rs in runs.items()}
        layers, vocab = shape[2], shape[3]
        need = {
            "powerinfer": bytes_per_token(tb, layers, vocab, act, None),
            "ours": bytes_per_token(tb, layers, vocab, act, eng),
        }
        ratios = [o / p for o, p in zip(tps["ours"], tps["powerinfer"])]
        row = {
            "dtype": dtype,
            "active_target": active,
            "active_measured": act,
            "threads": threads,
            "tokens": args.tokens,
            "bandwidth_gbs": bw,
            "bandwidth_method": how,
            "tokens_per_s": tps,
            "others_cpu_per_wall": others,
            "median_tokens_per_s": {k: median(v) for k, v in tps.items()},
            "ratio_ours_over_powerinfer": ratios,
            "median_ratio": median(ratios),
            "bytes_per_token": need,
            "bandwidth_share": {
                k: need[k] * median(tps[k]) / (bw * 1e9) for k in ("powerinfer", "ours")
            },
            "synthetic": True,
        }
        if args.phases:
            row["phases"] = phase_breakdown(eng, args.tokens, phase_bytes(tb, layers, act, eng), bw)
        rows.append(row)
        print_row(row)
        if args.phases:
            print_phases(row["phases"])
        del eng
    return rows


def print_row(row: dict) -> None:
    m, need, share = row["median_tokens_per_s"], row["bytes_per_token"], row["bandwidth_share"]
    act = row["active_measured"]
    print(
        f"{row['dtype']:>5} active {row['active_target']:.2f} (measured "
        f"{sum(act) / len(act):.3f}) threads {row['threads']}: "
        f"PowerInfer {m['powerinfer']:7.2f} tok/s, ours {m['ours']:7.2f} tok/s, "
        f"ratio {row['median_ratio']:.3f} (runs: "
        + ", ".join(f"{r:.3f}" for r in row["ratio_ours_over_powerinfer"])
        + ")"
    )
    print(
        f"      bytes/token PowerInfer {need['powerinfer'] / 1e6:.2f} MB, ours "
        f"{need['ours'] / 1e6:.2f} MB; read bandwidth {row['bandwidth_gbs']:.2f} GB/s; "
        f"shares PowerInfer {share['powerinfer']:.1%}, ours {share['ours']:.1%}"
    )
    others = {k: median(v) for k, v in row["others_cpu_per_wall"].items()}
    flag = "  <- CONTENDED: discard" if max(others.values()) > 0.2 else ""
    print(
        f"      other processes' CPU use during the runs (CPU-s per s): PowerInfer "
        f"{others['powerinfer']:.2f}, ours {others['ours']:.2f}{flag}"
    )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--llama-bench",
        default=os.environ.get("POWERINFER_LLAMA_BENCH"),
        help="PowerInfer's llama-bench (default $POWERINFER_LLAMA_BENCH)",
    )
    ap.add_argument("--dtypes", default="f16,q4_0", help="file formats (f16,q4_0)")
    ap.add_argument("--active", default="0.1,0.25", help="firing fractions (0.1,0.25)")
    ap.add_argument("--threads", default="1,2", help="thread counts (1,2)")
    ap.add_argument("--shape", default="2048,5504,8,32000", help="dim,ffn,layers,vocab")
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per run (64)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs per engine (5)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up runs per engine (1)")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument(
        "--phases",
        action="store_true",
        help="after the race, one timed decode of ours with the engine's phase timers: where a "
        "step's time goes (attention, predictor, gate, up, down, output, other), each against "
        "the time its weight bytes take at the measured read bandwidth",
    )
    add_synthetic_args(ap)
    add_bandwidth_args(ap)
    args = ap.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        shape = tuple(int(x) for x in args.shape.split(","))
        actives = [float(a) for a in args.active.split(",")]
    except ValueError as e:
        ap.error(str(e))
    dtypes = [d.strip().upper() for d in args.dtypes.split(",")]
    if len(shape) != 4 or any(d not in ("F16", "Q4_0") for d in dtypes):
        ap.error("--shape takes dim,ffn,layers,vocab; --dtypes f16 and/or q4_0")
    if not args.llama_bench or not Path(args.llama_bench).is_file():
        print(
            "skipped: PowerInfer's llama-bench not found (build it by hand as PEERS.md says and "
            "pass --llama-bench PATH or set POWERINFER_LLAMA_BENCH)"
        )
        return 0
    mi = machine_info()
    print(f"machine: {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    print("NOTE: synthetic models with oracle predictors: every figure here is synthetic.\n")
    rows = []
    for dtype in dtypes:
        for active in actives:
            path = pwri_file(Path(args.cache), dtype, active, shape, args.seed)
            rows += bench_file(args, path, dtype, active, shape)
    write_json(args.json, {"machine": mi, "shape": shape, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
