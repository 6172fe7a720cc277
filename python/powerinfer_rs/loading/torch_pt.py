"""Read and write PyTorch ``.pt`` files (``torch.save``'s zip format) without torch.

The format (torch >= 1.6): a ZIP archive, entries stored uncompressed under one top folder
``NAME/``: ``data.pkl`` (a pickle of the saved object), ``data/<key>`` (raw little-endian bytes
of each storage), ``version`` and ``byteorder``. Inside the pickle a tensor is
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)``, and
each storage is a *persistent id* ``("storage", torch.FloatStorage, key, location, numel)``.

:func:`load_pt` unpickles with an allow-list: only the callables a tensor or state dict needs
(``torch._utils._rebuild_tensor_v2`` / ``_rebuild_tensor`` / ``_rebuild_parameter``,
``collections.OrderedDict``, ``torch.Size`` and the typed storage classes) resolve, to our own
stand-ins; anything else -- arbitrary code in a hostile file -- is refused with
:class:`~powerinfer_rs.errors.ModelFileError`. Tensors come back as numpy arrays (bfloat16 as
float32). Legacy (pre-1.6, non-zip) files are :class:`~powerinfer_rs.errors.UnsupportedError`.

:func:`save_pt` writes the same format (protocol-2 pickle emitted opcode by opcode, data
64-byte aligned as torch does) for an array or a ``{name: array}`` state dict, so tests can
make PowerInfer-style files that ``torch.load`` reads.
"""

from __future__ import annotations

import io
import lzma
import math
import os
import pickle
import struct
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError, PowerInferError, UnsupportedError
from .pickle_ops import global_op, int_op, tuple_op, unicode_op
from .regular_file import regular_file

#: torch storage class name -> numpy dtype of its elements.
STORAGE_DTYPES: dict[str, np.dtype] = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"),
    "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
_NP_TO_STORAGE = {
    np.dtype("<f4"): "FloatStorage",
    np.dtype("<f2"): "HalfStorage",
    np.dtype("<f8"): "DoubleStorage",
    np.dtype("<i8"): "LongStorage",
    np.dtype("<i4"): "IntStorage",
    np.dtype("<i2"): "ShortStorage",
    np.dtype("i1"): "CharStorage",
    np.dtype("u1"): "ByteStorage",
    np.dtype("?"): "BoolStorage",
}
MAX_PICKLE_BYTES = 64 << 20
#: What :mod:`zipfile` raises on a malformed archive besides ``BadZipFile``: a corrupt deflate
#: stream (``zlib.error``) or LZMA stream (``lzma.LZMAError``: an entry that claims LZMA with
#: invalid filter properties, found by the fuzz smoke), an unsupported zip version or
#: compression (``NotImplementedError``), an encrypted entry (``RuntimeError``), short reads and
#: bad fields (the rest).
ZIP_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
    struct.error,
    OverflowError,
)


# --------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class _StorageType:
    name: str

    @property
    def dtype(self) -> np.dtype:
        return STORAGE_DTYPES[self.name]


