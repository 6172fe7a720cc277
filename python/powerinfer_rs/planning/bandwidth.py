"""The bandwidth model of a plan's GPU side: the bytes each kernel class moves per decoded token,
and the time that takes at a given memory bandwidth (the floor a kernel at 100% of it would
reach) plus the launches' host latency.

Per GPU layer and token, in the sparsity mode the engine runs (see :func:`gpu_traffic`):
- ``sparse_matvec (q/k/v/o)``: the attention's four matrices, read whole;
- ``kv_store`` / ``attention_decode``: one K and V row written; the whole cache's K and V
  (``context`` positions, ``kv_dim`` values each, f16 or f32) read;
- ``gate_up``: the gate row (none for gate-less FFNs) of every hot neuron the mode reads, and
  the up row of those that fire;
- ``axpy_rows (down)``: the down_t row of every hot neuron that fires; with more than one row
  split, ``add_splits (down)``: y (the splits' partial sums stay in L2);
- ``compact (lists)``: the down pass's rows gathered on the GPU (every hot activation read, the
  nonzero ones' slot and value written) and, in predictor mode, the active hot slots (every
  slot's id and flag read, the active ones written): one launch each;
- ``quantize_x``: the attention's output before a quantized o projection, read as floats and
  written as int16 blocks of 80 bytes per 32 values; the inputs that come out of a norm (q/k/v,
  gate/up, the head) are quantized by the norm in its own launch (their 80 bytes per 32 values
  counted under ``norms / rope / adds``, no launch);
- ``output head``: the vocabulary's rows, where the GPU holds it;
- ``norms / rope / adds``: the f32 vectors they read and write (small): three launches per GPU
  attention layer.

Which neurons fire comes from the activation profile: neuron ``j`` of layer ``l`` fires with
frequency ``counts / tokens``. "dense" reads every hot row; "exact-relu" reads every gate row and
the up/down rows of those that fire; "predictor" and "threshold" read the three rows of those
that fire (the predictor's own matrices are counted apart). The GPU issue measures each kernel's
achieved bytes/s against these bytes (``benchmarks/gpu/``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.plan import Plan
from ..formats.profile import Profile
from ..loading.types import LoadedModel, row_bytes
from .accounting import down_splits, kv_element_bytes, xq_bytes
from .model_shape import SPARSITIES, ModelShape

#: The sparsity modes the model knows.
MODES = SPARSITIES

#: Weight formats whose matvecs read x as floats (the others read it quantized).
FLOAT_DTYPES = ("F32", "F16", "BF16")


@dataclass
class KernelTraffic:
    """One kernel class: bytes moved per decoded token (expected) and launches per token."""

    kernel: str
    bytes: float
    launches: int

    def seconds(self, bandwidth_gbs: float, launch_us: float = 0.0) -> float:
        """The floor: the bytes at ``bandwidth_gbs`` GB/s, plus each launch's latency."""
        return self.bytes / (bandwidth_gbs * 1e9) + self.launches * launch_us * 1e-6


def gpu_traffic(
    plan: Plan,
    model: LoadedModel | ModelShape,
    profile: Profile,
    mode: str = "predictor",
    context: int | None = None,
) -> list[KernelTraffic]:
    """Per kernel class, the bytes the plan's GPU side moves per token (see the module doc);
    ``context`` positions in the KV cache (default: the plan's)."""
    totals: dict[str, list[float]] = {}
    for slot in gpu_traffic_by_slot(plan, model, profile, mode, context):
        for k in slot:
            t = totals.setdefault(k.kernel, [0.0, 0])
            t[0] += k.bytes
            t[1] += k.launches
    return [KernelTraffic(k, v[0], int(v[1])) for k, v in totals.items()]


