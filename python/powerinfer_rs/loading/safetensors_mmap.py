"""Read ``.safetensors`` files as raw memory-mapped byte views (no copies, bf16 included).

The format: an 8-byte little-endian header length ``n``, ``n`` bytes of JSON mapping tensor
name -> ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header) plus an optional ``"__metadata__"``, then the tensor bytes. numpy has no bfloat16, so
tensors stay ``uint8`` views of the file map and their dtype is carried as a string.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from .regular_file import regular_file

#: safetensors dtype -> bytes per element, for the dtypes the engine takes.
ITEMSIZE: dict[str, int] = {"BF16": 2, "F16": 2, "F32": 4}
#: With ``bytes_too``: also raw bytes (a predictor file's block formats).
ITEMSIZE_AND_BYTES: dict[str, int] = {**ITEMSIZE, "U8": 1}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass
class RawTensor:
    """One tensor of a safetensors file: dtype name, shape and a uint8 view of its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray


def read_header(path: str | os.PathLike[str]) -> tuple[dict, int, int]:
    """Parse the header of ``path``: ``(header dict, data start offset, file size)``."""
    p = regular_file(path)
    try:
        size = os.path.getsize(p)
        with open(p, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise ModelFileError(f"{p}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", raw_len)
            if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise ModelFileError(f"{p}: header length {n} does not fit the file (truncated?)")
            raw = f.read(n)
    except OSError as e:
        raise ModelFileError(f"{p}: cannot read: {e}") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{p}: safetensors header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise ModelFileError(f"{p}: safetensors header is not a JSON object")
    return header, 8 + n, size


def read_safetensors(
    path: str | os.PathLike[str], *, bytes_too: bool = False
) -> dict[str, RawTensor]:
    """Memory-map ``path`` and return name -> :class:`RawTensor` (views into one read-only map).

    Validates every entry (dtype, shape, offsets inside the file, byte count matching the shape);
    raises :class:`ModelFileError` for malformed files and :class:`UnsupportedError` for dtypes
    other than BF16/F16/F32 (and U8 with ``bytes_too``).
    """
    sizes = ITEMSIZE_AND_BYTES if bytes_too else ITEMSIZE
    p = os.fspath(path)
    header, start, size = read_header(p)
    data_len = size - start
    entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ModelFileError(f"{p}: entry for {name!r} is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise ModelFileError(f"{p}: tensor {name!r} has a malformed shape {shape!r}")
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
        ):
            raise ModelFileError(f"{p}: tensor {name!r} has malformed data_offsets {offs!r}")
        if not isinstance(dtype, str):
            raise ModelFileError(f"{p}: tensor {name!r} has a malformed dtype {dtype!r:.80}")
        if dtype not in sizes:
            raise UnsupportedError(
                f"{p}: tensor {name!r} has dtype {dtype!r} (supported: {', '.join(sizes)})"
            )
        begin, end = offs
        if not 0 <= begin <= end <= data_len:
            raise ModelFileError(
                f"{p}: tensor {name!r} bytes [{begin}, {end}) lie outside the file's "
                f"{data_len} data bytes (truncated?)"
            )
        if end - begin != math.prod(shape) * sizes[dtype]:
            raise ModelFileError(
                f"{p}: tensor {name!r} has {end - begin} bytes, its shape {shape} {dtype} "
                f"needs {math.prod(shape) * sizes[dtype]}"
            )
        entries.append((name, dtype, tuple(shape), begin, end))
    spans = sorted((b, e, name) for name, _, _, b, e in entries if e > b)
    for (_, end_a, a), (begin_b, _, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise ModelFileError(
                f"{p}: tensors {a!r} and {b!r} overlap in the file (corrupt header?)"
            )
    if not entries:
        return {}
    try:
        mm = np.memmap(p, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{p}: cannot memory-map: {e}") from e
    return {
        name: RawTensor(name, dtype, shape, mm[start + b : start + e])
        for name, dtype, shape, b, e in entries
    }