@dataclass
class _Storage:
    type: _StorageType
    array: np.ndarray  # 1-D, the whole storage


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFileError(f"tensor {what} must be an integer, got {type(v).__name__}")
    return v


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> np.ndarray:
    if not isinstance(storage, _Storage):
        raise ModelFileError("tensor refers to something that is not a storage")
    off = _int(offset, "offset")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride):
        raise ModelFileError("tensor size and stride must be tuples of one length")
    shape = tuple(_int(s, "size") for s in size)
    strides = tuple(_int(s, "stride") for s in stride)
    if any(s < 0 for s in shape) or any(s < 0 for s in strides) or off < 0:
        raise ModelFileError(f"negative tensor size/stride/offset: {shape} {strides} {off}")
    n = storage.array.size
    if math.prod(shape) > n:
        # only an overlapping view (a stride of 0, torch's expand) has more elements than its
        # storage; tensor files never need one, and a few bytes could ask for gigabytes
        raise ModelFileError(
            f"tensor of size {shape} has more elements than its storage of {n} (overlapping "
            "or expanded views are not supported)"
        )
    if 0 not in shape:
        last = off + sum((d - 1) * st for d, st in zip(shape, strides))
        if last >= n:
            raise ModelFileError(
                f"tensor of size {shape}, stride {strides}, offset {off} reads past its "
                f"storage of {n} elements"
            )
    base = storage.array[off:] if off < n else storage.array[:0]
    item = storage.array.itemsize
    view = np.lib.stride_tricks.as_strided(
        base, shape=shape, strides=tuple(s * item for s in strides), writeable=False
    )
    out = np.array(view)  # own, contiguous copy
    if storage.type.name == "BFloat16Storage":
        out = (out.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    return data


def _torch_size(*args: Any) -> tuple:
    return tuple(args[0]) if args else ()


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, zf: zipfile.ZipFile, prefix: str, path: str) -> None:
        super().__init__(io.BytesIO(data))
        self.zf, self.prefix, self.path = zf, prefix, path
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        allowed: dict[tuple[str, str], Any] = {
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
            ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
            ("collections", "OrderedDict"): OrderedDict,
            ("torch", "Size"): _torch_size,
        }
        if (module, name) in allowed:
            return allowed[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise ModelFileError(
            f"{self.path}: the pickle refers to {module}.{name}, which a tensor file does not "
            "need (refused: only tensors, storages and OrderedDict are loaded)"
        )

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ModelFileError(f"{self.path}: unknown persistent id {pid!r:.80}")
        _, stype, key, _location, numel = pid
        if not isinstance(stype, _StorageType) or not isinstance(key, str):
            raise ModelFileError(f"{self.path}: malformed storage reference {pid!r:.80}")
        numel = _int(numel, "storage size")
        if key in self.storages:
            return self.storages[key]
        name = f"{self.prefix}data/{key}"
        try:
            info = self.zf.getinfo(name)
        except KeyError:
            raise ModelFileError(f"{self.path}: storage record {name!r} is missing") from None
        need = numel * stype.dtype.itemsize
        if numel < 0 or info.file_size < need:
            raise ModelFileError(
                f"{self.path}: storage {name!r} has {info.file_size} bytes, {need} needed"
            )
        raw = self.zf.read(name)
        arr = np.frombuffer(raw, dtype=stype.dtype, count=numel)
        st = _Storage(stype, arr)
        self.storages[key] = st
        return st


def load_pt(path: str | os.PathLike[str]) -> Any:
    """Load a ``torch.save`` zip file: tensors become numpy arrays, state dicts dicts."""
    p = regular_file(path)
    try:
        zf = zipfile.ZipFile(p)
    except FileNotFoundError:
        raise ModelFileError(f"{p}: no such file") from None
    except ZIP_ERRORS as e:
        try:
            with open(p, "rb") as f:
                head = f.read(2)
        except OSError:
            head = b""
        if head[:1] == b"\x80":
            raise UnsupportedError(
                f"{p}: a legacy (pre-zip, torch < 1.6) .pt file; re-save it with a current torch"
            ) from e
        raise ModelFileError(f"{p}: not a PyTorch .pt (zip) file: {type(e).__name__}: {e}") from e
    with zf:
        try:
            names = zf.namelist()
            pkls = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
            pkls = [n for n in pkls if n.count("/") <= 1]
            if len(pkls) != 1:
                raise ModelFileError(f"{p}: expected one data.pkl record, found {len(pkls)}")
            prefix = pkls[0][: -len("data.pkl")]
            if prefix + "byteorder" in names:
                order = zf.read(prefix + "byteorder").strip()
                if order != b"little":
                    raise UnsupportedError(f"{p}: byte order {order!r} (only little-endian)")
            info = zf.getinfo(pkls[0])
            if info.file_size > MAX_PICKLE_BYTES:
                raise ModelFileError(f"{p}: data.pkl is implausibly large ({info.file_size} B)")
            return _Unpickler(zf.read(pkls[0]), zf, prefix, p).load()
        except PowerInferError:
            raise
        except (
            *ZIP_ERRORS,
            pickle.UnpicklingError,
            TypeError,
            KeyError,
            IndexError,
            AttributeError,
            MemoryError,
            RecursionError,
        ) as e:
            raise ModelFileError(f"{p}: malformed .pt file: {type(e).__name__}: {e}") from e


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """:func:`load_pt` of a file holding ``{name: tensor}``; ModelFileError otherwise."""
    obj = load_pt(path)
    if not isinstance(obj, Mapping) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    ):
        raise ModelFileError(f"{os.fspath(path)}: not a state dict of tensors")
    return dict(obj)


