"""Quantize a GGUF file with llama.cpp's own quantizer functions, an importance matrix given,
through ggml's C API (``libggml-base`` of an installed llama-cpp-python, via ctypes). For tests
of the formats that ``llama_model_quantize`` will not write without an importance matrix
(IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M): llama-cpp-python exposes no way to hand it one (its
``imatrix`` parameter is a C++ map), and ships no ``llama-quantize`` binary.

What llama.cpp's quantizer (``src/llama-quant.cpp``) does, and this does the same way:
every key of the input is copied (``gguf_set_kv``) and ``general.file_type`` and
``general.quantization_version`` set; each tensor is added (``gguf_add_tensor``) and given its
new type (``gguf_set_tensor_type``); a quantized tensor's rows are ``ggml_quantize_chunk`` of
its f32 rows with the tensor's importance vector (one per expert for a 3-D expert tensor); the
file is ggml's header (``gguf_get_meta_data``) then each tensor's bytes padded with zeros to
the alignment. Which tensors: ``types(name, shape)`` picks a type name or ``None`` (kept); the
default quantizes what llama.cpp's ``--pure`` does (every matrix but the router and norms).

The importance matrix, where none is given, is a deterministic positive vector per tensor
(seeded by its name): what llama-imatrix would record as the mean squared activation of each
input column, for a synthetic model with no corpus. :func:`ggml_dequantize` is ggml's own
``to_float`` of a type, for the formats gguf-py cannot decode.
"""

from __future__ import annotations

import ctypes
import os
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from .ggml_split import _ggml, _InitParams

#: ggml's type ids (``enum ggml_type``) by name, for the types a test may ask for.
GGML_TYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
    "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21,
    "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30, "TQ1_0": 34, "TQ2_0": 35,
    "MXFP4": 39, "NVFP4": 40, "Q1_0": 41, "Q2_0": 42,
}  # fmt: skip
#: llama.cpp's file type (``llama_ftype``) for a file mostly of one type.
FILE_TYPES = {
    "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q4_K": 15,
    "Q5_K": 17, "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20, "IQ3_XXS": 23, "IQ1_S": 24,
    "IQ4_NL": 25, "IQ3_S": 26, "IQ2_S": 28, "IQ4_XS": 30, "IQ1_M": 31, "TQ1_0": 36,
    "TQ2_0": 37, "NVFP4": 39, "Q1_0": 40, "Q2_0": 41,
}  # fmt: skip
#: ``GGML_QNT_VERSION``, which llama.cpp's quantizer writes as ``general.quantization_version``.
QNT_VERSION = 2

TypeChoice = Callable[[str, tuple[int, ...]], "str | None"]


