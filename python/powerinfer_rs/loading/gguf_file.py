"""A small, strict GGUF (v2/v3, little-endian) parser over a read-only memory map.

``gguf.GGUFReader`` takes seconds on a 50k-token vocabulary (it builds a numpy view per
string); this parser reads the same header with ``struct`` in a fraction of that, and every
malformed byte sequence ends in a :class:`ModelFileError` instead of whatever exception the
read happened to hit. Tensor data is never read here: callers slice :attr:`GGUFFile.data`.

Layout: magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count; key/value pairs
(string key, u32 type, value); tensor infos (string name, u32 n_dims, u64 dims innermost first,
u32 ggml type, u64 offset relative to the data section); padding to ``general.alignment``
(default 32); the data section.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelFileError, PowerInferError, UnsupportedError
from .regular_file import regular_file

MAGIC = b"GGUF"
#: PowerInfer's files: a GGUF file whose first four bytes were overwritten with this magic.
POWERINFER_MAGIC = b"PWRI"


def starts_with(path: str | os.PathLike[str], magic: bytes) -> bool:
    """Whether ``path`` is a readable file whose first bytes are ``magic``."""
    try:
        with open(regular_file(path), "rb") as f:
            return f.read(len(magic)) == magic
    except (OSError, PowerInferError):
        return False


DEFAULT_ALIGNMENT = 32

# GGUF value types: id -> (struct format, size) for scalars.
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NP_TYPES: dict[int, str] = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "<u1",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9

#: ggml type id -> (name, elements per block, bytes per block), as ggml's ``type_traits``
#: (and ``gguf.GGML_QUANT_SIZES``) have them, for the types this project knows by name.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}
#: ggml type id -> name.
GGML_TYPE_NAMES: dict[int, str] = {i: t[0] for i, t in GGML_TYPES.items()}


@dataclass
class GGUFTensorInfo:
    """Where one tensor lives: name, dims (innermost first), ggml type, absolute byte offset."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    offset: int
    #: bytes of the tensor's data (None for a type id not in :data:`GGML_TYPES`)
    nbytes: int | None = None
    #: which shard of a split model holds it (from 0; :mod:`.gguf_split`), its offset being
    #: into that shard
    shard: int = 0

    @property
    def type_name(self) -> str:
        """The ggml type name (``"Q4_1"``), or ``"type<N>"`` for an unknown id."""
        return GGML_TYPE_NAMES.get(self.type_id, f"type{self.type_id}")


