"""Find the local GPU (name, total and free VRAM) for ``--hardware``/``--vram-budget auto``.

Tries pynvml when installed, then ``nvidia-smi``; no GPU (or no driver) gives ``None``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from ..errors import PlanError
from .sizes import format_bytes

#: Kept free by ``--vram-budget auto``: CUDA context, cuBLAS workspace and the allocator's slack.
AUTO_MARGIN_BYTES = 512 * 2**20
#: ... or this share of the free memory, whichever is larger.
AUTO_MARGIN_SHARE = 0.05


@dataclass(frozen=True)
class GpuInfo:
    """What the driver says about GPU 0."""

    name: str
    total_bytes: int
    free_bytes: int


def _probe_pynvml() -> GpuInfo | None:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - any NVML failure means "no usable GPU"
        return None
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return GpuInfo(str(name), int(mem.total), int(mem.free))


def _probe_nvidia_smi() -> GpuInfo | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        name, total, free = (s.strip() for s in out.strip().splitlines()[0].split(","))
        return GpuInfo(name, int(float(total)) * 2**20, int(float(free)) * 2**20)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def detect_gpu() -> GpuInfo | None:
    """GPU 0 as the driver reports it, or ``None`` when there is none."""
    return _probe_pynvml() or _probe_nvidia_smi()


def auto_budget(gpu: GpuInfo | None = None) -> int:
    """Free VRAM minus a margin (max of 512 MiB and 5 %); :class:`PlanError` with no GPU."""
    gpu = gpu if gpu is not None else detect_gpu()
    if gpu is None:
        raise PlanError(
            "--vram-budget auto needs a GPU, and none was found (no pynvml, no nvidia-smi or no "
            "device); give the budget as a size instead, e.g. --vram-budget 8GiB (0 = CPU only)"
        )
    margin = max(AUTO_MARGIN_BYTES, int(gpu.free_bytes * AUTO_MARGIN_SHARE))
    budget = max(0, gpu.free_bytes - margin)
    if budget == 0:
        raise PlanError(
            f"{gpu.name} has only {format_bytes(gpu.free_bytes)} free, less than the "
            f"{format_bytes(margin)} margin; give --vram-budget explicitly"
        )
    return budget


__all__ = ["AUTO_MARGIN_BYTES", "GpuInfo", "auto_budget", "detect_gpu"]
