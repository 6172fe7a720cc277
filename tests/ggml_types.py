"""ggml's own decoders and reference encoders of a weight format, called in llama-cpp-python's
``libggml-base.so`` through ctypes (``ggml_get_type_traits(type)->to_float`` and
``->from_float_ref``, by :mod:`powerinfer_rs.testing.ggml_quantizer`): the reference for formats
gguf-py has no numpy code for (Q1_0, Q2_0), independent of the Rust decoders they check; and
llama.cpp's quantizer with tensor-type overrides."""

from __future__ import annotations

import ctypes

import numpy as np

from powerinfer_rs.testing.ggml_quantizer import (
    GGML_TYPES,
    ggml_dequantize,
    ggml_quantize_ref,
    ggml_traits,
)

#: ggml type ids (ggml.h's ``enum ggml_type``) of the formats read here.
GGML_TYPE = {k: GGML_TYPES[k] for k in ("NVFP4", "Q1_0", "Q2_0")}


def to_float(dtype: str, raw: np.ndarray, cols: int) -> np.ndarray:
    """``raw`` (rows of ``dtype``, uint8) decoded by ggml: float32 ``(rows, cols)``."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    t = ggml_traits(dtype)
    rows = raw.size // (cols // t.blck_size * t.type_size)
    return ggml_dequantize(dtype, raw.tobytes(), rows * cols).reshape(rows, cols)


def from_float(dtype: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float32 rows) encoded by ggml's reference quantizer: uint8 ``(rows, row_bytes)``."""
    return ggml_quantize_ref(dtype, x)


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
