"""Human-readable output of a plan: the per-layer table and the PNG plot."""

from __future__ import annotations

import os
from typing import Any

from .._lazy import optional_import
from ..formats.plan import Plan
from .sizes import format_bytes


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def format_table(plan: Plan) -> str:
    """The per-layer table (hot share of activation mass, GPU neurons, bytes per device,
    predicted time), totals and predicted tokens/s."""
    pl, pr, by = plan.placement, plan.predicted, plan.bytes
    hdr = (
        f"{'layer':>5} {'attn':>4} {'pred':>4} {'gpu neurons':>12} {'hot share':>9} "
        f"{'GPU MiB':>10} {'CPU MiB':>10} {'time us':>9}"
    )
    lines = [hdr, "-" * len(hdr)]
    for i in range(plan.n_layers):
        lines.append(
            f"{i:>5} {'gpu' if pl.attention[i] else 'cpu':>4} "
            f"{'gpu' if pl.predictor[i] else 'cpu':>4} "
            f"{plan.gpu_neurons[i].size:>6}/{plan.neuron_counts[i]:<5} "
            f"{pr['layer_mass_share'][i]:>9.1%} "
            f"{_mib(by['gpu']['per_layer'][i]):>10} {_mib(by['cpu']['per_layer'][i]):>10} "
            f"{pr['layer_time_s'][i] * 1e6:>9.1f}"
        )
    lines.append("-" * len(hdr))
    n_hot = sum(int(n.size) for n in plan.gpu_neurons)
    lines.append(
        f"{'other':>5} {'out':>4} {'gpu' if pl.output else 'cpu':>4} {'':>12} {'':>9} "
        f"{_mib(by['gpu']['global']):>10} {_mib(by['cpu']['global']):>10} "
        f"{pr['output_time_s'] * 1e6:>9.1f}"
    )
    lines.append(
        f"{'total':>5} {sum(pl.attention):>4} {sum(pl.predictor):>4} "
        f"{n_hot:>6}/{sum(plan.neuron_counts):<5} {pr['mass_share']:>9.1%} "
        f"{_mib(by['gpu']['total']):>10} {_mib(by['cpu']['total']):>10} "
        f"{pr['time_per_token_s'] * 1e6:>9.1f}"
    )
    s = plan.solver
    gap = "n/a" if s.get("mip_gap") is None else f"{s['mip_gap']:.2e}"
    hw = plan.hardware
    lines += [
        "",
        f"GPU bytes {plan.gpu_bytes:,} ({format_bytes(plan.gpu_bytes)}) of budget "
        f"{plan.budget_bytes:,} ({format_bytes(plan.budget_bytes)}); hardware {hw['name']}, "
        f"context {plan.context}, bucket {plan.bucket}, objective {plan.objective}",
        f"GPU share of FFN activation mass {pr['mass_share']:.1%}; weighted (dense parts "
        f"included) {pr['mass_objective']:.1%}",
        f"predicted {pr['tokens_per_s']:.2f} tokens/s ({pr['time_per_token_s'] * 1e3:.3f} "
        "ms/token, decode, from the hardware profile)",
        f"solver {s['solver']}: {s['status']}, MIP gap {gap}, {s['solve_time_s']:.2f} s"
        + (f"; {s['note']}" if s.get("note") else ""),
    ]
    if plan.ram_neurons is not None:
        lines += ram_lines(plan)
    return "\n".join(lines)


def ram_lines(plan: Plan) -> list[str]:
    """The RAM tier's summary: bytes against the budget, neurons per tier, storage reads."""
    r = plan.ram
    st = r["storage"]
    n_ram = sum(int(n.size) for n in plan.ram_neurons or [])
    n_gpu = sum(int(n.size) for n in plan.gpu_neurons)
    n_all = sum(plan.neuron_counts)
    t = st.get("time_per_token_s")
    cost = (
        f"{t * 1e3:.1f} ms/token at {st['iops']:,.0f} reads/s and {st['read_bw_gbs']:.2f} GB/s"
        if t is not None
        else "not priced: no storage measured (--probe-storage)"
    )
    return [
        f"RAM bytes {r['total_bytes']:,} ({format_bytes(r['total_bytes'])}) of budget "
        f"{r['budget_bytes']:,} ({format_bytes(r['budget_bytes'])}): base "
        f"{format_bytes(r['base_bytes'])}, process {format_bytes(r['overhead_bytes'])}, neuron "
        f"store cache {format_bytes(r['cache_bytes'])} ({r['resident_slots']:,} resident + "
        f"{r['working_slots']:,} working slots of {format_bytes(r['slot_bytes'])}, clusters of "
        f"{r['cluster']})",
        f"neurons: GPU {n_gpu:,}, RAM {n_ram:,}, storage {n_all - n_gpu - n_ram:,} of {n_all:,}; "
        f"storage reads {st['reads_per_token']:,.0f} clusters/token "
        f"({format_bytes(st['bytes_per_token'])}): {cost}",
    ]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend; :class:`UnsupportedError` without
    matplotlib (the ``powerinfer-rs[plan]`` extra)."""
    matplotlib = optional_import("matplotlib", "plotting")
    matplotlib.use("Agg", force=True)
    return optional_import("matplotlib.pyplot", "plotting")


def plot_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """PNG: per layer, the GPU share of activation mass and the bytes on each device."""
    plt = pyplot()

    layers = list(range(plan.n_layers))
    pr, by = plan.predicted, plan.bytes
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.bar(layers, [100 * v for v in pr["layer_mass_share"]], color="tab:green")
    ax1.set_ylabel("GPU share of\nactivation mass (%)")
    ax1.set_ylim(0, 100)
    ax1.set_title(
        f"plan: {format_bytes(plan.gpu_bytes)} of {format_bytes(plan.budget_bytes)} on "
        f"{plan.hardware['name']}, {pr['tokens_per_s']:.1f} tokens/s predicted "
        f"({plan.objective} objective)"
    )
    gpu = [b / 2**20 for b in by["gpu"]["per_layer"]]
    cpu = [b / 2**20 for b in by["cpu"]["per_layer"]]
    ax2.bar(layers, gpu, label="GPU", color="tab:blue")
    ax2.bar(layers, cpu, bottom=gpu, label="CPU", color="tab:orange")
    ax2.set_ylabel("MiB per layer")
    ax2.set_xlabel("layer")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)


__all__ = ["format_table", "plot_plan"]
