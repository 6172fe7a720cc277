"""Byte sizes: parsing budget strings ("8GiB", "8GB", "512MiB", "0"), formatting, alignment."""

from __future__ import annotations

import math
import re

from ..errors import PlanError

#: Every GPU allocation the plan counts is rounded up to this many bytes (cudaMalloc returns
#: 256-byte aligned pointers; a sub-allocator must keep that alignment for the same totals).
ALIGN = 256
#: The largest VRAM budget accepted (16 TiB: more than any one GPU holds, by far).
MAX_BUDGET = 2**44

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def align(n: int, to: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``to`` (0 stays 0)."""
    return -(-int(n) // to) * to


def parse_bytes(text: str | int) -> int:
    """Parse a byte count: ``"8GiB"``, ``"8GB"``, ``"512MiB"``, ``"1.5 GiB"``, ``"0"``, ``"123"``.

    Units are case-insensitive: B, KB/MB/GB/TB (powers of 1000) and KiB/MiB/GiB/TiB (powers of
    1024); a bare number is bytes. Fractions are rounded down to whole bytes. Raises
    :class:`PlanError` for anything else (negative, NaN, unknown unit, empty).
    """
    if isinstance(text, bool):
        raise PlanError(f"not a byte count: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise PlanError(f"a byte count must not be negative, got {text}")
        return text
    m = _BYTES_RE.match(str(text))
    if not m:
        raise PlanError(f"cannot read {text!r} as a size; write e.g. 8GiB, 8GB, 512MiB or 0")
    number, unit = m.groups()
    mult = _UNITS.get(unit.lower())
    if mult is None:
        raise PlanError(
            f"unknown size unit {unit!r} in {text!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    value = float(number) * mult
    if not math.isfinite(value):
        raise PlanError(f"size {text!r} is not finite")
    return int(value)


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``format_bytes(3 * 2**30) == "3.00 GiB"``."""
    n = float(n)
    for unit, mult in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= mult:
            return f"{n / mult:.2f} {unit}"
    return f"{int(n)} B"
