"""Which format each tensor of a synthetic GGUF file is stored in, and its encoding.

A whole-file dtype ("Q8_0", "Q4_K", ...) stores every 2-D weight in it; a K-quant tensor whose
rows are not a whole number of 256-weight super-blocks falls back to a 32-weight format as
llama.cpp's quantizer does (Q2_K, Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0;
IQ4_XS -> IQ4_NL; TQ1_0, TQ2_0 -> Q4_0; Q2_0, of 64-weight blocks, -> Q4_0 too).
The mix "Q4_K_M" follows llama.cpp's recipe in its main lines: Q6_K for the output head and for
``attn_v`` / ``ffn_down`` of the first and last eighth of the layers and every third layer in
between, Q4_K elsewhere. Legacy formats are encoded by gguf-py, K-quants, the table formats
(IQ4_NL, IQ4_XS, MXFP4), the ternary ones (TQ1_0, TQ2_0) and the low-bit ones (NVFP4, Q1_0,
Q2_0) by our own encoder (``_core.quantize``, ggml's reference rounding; gguf-py has none for
most of them).
"""

from __future__ import annotations

import numpy as np

#: Per-tensor formats a file can be written in.
TENSOR_DTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
K_DTYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
#: The table formats (4-bit indices into 16 non-linear values).
TABLE_DTYPES = ("IQ4_NL", "IQ4_XS", "MXFP4")
#: The ternary formats ({-1, 0, 1} times a scale per 256 weights).
TERNARY_DTYPES = ("TQ1_0", "TQ2_0")
#: The low-bit formats (E2M1 values with a UE4M3 scale per 16; signs or 2-bit codes times an f16
#: scale per 128 or 64).
LOWBIT_DTYPES = ("NVFP4", "Q1_0", "Q2_0")
#: Whole-file dtypes: one format, or a mix.
GGUF_DTYPES = (
    *TENSOR_DTYPES,
    *K_DTYPES,
    *TABLE_DTYPES,
    *TERNARY_DTYPES,
    *LOWBIT_DTYPES,
    "Q4_K_M",
)
#: general.file_type values (llama.cpp's llama_ftype).
GGUF_FILE_TYPE = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q8_0": 7,
    "Q5_0": 8,
    "Q5_1": 9,
    "Q2_K": 10,
    "Q3_K": 12,
    "Q4_K": 14,
    "Q4_K_M": 15,
    "Q5_K": 16,
    "Q6_K": 18,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
    "MXFP4": 38,
    "TQ1_0": 36,
    "TQ2_0": 37,
    "NVFP4": 39,
    "Q1_0": 40,
    "Q2_0": 41,
}
K_FALLBACK = {
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "IQ4_XS": "IQ4_NL",
    "TQ1_0": "Q4_0",
    "TQ2_0": "Q4_0",
    # Q2_0's blocks are 64 weights; NVFP4 and Q1_0 have no fallback in llama.cpp (it refuses
    # their tensors of other row lengths).
    "Q2_0": "Q4_0",
}


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers, every third
    layer in between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_dtype(file_dtype: str, name: str, cols: int, n_layers: int) -> str:
    """The format of 2-D tensor ``name`` (canonical, ``blk.{i}.ffn_down``) with rows of ``cols``
    weights in a file of ``file_dtype``."""
    dt = file_dtype
    if file_dtype == "Q4_K_M":
        dt = "Q4_K"
        if name == "output":
            dt = "Q6_K"
        elif name.endswith(("attn_v", "ffn_down", "ffn_down_exps", "ffn_down_shexp")):
            layer = int(name.split(".")[1])
            dt = "Q6_K" if _more_bits(layer, n_layers) else "Q4_K"
    if dt in K_FALLBACK and cols % (64 if dt == "Q2_0" else 256):
        dt = K_FALLBACK[dt]
    return dt


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` (2-D float32) in ``dtype``: float arrays for F32/F16, raw block bytes otherwise."""
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "F16":
        return x.astype(np.float16)
    if dtype in (*K_DTYPES, *TABLE_DTYPES, *TERNARY_DTYPES, *LOWBIT_DTYPES):
        from .. import _core

        return _core.quantize(dtype, np.ascontiguousarray(x, dtype=np.float32))
    import gguf

    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[dtype])
