"""Where an engine's weights live: borrowed from the file's memory map, or copied onto huge pages.

A memory-mapped GGUF sits on 4 KiB pages. The sparse modes read a few kilobytes here and there
across a layer (one up row of a 2048-wide F16 matrix is exactly one page), so with 4 KiB pages
nearly every row read misses the TLB and the hardware prefetcher stops at each page boundary.
Copied into anonymous memory advised ``MADV_HUGEPAGE`` (Rust, ``powerinfer_core::pages``) a layer
is a handful of 2 MiB pages. Measured (one process, both engines alternating, 5 runs each, 2
threads): PowerInfer-format F16 file at 10% predicted active (dim 2048, 8 layers, synthetic),
predictor mode 120.0 -> 130.7 tok/s (+9%; +7% at 1 thread); the Q4_0 file +2%; dense F16 and
Q4_0 +2-3%; exact-relu +0-5%. Loading the F16 file (940 MB) takes 0.29 s instead of 0.17 s, or
seconds while the kernel compacts memory to find huge pages.

The copy costs resident memory the kernel cannot drop and re-read from the file under memory
pressure, so the default (``mmap=None``) copies only where that is cheap: Linux with transparent
huge pages available (``always`` or ``madvise``) and weights at most half of ``MemAvailable``,
or of what the process's memory cgroup leaves (its limit less its usage, v1 or v2), whichever
is less: in a container or a cgroup with a memory limit, a copy the host could hold can kill
the process.
``mmap=True`` always maps (zero copy), ``mmap=False`` always copies.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ShapeError

#: Copy by default only when the weights take at most this share of the available memory.
MAX_SHARE_OF_AVAILABLE = 0.5

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MEMINFO = Path("/proc/meminfo")
SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: A cgroup v1 limit at or above this is "no limit" (the kernel's page-rounded LONG_MAX).
NO_LIMIT = 1 << 62


def huge_pages_available(path: Path = THP_ENABLED) -> bool:
    """Whether the kernel grants transparent huge pages to memory advised ``MADV_HUGEPAGE``
    (the selected mode in ``enabled`` is ``always`` or ``madvise``)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


def cgroup_memory_left(self_cgroup: Path = SELF_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """Bytes the process's memory cgroup leaves (limit less usage; v2 ``memory.max`` /
    ``memory.current``, v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``), or None
    without a limit (or where it cannot be read)."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2
            base, files = root / rel.lstrip("/"), ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = (
                root / "memory" / rel.lstrip("/"),
                (
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                ),
            )
        else:
            continue
        try:
            limit_s = (base / files[0]).read_text().strip()
            if limit_s == "max" or int(limit_s) >= NO_LIMIT:
                continue
            used = int((base / files[1]).read_text().strip())
            return max(0, int(limit_s) - used)
        except (OSError, ValueError):
            continue
    return None


def available_memory(path: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in bytes, or what the process's memory cgroup leaves where that is
    less (:func:`cgroup_memory_left`); None where /proc/meminfo has none."""
    avail = None
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        return None
    left = cgroup_memory_left()
    if avail is not None and left is not None:
        avail = min(avail, left)
    return avail


def copy_weights(mmap: object, weight_bytes: int) -> bool:
    """Whether to copy ``weight_bytes`` of weights onto huge pages, for the ``mmap`` argument
    (True: map, False: copy, None: decide as the module says). Anything else is a ShapeError."""
    if mmap is not None and not isinstance(mmap, bool):
        raise ShapeError(f"mmap must be True, False or None (automatic), got {mmap!r}")
    if mmap is not None:
        return not mmap
    if not huge_pages_available():
        return False
    avail = available_memory()
    return avail is not None and weight_bytes <= MAX_SHARE_OF_AVAILABLE * avail


def room_for_packed_experts(mmap: object, weight_bytes: int) -> bool:
    """Whether a mixture of experts decoded dense on the CPU gets an interleaved copy of its
    experts for the decode pass (``_core.Model(..., interleave_ffn=True)``): a second copy of
    most of the weights beside the file's map, so only where a copy is what ``mmap`` asks for
    (``False``) or, by default (``None``), where the weights take at most half the available
    memory (huge pages or not); never with ``mmap=True`` (zero copy, a model bigger than RAM
    on a neuron store)."""
    if mmap is not None:
        return mmap is False
    avail = available_memory()
    return avail is not None and weight_bytes <= MAX_SHARE_OF_AVAILABLE * avail
