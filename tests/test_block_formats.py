"""The block formats' Rust decoder and encoder (``_core.dequantize``, ``_core.quantize``) against
gguf-py's own numpy implementation (an independent one): random blocks of every quantised
format on odd row counts decode to the same values, and our encoder's bytes decode (by gguf-py)
to values within each format's rounding error."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import _core
from powerinfer_rs.errors import ShapeError, UnsupportedError
from powerinfer_rs.loading import BLOCK_LAYOUT

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

QUANTIZED = [d for d, (block, _) in BLOCK_LAYOUT.items() if block > 1]
#: The formats we decode but do not encode (lattice searches under an importance matrix:
#: llama.cpp writes them; ``_core.quantize`` refuses them).
DECODE_ONLY = ("IQ2_XXS", "IQ2_XS", "IQ2_S")
ENCODED = [d for d in QUANTIZED if d not in DECODE_ONLY]
#: Byte offsets of each block's f16 fields (d, and the min or dmin), as crates/core/src/dtype.rs.
F16_FIELDS = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    # MXFP4's E8M0 scale: every byte is a finite scale (subnormal for 0 and 1, 2^127 for 255).
    "MXFP4": (),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
    # NVFP4's UE4M3 scales: every byte a finite scale.
    "NVFP4": (),
    "Q1_0": (0,),
    "Q2_0": (0,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    # The lattice i-quants: random bytes with a finite d are valid blocks (every index names a
    # codebook point, every scale field a scale).
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    # IQ1_M's f16 d lies in the top nibbles of its four scale words (random_blocks writes it).
    "IQ1_M": (),
}
#: The formats we read but do not encode (``quantize`` refuses them, typed).
NO_ENCODER = ("IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
#: Largest relative RMS round-trip error of our encoder on Gaussian rows (measured 0.34, 0.17,
#: 0.084, 0.041, 0.022 for Q2_K..Q6_K on heavier-tailed rows in the Rust tests).
ROUND_TRIP = {
    "Q8_0": 0.01,
    "Q4_0": 0.12,
    "Q4_1": 0.1,
    "Q5_0": 0.06,
    "Q5_1": 0.05,
    "Q2_K": 0.4,
    "Q3_K": 0.2,
    "Q4_K": 0.1,
    "Q5_K": 0.05,
    "Q6_K": 0.025,
    "IQ4_NL": 0.1,
    "IQ4_XS": 0.1,
    "MXFP4": 0.2,
    # Ternary: d = max|x| per 256 weights, so most Gaussian weights round to 0.
    "TQ1_0": 0.9,
    "TQ2_0": 0.9,
    "NVFP4": 0.15,
    # Q1_0 keeps the signs and the mean |x| per 128 (sqrt(1 - 2/pi) = 0.6 on Gaussian rows);
    # Q2_0 has d = max|x| per 64, so most Gaussian weights round to 0.
    "Q1_0": 0.65,
    "Q2_0": 0.9,
}


def random_blocks(rng: np.random.Generator, dtype: str, rows: int, blocks: int) -> np.ndarray:
    """``rows`` rows of ``blocks`` random blocks: random bytes, finite random f16 fields."""
    size = BLOCK_LAYOUT[dtype][1]
    raw = rng.integers(0, 256, size=(rows, blocks, size), dtype=np.uint8)
    for k, at in enumerate(F16_FIELDS[dtype]):
        v = rng.uniform(-1, 1, size=(rows, blocks)).astype(np.float16) * (0.5 if k else 0.1)
        raw[:, :, at : at + 2] = v.view(np.uint8).reshape(rows, blocks, 2)
    if dtype == "IQ1_M":
        d = (rng.uniform(-1, 1, size=(rows, blocks)) * 0.1).astype(np.float16).view(np.uint16)
        for i in range(4):
            nib = ((d >> (4 * i)) & 15).astype(np.uint8)
            raw[:, :, 49 + 2 * i] = (raw[:, :, 49 + 2 * i] & 0x0F) | (nib << 4)
    return raw.reshape(rows, blocks * size)


def reference_dequantize(raw: np.ndarray, dtype: str, cols: int) -> np.ndarray:
    """gguf-py's numpy decoder, or ggml's own (through ctypes) for Q1_0 and Q2_0, which gguf-py
    has none for."""
    if dtype in ("Q1_0", "Q2_0"):
        from ggml_types import to_float

        return to_float(dtype, raw, cols)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[dtype])


@pytest.mark.parametrize("dtype", QUANTIZED)
@pytest.mark.parametrize("rows,blocks", [(1, 1), (7, 3), (13, 5)])
def test_dequantize_matches_gguf(dtype, rows, blocks):
    rng = np.random.default_rng(hash((dtype, rows)) % 2**32)
    raw = random_blocks(rng, dtype, rows, blocks)
    cols = blocks * BLOCK_LAYOUT[dtype][0]
    ours = _core.dequantize(dtype, raw, cols)
    theirs = reference_dequantize(raw, dtype, cols)
    assert ours.shape == (rows, cols)
    np.testing.assert_array_equal(ours, theirs.astype(np.float32))


@pytest.mark.parametrize("dtype", ENCODED)
def test_quantize_round_trips_through_gguf(dtype):
    rng = np.random.default_rng(5)
    rows, cols = 9, 3 * 256
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 0.05
    if dtype in NO_ENCODER:
        with pytest.raises(UnsupportedError):
            _core.quantize(dtype, x)
        return
    raw = _core.quantize(dtype, x)
    assert raw.shape == (rows, cols // BLOCK_LAYOUT[dtype][0] * BLOCK_LAYOUT[dtype][1])
    back = reference_dequantize(raw, dtype, cols)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2))
    assert rel < ROUND_TRIP[dtype], rel
    np.testing.assert_array_equal(_core.dequantize(dtype, raw, cols), back)


@pytest.mark.parametrize("dtype", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"])
def test_legacy_encoder_matches_gguf_bytes(dtype):
    """The 32-weight formats follow ggml's reference rounding; gguf-py's encoder is a port of it
    (allow a few blocks to differ by a rounding tie). gguf-py has no IQ4_NL/IQ4_XS encoder."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 320)).astype(np.float32)
    ours = _core.quantize(dtype, x)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType[dtype])
    size = BLOCK_LAYOUT[dtype][1]
    same = (ours.reshape(-1, size) == theirs.reshape(-1, size)).all(axis=1)
    assert same.mean() > 0.9, same.mean()


@pytest.mark.parametrize("dtype", ["TQ1_0", "TQ2_0"])
def test_ternary_encoder_matches_gguf_bytes(dtype):
    """The ternary formats follow ggml's reference rounding (``quantize_row_tq*_0_ref``), which
    gguf-py ports: the same bytes, block for block."""
    x = np.random.default_rng(7).standard_normal((5, 3 * 256)).astype(np.float32)
    ours = _core.quantize(dtype, x)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType[dtype])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("dtype", DECODE_ONLY)
def test_decode_only_formats_refuse_to_encode(dtype):
    with pytest.raises(UnsupportedError, match="no encoder"):
        _core.quantize(dtype, np.zeros((1, 256), np.float32))


def test_bad_inputs_are_typed_errors():
    with pytest.raises(ShapeError):
        _core.quantize("Q4_K", np.zeros((2, 576), np.float32))
    with pytest.raises(UnsupportedError):
        _core.quantize("Q8_K", np.zeros((1, 256), np.float32))
    with pytest.raises(ShapeError):
        _core.dequantize("Q6_K", np.zeros((1, 209), np.uint8), 256)