class _TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits``."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _lib() -> ctypes.CDLL:
    """:func:`ggml_split._ggml` with the quantizer's functions typed as well."""
    lib = _ggml()
    p, i64, sz, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
    sigs = {
        "ggml_quantize_chunk": (sz, [i32, p, p, i64, i64, i64, p]),
        "ggml_quantize_requires_imatrix": (ctypes.c_bool, [i32]),
        "ggml_row_size": (sz, [i32, i64]),
        "ggml_get_type_traits": (ctypes.POINTER(_TypeTraits), [i32]),
        "gguf_set_tensor_type": (None, [p, ctypes.c_char_p, i32]),
        "gguf_set_val_u32": (None, [p, ctypes.c_char_p, ctypes.c_uint32]),
        "gguf_get_alignment": (sz, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _type_id(name: str) -> int:
    if name not in GGML_TYPES:
        raise UnsupportedError(f"ggml type {name!r} is not one of {sorted(GGML_TYPES)}")
    return GGML_TYPES[name]


def pure(dtype: str) -> TypeChoice:
    """llama.cpp's ``--pure``: every matrix in ``dtype``, but the router (``ffn_gate_inp``),
    and what is not a matrix (norms, biases, sinks) kept."""

    def choose(name: str, shape: tuple[int, ...]) -> str | None:
        return dtype if len(shape) >= 2 and "ffn_gate_inp" not in name else None

    return choose


def default_importance(name: str, n_per_row: int, n_expert: int = 1) -> np.ndarray:
    """A deterministic positive importance per input column (per expert), seeded by ``name``:
    log-normal around 1, as a mean squared activation would spread."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return np.exp(rng.normal(0.0, 0.7, size=n_per_row * n_expert)).astype(np.float32)


def _quantize(lib, type_id: int, rows: np.ndarray, imatrix: np.ndarray | None) -> bytes:
    """``ggml_quantize_chunk`` of ``rows`` (experts, rows, n_per_row) f32, one importance
    vector per expert."""
    n_expert, n_rows, n_per_row = rows.shape
    row_bytes = lib.ggml_row_size(type_id, n_per_row)
    out = ctypes.create_string_buffer(n_expert * n_rows * row_bytes)
    for e in range(n_expert):
        src = np.ascontiguousarray(rows[e], dtype=np.float32)
        imat = None
        if imatrix is not None:
            imat = np.ascontiguousarray(imatrix[e * n_per_row : (e + 1) * n_per_row])
        done = lib.ggml_quantize_chunk(
            type_id,
            src.ctypes.data,
            ctypes.addressof(out) + e * n_rows * row_bytes,
            0,
            n_rows,
            n_per_row,
            None if imat is None else imat.ctypes.data,
        )
        assert done == n_rows * row_bytes, (done, n_rows * row_bytes)
    return out.raw


def quantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    dtype: str,
    *,
    types: TypeChoice | None = None,
    imatrix: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write ``dst``: the F32 file ``src`` quantized as llama.cpp's quantizer does, its
    ``general.file_type`` that of a file mostly ``dtype``; ``types`` picks each tensor's type
    (default :func:`pure`), ``imatrix`` maps a tensor name to its importance (default
    :func:`default_importance`, given to every type that takes one)."""
    import gguf

    lib = _lib()
    choose = types or pure(dtype)
    reader = gguf.GGUFReader(os.fspath(src))
    meta = ctypes.c_void_p()
    ctx_in = lib.gguf_init_from_file(os.fsencode(src), _InitParams(True, ctypes.pointer(meta)))
    if not ctx_in:
        raise UnsupportedError(f"{src}: ggml cannot read it")
    ctx = lib.gguf_init_empty()
    lib.gguf_set_kv(ctx, ctx_in)
    lib.gguf_set_val_u32(ctx, b"general.quantization_version", QNT_VERSION)
    lib.gguf_set_val_u32(ctx, b"general.file_type", FILE_TYPES.get(dtype, 0))
    blobs = []
    for t in reader.tensors:
        name, shape = t.name, tuple(int(n) for n in t.shape)
        lib.gguf_add_tensor(ctx, lib.ggml_get_tensor(meta, name.encode()))
        want = choose(name, shape)
        if want is None or t.tensor_type != gguf.GGMLQuantizationType.F32:
            blobs.append(np.ascontiguousarray(t.data).tobytes())
            continue
        type_id = _type_id(want)
        lib.gguf_set_tensor_type(ctx, name.encode(), type_id)
        n_per_row = shape[0]
        n_expert = shape[2] if len(shape) == 3 else 1
        rows = np.asarray(t.data, dtype=np.float32).reshape(n_expert, -1, n_per_row)
        imat = (imatrix or {}).get(name)
        if imat is None:
            imat = default_importance(name, n_per_row, n_expert)
        blobs.append(_quantize(lib, type_id, rows, np.asarray(imat, dtype=np.float32)))
    head = ctypes.create_string_buffer(lib.gguf_get_meta_size(ctx))
    lib.gguf_get_meta_data(ctx, head)
    align = lib.gguf_get_alignment(ctx)
    path = Path(dst)
    with open(path, "wb") as out:
        out.write(head.raw)
        for blob in blobs:
            out.write(blob)
            out.write(b"\0" * (-len(blob) % align))
    lib.gguf_free(ctx)
    lib.gguf_free(ctx_in)
    lib.ggml_free(meta)
    return path


def ggml_traits(dtype: str) -> _TypeTraits:
    """ggml's type traits of ``dtype``, its name checked against ggml's."""
    traits = _lib().ggml_get_type_traits(_type_id(dtype)).contents
    if traits.type_name.decode().upper() != dtype:
        raise UnsupportedError(f"ggml's type {_type_id(dtype)} is {traits.type_name}, not {dtype}")
    return traits


def ggml_dequantize(dtype: str, raw: bytes, n: int) -> np.ndarray:
    """ggml's own ``to_float`` of ``n`` weights of type ``dtype`` stored in ``raw``."""
    traits = ggml_traits(dtype)
    if not traits.to_float:
        raise UnsupportedError(f"ggml has no to_float for {dtype}")
    out = np.empty(n, dtype=np.float32)
    buf = ctypes.create_string_buffer(bytes(raw), len(raw))
    _TO_FLOAT(traits.to_float)(ctypes.addressof(buf), out.ctypes.data, n)
    return out


def ggml_quantize_ref(dtype: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float32 rows) encoded by ggml's reference quantizer (``from_float_ref``): uint8
    ``(rows, row_bytes)``."""
    traits = ggml_traits(dtype)
    if not traits.from_float_ref:
        raise UnsupportedError(f"ggml has no reference encoder for {dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], x.shape[1] // traits.blck_size * traits.type_size), np.uint8)
    _TO_FLOAT(traits.from_float_ref)(x.ctypes.data, out.ctypes.data, x.size)
    return out
