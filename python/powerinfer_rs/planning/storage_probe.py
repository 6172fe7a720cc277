"""The storage probe: how fast the disk that will hold a neuron store reads, for the plan's RAM
tier (:mod:`.ram_tier`) and the hardware profile's ``storage_read_bw`` / ``storage_iops``.

Two measurements on an existing file (the model, or the store itself), with its pages dropped
from the page cache first and ``O_DIRECT`` where the file system takes it (what the store's
readers use):

- ``read_bw``: GB/s of 1 MiB reads at random aligned offsets, ``depth`` in flight;
- ``iops``: reads per second of ``read_bytes`` (a store cluster's size) at random aligned
  offsets, ``depth`` in flight (the store reads with several threads: 8 by default).

The reads are the neuron store's own (``_core.probe_storage_reads``: its reader threads, in
waves of four reads per thread), each test for about ``seconds``; a ModelFileError from them
is raised as it is. A file smaller than 64 MiB is refused: the numbers would
be the page cache's or the drive cache's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import PlanError

#: Files smaller than this measure a cache, not the storage.
MIN_PROBE_FILE = 64 << 20
#: Alignment of the reads (O_DIRECT's, and the store's).
_ALIGN = 4096


@dataclass(frozen=True)
class StorageProbe:
    """What :func:`probe_storage` measured."""

    #: GB/s of 1 MiB reads, ``depth`` in flight.
    read_bw: float
    #: Reads per second of ``read_bytes``, ``depth`` in flight.
    iops: float
    read_bytes: int
    depth: int
    #: Whether the reads bypassed the page cache.
    direct: bool
    path: str


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def probe_storage(
    path: str | os.PathLike[str],
    *,
    read_bytes: int = 12 << 10,
    depth: int = 8,
    seconds: float = 2.0,
) -> StorageProbe:
    """Measure the storage holding ``path`` (see the module doc). :class:`PlanError` for a
    missing or too small file or bad arguments."""
    p = Path(path)
    if not p.is_file():
        raise PlanError(f"{p}: no file to probe the storage with")
    size = p.stat().st_size
    if size < MIN_PROBE_FILE:
        raise PlanError(
            f"{p}: {size} bytes is too small to probe the storage with (at least "
            f"{MIN_PROBE_FILE >> 20} MiB: a smaller file measures a cache); name the model file"
        )
    if read_bytes <= 0 or read_bytes % _ALIGN or depth < 1 or not seconds > 0:
        raise PlanError(
            f"probe: read_bytes must be a positive multiple of {_ALIGN}, depth and seconds "
            f"positive (got {read_bytes}, {depth}, {seconds})"
        )
    from .. import _core

    try:
        _drop(p)
        n, dt, direct = _core.probe_storage_reads(str(p), 1 << 20, depth, seconds)
        read_bw = n * (1 << 20) / dt / 1e9
        _drop(p)
        n, dt, direct = _core.probe_storage_reads(str(p), read_bytes, depth, seconds)
        iops = n / dt
    except OSError as e:
        raise PlanError(f"{p}: probing the storage failed: {e}") from None
    return StorageProbe(read_bw, iops, read_bytes, depth, direct, str(p))


__all__ = ["MIN_PROBE_FILE", "StorageProbe", "probe_storage"]
