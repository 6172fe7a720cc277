"""The hybrid's headline projected without a GPU (``bench_hybrid.py --project``).

The plan's CPU side runs for real on this machine (device ``gpu-sim``: the GPU side's kernels
run too, on the host, but their time is left out); the executor's phase timers
(``gpu_info()["phases"]``) give each layer's CPU work per token. The GPU side's time per layer
comes from the bandwidth model (``powerinfer_rs.planning.bandwidth.gpu_traffic_by_slot``: bytes
and launches per kernel class) at the rates the last GPU lease measured (ncu, see
``CALIBRATION``). Per layer of a token:

    attention on the GPU + attention or FFN blocks on the CPU
      + max(the hot FFN on the GPU, the CPU's norm + predictor + routing + cold FFN)
      + hand-off (the pool's dispatch, the host side of the copies, each copy's link latency)

plus the output head. llama.cpp at the budget-equal ``-ngl``: its CPU part measured here (a file
of just the layers ``-ngl`` leaves on the CPU, with the embedding and the head, run by llama.cpp
on the CPU with the same threads), its offloaded layers' bytes at the device's copy bandwidth
(the most favourable rate for it), and one copy of x each way. The ratio of the two is the
projection; the next GPU lease checks it against the real ratio (benchmarks/gpu/NOTES.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The third H200 lease (NOTES.md, 2026-11-27, commit 164a27c): ncu per kernel on the 4-layer
#: 7B-wide Q4_0 model held whole, caches flushed per launch. Streaming classes as GB/s
#: achieved, small ones as microseconds per launch; ``gap_us``: the host time per launch the
#: same model's wall clock showed beyond its kernel time ((0.93 ms - 665 us) / ~50 launches);
#: ``copy_gbs``: the device's measured copy bandwidth (read + write).
CALIBRATION = {
    "lease": "third H200 lease, 2026-11-27 (benchmarks/gpu/NOTES.md)",
    "gbs": {
        "sparse_matvec (q/k/v/o)": 1090.0,
        "output head": 1090.0,
        "gate_up": 1146.0,
        "axpy_rows (down)": 59.0,
    },
    "us": {
        "attention_decode": 13.1,
        "norms / rope / adds": 4.87,
        "add_splits (down)": 7.1,
    },
    "gap_us": 5.4,
    "copy_gbs": 4250.0,
}
#: Kernel classes of a layer's attention block (the rest of a layer's classes are its FFN's).
ATTENTION_CLASSES = (
    "sparse_matvec (q/k/v/o)",
    "kv_store",
    "attention_decode",
    "norms / rope / adds",
    "quantize_x",
)
#: CPU phases that overlap the GPU's hot FFN of the same layer (queued before them).
OVERLAPPED = ("cpu_norm", "cpu_predictor", "cpu_route", "cold_ffn")
#: CPU phases that run while the GPU waits (blocks the plan keeps on the CPU).
SERIAL = ("cpu_attention", "cpu_ffn")
#: The host side of a hand-off: the pool's start and the copies.
HANDOFF = ("dispatch", "upload", "download", "gpu_wait")


def kernel_seconds(kernel: str, nbytes: float, launches: int, cal: dict = CALIBRATION) -> float:
    """A kernel class's time per token at the calibrated rates (unmeasured classes: launch-bound
    at ``gap_us`` or their bytes at the copy bandwidth, whichever is longer)."""
    gap = launches * cal["gap_us"] * 1e-6
    if kernel in cal["gbs"]:
        return nbytes / (cal["gbs"][kernel] * 1e9) + gap
    floor = nbytes / (cal["copy_gbs"] * 1e9)
    return max(floor, launches * cal["us"].get(kernel, 0.0) * 1e-6) + gap


@dataclass
class LayerProjection:
    """One slot (a layer, or the output head) of a token, in seconds."""

    gpu_attention: float
    gpu_ffn: float
    cpu_serial: float
    cpu_overlapped: float
    handoff_host: float
    link: float
    cold_bytes: float

    @property
    def seconds(self) -> float:
        return (
            self.gpu_attention
            + self.cpu_serial
            + max(self.gpu_ffn, self.cpu_overlapped)
            + self.handoff_host
            + self.link
        )

    @property
    def cpu_bound(self) -> bool:
        return self.cpu_overlapped > self.gpu_ffn


@dataclass
class Projection:
    slots: list[LayerProjection] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.slots)

    def total(self, name: str) -> float:
        return sum(getattr(s, name) for s in self.slots)


def project(phases: dict, transfers: list, steps: int, traffic_by_slot: list, sync_us: float):
    """The projection from the phase totals of ``steps`` decode steps (``phases``: a delta of
    ``gpu_info()["phases"]``'s ``per_layer`` and ``cold_bytes``, with its ``names``), the same
    steps' transfers per slot (uploads, downloads, ...), and the bandwidth model's kernel
    classes per slot; ``sync_us``: the link latency of one copy (the hardware profile's)."""
    names = phases["names"]
    out = Projection()
    for i, row in enumerate(phases["per_layer"]):
        ph = dict(zip(names, (v / steps for v in row)))
        gpu_att = gpu_ffn = 0.0
        for k in traffic_by_slot[i]:
            t = kernel_seconds(k.kernel, k.bytes, k.launches)
            if k.kernel in ATTENTION_CLASSES or k.kernel == "output head":
                gpu_att += t
            else:
                gpu_ffn += t
        copies = (transfers[i][0] + transfers[i][1]) / steps
        out.slots.append(
            LayerProjection(
                gpu_attention=gpu_att,
                gpu_ffn=gpu_ffn,
                cpu_serial=sum(ph[k] for k in SERIAL) + ph["cpu_output"],
                cpu_overlapped=sum(ph[k] for k in OVERLAPPED),
                handoff_host=sum(ph[k] for k in HANDOFF),
                link=copies * sync_us * 1e-6,
                cold_bytes=phases["cold_bytes"][i] / steps,
            )
        )
    return out


def llama_seconds(cpu_seconds: float, gpu_layer_bytes: float, sync_us: float) -> float:
    """llama.cpp's token at ``-ngl``: its CPU part as measured, its offloaded layers' bytes at
    the copy bandwidth, one copy of x each way."""
    return cpu_seconds + gpu_layer_bytes / (CALIBRATION["copy_gbs"] * 1e9) + 2 * sync_us * 1e-6


def format_projection(p: Projection, llama_s: float, n_layers: int) -> str:
    """The projection as a table: totals per part, per-layer hand-off, and the ratio."""
    ms = 1e3
    lines = [
        f"  GPU side (bandwidth model, {CALIBRATION['lease']}): attention + head "
        f"{p.total('gpu_attention') * ms:.2f} ms, hot FFN {p.total('gpu_ffn') * ms:.2f} ms",
        f"  CPU side (measured here): blocks on the CPU {p.total('cpu_serial') * ms:.2f} ms, "
        f"norm + predictor + cold FFN {p.total('cpu_overlapped') * ms:.2f} ms, "
        f"cold rows read {p.total('cold_bytes') / 1e6:.1f} MB/token",
        f"  hand-off per layer: host {p.total('handoff_host') / n_layers * 1e6:.1f} us "
        f"(dispatch + copies + waits), link {p.total('link') / n_layers * 1e6:.1f} us (modelled)",
        f"  layers where the CPU is the critical path: "
        f"{sum(s.cpu_bound for s in p.slots[:n_layers])} of {n_layers}",
        f"  projected hybrid {p.seconds * ms:.2f} ms/token ({1 / p.seconds:.1f} tok/s), "
        f"llama.cpp -ngl {llama_s * ms:.2f} ms ({1 / llama_s:.1f} tok/s): "
        f"**{llama_s / p.seconds:.2f}x**",
    ]
    return "\n".join(lines)
