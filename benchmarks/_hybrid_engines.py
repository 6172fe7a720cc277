"""bench_hybrid.py's engines: llama.cpp with layers offloaded (the Python binding, or the
llama-bench binary), our greedy decode with the GPU side's phase and transfer counters, and the
layer count and free memory that size llama.cpp's offload."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from _bench_common import (
    import_llama,
    open_llama,
)
from _decode_engines import LlamaCpp


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
