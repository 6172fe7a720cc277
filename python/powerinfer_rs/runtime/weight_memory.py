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
huge pages available (``always`` or ``madvise``) and weights at most half of ``MemAvailable``.
``mmap=True`` always maps (zero copy), ``mmap=False`` always copies.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ShapeError

#: Copy by default only when the weights take at most this share of the available memory.
MAX_SHARE_OF_AVAILABLE = 0.5

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
MEMINFO = Path("/proc/meminfo")


def huge_pages_available(path: Path = THP_ENABLED) -> bool:
    """Whether the kernel grants transparent huge pages to memory advised ``MADV_HUGEPAGE``
    (the selected mode in ``enabled`` is ``always`` or ``madvise``)."""
    try:
        text = path.read_text()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


def available_memory(path: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in bytes, or None where /proc/meminfo has none."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


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
