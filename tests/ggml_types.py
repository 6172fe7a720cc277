"""ggml's own decoders and reference encoders of a weight format, called in llama-cpp-python's
``libggml-base.so`` through ctypes (``ggml_get_type_traits(type)->to_float`` and
``->from_float_ref``): the reference for formats gguf-py has no numpy code for (Q1_0, Q2_0),
independent of the Rust decoders they check."""

from __future__ import annotations

import ctypes
import os

import numpy as np

#: ggml type ids (ggml.h's ``enum ggml_type``) of the formats read here.
GGML_TYPE = {"NVFP4": 40, "Q1_0": 41, "Q2_0": 42}

_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", _TO_FLOAT),
        ("from_float_ref", _TO_FLOAT),
    ]


def _lib() -> ctypes.CDLL:
    import llama_cpp

    path = os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")
    lib = ctypes.CDLL(path)
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib


def traits(dtype: str) -> _Traits:
    """ggml's type traits of ``dtype`` (its name checked against ggml's)."""
    t = _lib().ggml_get_type_traits(GGML_TYPE[dtype]).contents
    assert t.type_name.decode() == dtype.lower(), t.type_name
    return t


def to_float(dtype: str, raw: np.ndarray, cols: int) -> np.ndarray:
    """``raw`` (rows of ``dtype``, uint8) decoded by ggml: float32 ``(rows, cols)``."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rows = raw.size // (cols // traits(dtype).blck_size * traits(dtype).type_size)
    out = np.empty((rows, cols), np.float32)
    traits(dtype).to_float(raw.ctypes.data, out.ctypes.data, rows * cols)
    return out


def from_float(dtype: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float32 rows) encoded by ggml's reference quantizer: uint8 ``(rows, row_bytes)``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    t = traits(dtype)
    out = np.zeros((x.shape[0], x.shape[1] // t.blck_size * t.type_size), np.uint8)
    t.from_float_ref(x.ctypes.data, out.ctypes.data, x.size)
    return out


def llama_quantize(src, dst, ftype: int, every: int | None = None) -> None:
    """``src`` (a GGUF file) quantized by llama.cpp's own quantizer (llama-cpp-python's
    ``llama_model_quantize``) into ``dst`` with file type ``ftype`` (llama_ftype); ``every``: a
    ggml type every weight takes instead (the quantizer's tensor-type overrides, as
    ``llama-quantize --tensor-type weight=<type>``)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    overrides = (llama_cpp.llama_model_tensor_override * 2)()
    if every is not None:
        overrides[0].pattern, overrides[0].type = b"weight", every
        overrides[1].pattern = None
        ptr = ctypes.POINTER(llama_cpp.llama_model_tensor_override)
        params.tt_overrides = ctypes.cast(overrides, ptr)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    assert rc == 0, f"llama_model_quantize failed: {rc}"
