"""Pieces of bench_sparse.py: FFN byte accounting, decode timing and activity of the sparsity
modes, and the printed report."""

from __future__ import annotations

from typing import Any

import numpy as np
from _bench_common import decode_rate, race


def ffn_bytes(engine) -> list[dict[str, int]]:
    """Per layer, bytes of ffn_gate / ffn_up / ffn_down as loaded."""
    t = engine.loaded.tensors
    return [
        {k: int(t[f"blk.{i}.ffn_{k}"].data.nbytes) for k in ("gate", "up", "down")}
        for i in range(engine.config.n_layers)
    ]


def sparse_bytes_per_token(
    dense: int,
    layers: list[dict[str, int]],
    active: list[float],
    *,
    gate_sparse: bool = False,
    up_sparse: bool = True,
) -> float:
    """Weight bytes per token of a mode that reads the gate in full (exact-relu, threshold;
    or only the active rows of it with ``gate_sparse``: predictor), up in full (threshold, whose
    rule |act(gate)·up| needs it) or only its active rows, and only the active rows of down_t
    (down_t holds the same bytes as down)."""
    skip = 0.0
    for lb, a in zip(layers, active):
        rows = lb["down"] + (lb["up"] if up_sparse else 0) + (lb["gate"] if gate_sparse else 0)
        skip += (1.0 - a) * rows
    return dense - skip


# ---------------------------------------------------------------------------------------------
# measurement


#: tokens/s of ``n`` greedy single-token decode steps after ``prompt_ids`` (the one decode clock)
decode_once = decode_rate


def race_modes(engine, modes: dict[str, dict], prompt_ids, n, repeats, warmup) -> dict[str, list]:
    """Decode tokens/s of every mode of one engine in the one race; ``modes`` maps a label to
    set_sparsity arguments ({"mode": ..., **kwargs})."""

    def run(label: str) -> float:
        kw = dict(modes[label])
        engine.set_sparsity(kw.pop("mode"), **kw)
        return decode_once(engine, prompt_ids, n)

    runs = race({label: (lambda k=label: run(k)) for label in modes}, repeats, warmup=warmup)
    engine.set_sparsity("dense")
    return {label: [r.value for r in rs] for label, rs in runs.items()}


def decode_activity(engine, prompt_ids, n, thresholds=None) -> list[float]:
    """Per-layer active fraction over the prompt and a greedy dense decode of ``n`` tokens
    (engine's profiler; ReLU semantics, or |act| >= t with ``thresholds``)."""
    engine.set_sparsity("dense")
    engine.reset()
    engine.start_profiling(thresholds=thresholds)
    try:
        engine.generate(list(prompt_ids), max_new_tokens=n + 1, temperature=0.0, ignore_eos=True)
        counts, tokens = engine.profile_counts()
    finally:
        engine.stop_profiling()
    return list(np.asarray(counts, np.float64).sum(1) / max(1, tokens * engine.config.ffn_dim))


def print_report(rep: dict[str, Any]) -> None:
    for r in rep["runs"]:
        syn = " (synthetic)" if r["synthetic"] else ""
        bw = r["bandwidth_gbs"]
        print(f"\n{r['label']}{syn}; threads {rep['threads']}, {rep['tokens']} tokens/run, "
              f"median of {rep['repeats']}; read bandwidth {bw:.2f} GB/s")  # fmt: skip
        head = (
            f"{'mode':>16} | {'tok/s':>8} | {'vs dense':>8} | {'MB/token':>8} | "
            f"{'ideal vs dense':>14} | {'GB/s (%BW)':>13}"
        )
        extra = not r["synthetic"]
        if extra:
            head += f" | {'sparsity':>8} | {'ppl (vs dense)':>18}"
        print(head)
        print("-" * len(head))
        d = r["modes"]["dense"]
        for label, m in r["modes"].items():
            line = (
                f"{label:>16} | {m['tok_s']:>8.2f} | {m['tok_s'] / d['tok_s']:>8.3f} | "
                f"{m['bytes_per_token'] / 1e6:>8.2f} | "
                f"{d['bytes_per_token'] / m['bytes_per_token']:>14.3f} | "
                f"{m['achieved_gbs']:>6.2f} ({100 * m['achieved_gbs'] / bw:>3.0f}%)"
            )
            if extra:
                t = r["targets"].get(label)
                if t is None:
                    line += f" | {'0':>8} | {r['perplexity_dense']:>9.3f}         "
                else:
                    line += (
                        f" | {t['measured_sparsity']:>8.3f} | {t['perplexity']:>9.3f} "
                        f"({100 * t['perplexity_change']:+.2f}%)"
                    )
            print(line)
        if r["synthetic"]:
            print(
                f"exact-relu speed-up over dense (synthetic): measured "
                f"{r['speedup_exact_relu']:.3f}x, ideal {r['ideal_speedup_exact_relu']:.3f}x "
                f"(= dense / exact-relu bytes per token; active fraction "
                f"{r['active_fraction']:.3f}) -> {100 * r['speedup_share_of_ideal']:.0f}% of ideal"
            )
            if "speedup_predictor_over_exact_relu" in r:
                print(
                    f"predictor over exact-relu (synthetic): measured "
                    f"{r['speedup_predictor_over_exact_relu']:.3f}x, ideal "
                    f"{r['ideal_predictor_over_exact_relu']:.3f}x; mean recall "
                    f"{np.mean(r['predictor']['recall']):.4f}"
                )
    print(
        "\nMB/token: weight bytes a decoded token reads (sparse modes: gate in full, up in "
        "full for threshold,\nelse only on active rows, down_t only on active rows; active "
        "fraction from a profile of the same\ndecode / the held-out text). "
        "GB/s = MB/token x tok/s."
    )