def load_tensor(path: str | os.PathLike[str]) -> np.ndarray:
    """:func:`load_pt` of a file holding one tensor; ModelFileError otherwise."""
    obj = load_pt(path)
    if not isinstance(obj, np.ndarray):
        raise ModelFileError(f"{os.fspath(path)}: holds a {type(obj).__name__}, not a tensor")
    return obj


# --------------------------------------------------------------------------- writing
def _tensor_ops(key: str, arr: np.ndarray) -> bytes:
    stype = _NP_TO_STORAGE[arr.dtype]
    pid = (
        tuple_op(
            [
                unicode_op("storage"),
                global_op("torch", stype),
                unicode_op(key),
                unicode_op("cpu"),
                int_op(arr.size),
            ]
        )
        + b"Q"
    )
    strides, acc = [], 1
    for d in reversed(arr.shape):
        strides.append(acc)
        acc *= d
    args = tuple_op(
        [
            pid,
            int_op(0),
            tuple_op([int_op(d) for d in arr.shape]),
            tuple_op([int_op(s) for s in reversed(strides)]),
            b"\x89",  # requires_grad = False
            global_op("collections", "OrderedDict") + b")R",
        ]
    )
    return global_op("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def _normalise(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    dt = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
    if dt not in _NP_TO_STORAGE:
        raise UnsupportedError(f"cannot save dtype {a.dtype} to a .pt file")
    return np.array(a, dtype=dt, order="C")  # (ascontiguousarray would make 0-d 1-d)


def save_pt(path: str | os.PathLike[str], obj: np.ndarray | Mapping[str, np.ndarray]) -> Path:
    """Write an array, or a ``{name: array}`` state dict (as an ``OrderedDict``), in
    ``torch.save``'s zip format. Float32/16/64, int64/32/16/8, uint8 and bool are supported."""
    out = Path(path)
    prefix = out.stem or "archive"
    tensors: list[tuple[str, np.ndarray]] = []
    if isinstance(obj, np.ndarray):
        a = _normalise(obj)
        tensors.append(("0", a))
        body = _tensor_ops("0", a)
    elif isinstance(obj, Mapping):
        items = []
        for i, (name, arr) in enumerate(obj.items()):
            if not isinstance(name, str):
                raise UnsupportedError("state dict keys must be strings")
            a = _normalise(arr)
            tensors.append((str(i), a))
            items.append(unicode_op(name) + _tensor_ops(str(i), a))
        body = global_op("collections", "OrderedDict") + b")R"
        if items:
            body += b"(" + b"".join(items) + b"u"
    else:
        raise UnsupportedError(f"save_pt takes an array or a dict of arrays, not {type(obj)}")
    pkl = b"\x80\x02" + body + b"."
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        _write_aligned(zf, f"{prefix}/data.pkl", pkl)
        _write_aligned(zf, f"{prefix}/byteorder", b"little")
        for key, a in tensors:
            _write_aligned(zf, f"{prefix}/data/{key}", a.tobytes())
        _write_aligned(zf, f"{prefix}/version", b"3\n")
    os.replace(tmp, out)
    return out


def _write_aligned(zf: zipfile.ZipFile, name: str, data: bytes, align: int = 64) -> None:
    """Store ``data`` so its bytes start at a multiple of ``align`` (padding in the local
    header's extra field, as torch's writer does)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    start = zf.fp.tell() + 30 + len(name.encode()) + 4  # header, name, extra field header
    pad = -start % align
    info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
    zf.writestr(info, data)