class _Cursor:
    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(f"{self.path}: GGUF header runs past the end of the file")

    def scalar(self, vtype: int) -> Any:
        fmt, size = _SCALARS[vtype]
        self.need(size)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.scalar(10)
        self.need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            return str(raw, "utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY and depth < 2:
            sub = self.scalar(4)
            count = self.scalar(10)
            if sub in _NP_TYPES:
                size = _SCALARS[sub][1]
                self.need(count * size)
                arr = np.frombuffer(self.buf, dtype=_NP_TYPES[sub], count=count, offset=self.pos)
                self.pos += count * size
                out = arr.tolist()
                return [bool(x) for x in out] if sub == 7 else out
            if sub == _STRING:
                self.need(count * 8)  # every string has at least its 8-byte length
                return [self.string() for _ in range(count)]
            if sub == _ARRAY:
                self.need(count * 12)
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
        raise ModelFileError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")


class GGUFFile:
    """A parsed GGUF file: :attr:`metadata` (key -> Python value), :attr:`tensors` (infos in
    file order) and :attr:`data` (the whole file as a read-only ``np.memmap`` of bytes).

    ``allow_powerinfer=True`` also accepts PowerInfer's ``PWRI`` magic (otherwise the same
    layout); :attr:`magic` says which one the file has.
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_powerinfer: bool = False) -> None:
        self.path = os.fspath(path)
        self._magics = (MAGIC, POWERINFER_MAGIC) if allow_powerinfer else (MAGIC,)
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise ModelFileError(f"{self.path}: cannot read: {e}") from e
        if size < 24:
            raise ModelFileError(f"{self.path}: too short for a GGUF file")
        try:
            self.data: np.memmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise ModelFileError(f"{self.path}: cannot memory-map: {e}") from e
        cur = _Cursor(memoryview(self.data), self.path)
        try:
            self._parse(cur)
        except (ModelFileError, UnsupportedError):
            raise
        except (struct.error, ValueError, OverflowError, MemoryError) as e:
            raise ModelFileError(f"{self.path}: malformed GGUF header: {e}") from e

    def _parse(self, cur: _Cursor) -> None:
        self.magic = bytes(cur.buf[:4])
        if self.magic not in self._magics:
            raise ModelFileError(f"{self.path}: not a GGUF file (bad magic)")
        cur.pos = 4
        self.version = cur.scalar(4)
        if self.version not in (2, 3):
            if self.version & 0xFFFF == 0:
                raise UnsupportedError(f"{self.path}: big-endian GGUF files are not supported")
            raise UnsupportedError(f"{self.path}: GGUF version {self.version} (supported: 2, 3)")
        n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
        if n_kv * 12 > cur.size or n_tensors * 24 > cur.size:
            raise ModelFileError(f"{self.path}: GGUF header counts exceed the file size")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in self.metadata:
                raise ModelFileError(f"{self.path}: duplicate GGUF key {key!r}")
            self.metadata[key] = cur.value(cur.scalar(4))
        infos: list[tuple[str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar(4)
            if not 1 <= n_dims <= 4:
                raise ModelFileError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(cur.scalar(10) for _ in range(n_dims))
            infos.append((name, dims, cur.scalar(4), cur.scalar(10)))
        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ModelFileError(f"{self.path}: bad general.alignment {align!r}")
        self.alignment = align
        self.data_start = -(-cur.pos // align) * align
        if infos and self.data_start > cur.size:
            raise ModelFileError(f"{self.path}: the data section starts past the end of the file")
        self.tensors: list[GGUFTensorInfo] = []
        seen: set[str] = set()
        for name, dims, type_id, rel in infos:
            if name in seen:
                raise ModelFileError(f"{self.path}: duplicate tensor {name!r}")
            seen.add(name)
            nbytes = self._tensor_bytes(name, dims, type_id, rel, cur.size)
            self.tensors.append(GGUFTensorInfo(name, dims, type_id, self.data_start + rel, nbytes))
        self._check_overlaps()

    def _tensor_bytes(
        self, name: str, dims: tuple[int, ...], type_id: int, rel: int, size: int
    ) -> int | None:
        """The byte size of a tensor, after checking its offset (``rel``, relative to the data
        section) against the alignment, its row against its type's block size and its bytes
        against the end of the file -- as llama.cpp's ``gguf.c`` does."""
        what = f"{self.path}: tensor {name!r}"
        if rel % self.alignment:
            raise ModelFileError(
                f"{what} starts at data offset {rel}, not a multiple of the file's alignment "
                f"{self.alignment} (corrupt tensor table?)"
            )
        if type_id not in GGML_TYPES:
            if self.data_start + rel > size:
                raise ModelFileError(f"{what} starts past the end of the file (truncated?)")
            return None  # unknown layout: the loader refuses the type if it needs the tensor
        type_name, block, block_bytes = GGML_TYPES[type_id]
        if dims[0] % block:
            raise ModelFileError(
                f"{what}: a {type_name} row needs a multiple of {block} elements, has {dims[0]}"
            )
        n = block_bytes * (dims[0] // block)
        for d in dims[1:]:
            n *= d
        if self.data_start + rel + n > size:
            raise ModelFileError(
                f"{what} ({n} bytes at data offset {rel}) extends past the end of the file "
                "(truncated?)"
            )
        return n

    def _check_overlaps(self) -> None:
        """No two tensors share a byte."""
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in self.tensors if t.nbytes)
        for (_, end_a, a), (start_b, _, b) in zip(spans, spans[1:]):
            if start_b < end_a:
                raise ModelFileError(
                    f"{self.path}: tensors {a!r} and {b!r} overlap in the file "
                    "(corrupt tensor table?)"
                )

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r}, version={self.version}, tensors={len(self.tensors)})"


def gguf_metadata(source: Any) -> dict[str, Any]:
    """Metadata as plain Python values from a :class:`GGUFFile` or a ``gguf.GGUFReader``."""
    if isinstance(source, GGUFFile):
        return source.metadata
    out: dict[str, Any] = {}
    for key, fld in source.fields.items():
        try:
            out[key] = fld.contents()
        except Exception as e:
            raise ModelFileError(f"GGUF metadata key {key!r} is malformed: {e}") from e
    return out
