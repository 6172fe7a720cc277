"""bench_hybrid.py's report: the table of each dtype's engines, and the projection row from the
timed repeats."""

from __future__ import annotations

import numpy as np
from _bench_common import (
    median,
)


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
    out["cpu_side_by_kind"] = cpu_side_by_kind(plan, proj, c.n_layers)
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


def layer_kind(plan, i: int) -> str:
    """What layer ``i`` of ``plan`` leaves the CPU: its attention and FFN ("attention+ffn"),
    its FFN ("ffn"), the cold part of a split FFN ("cold"), or nothing ("none")."""
    pl = plan.placement
    hot = len(plan.gpu_neurons[i]) > 0
    if not pl.attention[i]:
        return "attention+ffn" if not hot else "attention+cold"
    return "cold" if hot else "ffn"


def cpu_side_by_kind(plan, proj, n_layers: int) -> dict:
    """The CPU side's ms per token, measured (the projection's serial, overlapped and host
    hand-off parts) and as the planner priced it, summed over layers of each kind
    (:func:`layer_kind`), with the output head apart: where the cost model is off."""
    priced = plan.predicted.get("layer_cpu_time_s") or [0.0] * n_layers
    out: dict[str, dict] = {}
    for i in range(n_layers):
        s = proj.slots[i]
        k = out.setdefault(layer_kind(plan, i), {"layers": 0, "measured_ms": 0.0, "priced_ms": 0.0})
        k["layers"] += 1
        k["measured_ms"] += 1e3 * (s.cpu_serial + s.cpu_overlapped + s.handoff_host)
        k["priced_ms"] += 1e3 * priced[i]
    head = proj.slots[n_layers]
    total_priced = 1e3 * plan.predicted["cpu_time_per_token_s"]
    out["output"] = {
        "layers": 0,
        "measured_ms": 1e3 * (head.cpu_serial + head.cpu_overlapped + head.handoff_host),
        "priced_ms": total_priced - sum(v["priced_ms"] for v in out.values()),
    }
    return out


def format_by_kind(by_kind: dict) -> str:
    """One line per layer kind: measured against priced ms per token."""
    parts = [
        f"{k} ({v['layers']} layers) {v['measured_ms']:.2f} measured / {v['priced_ms']:.2f} "
        "priced"
        for k, v in by_kind.items()
    ]
    return "  CPU side by layer kind, ms/token: " + "; ".join(parts)


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
            print(format_by_kind(pr["cpu_side_by_kind"]))
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


def plan_summary(plan, model, hw) -> dict:
    """What a plan placed: GPU bytes, layers, hot neurons and their share, the predicted
    speed, the CPU bandwidth the planner assumed and the solver."""
    pl = plan.placement
    hot = sum(len(h) for h in plan.gpu_neurons)
    return {
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
    }