def gpu_traffic_by_slot(
    plan: Plan,
    model: LoadedModel | ModelShape,
    profile: Profile,
    mode: str = "predictor",
    context: int | None = None,
) -> list[list[KernelTraffic]]:
    """:func:`gpu_traffic` per slot: each layer's kernel classes, then the output head's."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    shape = ModelShape.coerce(model)
    c = shape.config
    ctx = plan.context if context is None else context
    kv = c.n_kv_heads * c.head_dim
    elem = kv_element_bytes(plan.kv_cache)
    slots: list[dict[str, list[float]]] = []

    def add(kernel: str, nbytes: float, launches: int = 1) -> None:
        totals = slots[-1]
        t = totals.setdefault(kernel, [0.0, 0])
        t[0] += nbytes
        t[1] += launches

    pl = plan.placement
    for i in range(c.n_layers):
        slots.append({})
        if pl.attention[i]:
            names = ("attn_q", "attn_k", "attn_v", "attn_output")
            add(
                "sparse_matvec (q/k/v/o)", sum(shape.tensor_bytes(f"blk.{i}.{n}") for n in names), 4
            )
            add("kv_store", 2 * kv * elem)
            add("attention_decode", 2 * ctx * kv * elem + 2 * c.n_heads * c.head_dim * 4)
            # The attention's norm, rope (q and k in one launch, with a per-head q/k norm), the
            # FFN's norm; the residual adds run inside the o projection and the down pass.
            add("norms / rope / adds", 4 * c.dim * 4 * 3, 3)
            q_dim = c.n_heads * c.head_dim
            if any(shape.dtype(f"blk.{i}.{n}").upper() not in FLOAT_DTYPES for n in names[:3]):
                add("norms / rope / adds", xq_bytes(c.dim), 0)  # written by the norm
            if shape.dtype(f"blk.{i}.attn_output").upper() not in FLOAT_DTYPES:
                add("quantize_x", 4 * q_dim + xq_bytes(q_dim))
        ids = np.asarray(plan.gpu_neurons[i], dtype=np.int64)
        if ids.size == 0:
            continue
        freq = profile.frequencies(i)[ids].astype(np.float64)
        fires = float(freq.sum())
        gate = 0 if c.no_gate else row_bytes(shape.dtype(f"blk.{i}.ffn_gate"), c.dim)
        up = row_bytes(shape.dtype(f"blk.{i}.ffn_up"), c.dim)
        down = row_bytes(shape.down_t_dtype(i), c.dim)
        rows_gate = {"dense": ids.size, "exact-relu": ids.size}.get(mode, fires)
        rows_up = ids.size if mode == "dense" else fires
        first = "ffn_up" if c.no_gate else "ffn_gate"  # the hot slab's format
        if shape.dtype(f"blk.{i}.{first}").upper() not in FLOAT_DTYPES:
            add("norms / rope / adds", xq_bytes(c.dim), 0)  # written by the FFN's norm
        # The rows of the down pass gathered (every hot activation read, 8 bytes per row
        # written), and in predictor mode the active slots (every slot's id and flag read).
        add("compact (lists)", 4 * ids.size + 8 * rows_up)
        if mode == "predictor":
            add("compact (lists)", 8 * ids.size + 4 * fires)
        add("gate_up", rows_gate * gate + rows_up * up + 4 * c.dim)
        add("axpy_rows (down)", rows_up * down + 4 * c.dim)
        if down_splits(int(ids.size)) > 1:
            # The splits' partial sums (splits * dim floats, at most 128 * dim: 2 MiB for dim
            # 4096) are written by axpy_rows and read back at once by add_splits: they stay in
            # L2 (tens of MiB on the GPUs we plan for), so only y's read and write reach memory.
            add("add_splits (down)", 2 * 4 * c.dim)
    slots.append({})
    if pl.output:
        add("output head", shape.tensor_bytes("output") + 4 * c.vocab_size, 1)
        if shape.dtype("output").upper() not in FLOAT_DTYPES:
            add("norms / rope / adds", xq_bytes(c.dim), 0)  # written by the final norm
    return [[KernelTraffic(k, v[0], int(v[1])) for k, v in t.items()] for t in slots]


def format_traffic(traffic: list[KernelTraffic], bandwidth_gbs: float, launch_us: float) -> str:
    """A table: bytes per token, the time at ``bandwidth_gbs`` and the launches' share."""
    total = sum(t.seconds(bandwidth_gbs, launch_us) for t in traffic)
    at = f"us at {bandwidth_gbs:g} GB/s"
    lines = [f"{'kernel':<26} {'MB/token':>9} {'launches':>8} {at:>18}"]
    for t in sorted(traffic, key=lambda t: -t.bytes):
        us = t.seconds(bandwidth_gbs, launch_us) * 1e6
        lines.append(f"{t.kernel:<26} {t.bytes / 1e6:>9.3f} {t.launches:>8} {us:>18.1f}")
    launches = sum(t.launches for t in traffic) * launch_us
    lines.append(
        f"{'total':<26} {sum(t.bytes for t in traffic) / 1e6:>9.3f} "
        f"{sum(t.launches for t in traffic):>8} {total * 1e6:>18.1f}  "
        f"(launches {launches:.0f} us at {launch_us} us each)"
    )
    return "\n".join(lines)
