"""gpt-oss Hugging Face checkpoints (transformers' ``gpt_oss``): the config's expert settings and
layer pattern, and the experts as the checkpoint stores them, turned into the engine's merged
tensors as llama.cpp's converter (conversion/gpt_oss.py) turns them into its GGUF.

The experts of layer N are ``model.layers.N.mlp.experts.*``: ``gate_up_proj`` (n_expert x dim x
2·width, gate and up interleaved by column: gate ``[..., ::2]``, up ``[..., 1::2]``) with its
bias (n_expert x 2·width, interleaved the same way) and ``down_proj`` (n_expert x width x dim)
with its bias (n_expert x dim), stored bf16/f32 -- or, as openai/gpt-oss-20b ships them, MXFP4:
``gate_up_proj_blocks`` (n_expert x 2·width x dim/32 x 16 bytes, two 4-bit codes a byte, low
nibble first) with ``gate_up_proj_scales`` (n_expert x 2·width x dim/32 E8M0 exponents), rows
interleaved gate/up, and ``down_proj_blocks`` / ``_scales`` of n_expert x dim rows. MXFP4 blocks
are repacked to ggml's MXFP4 (the exponent byte, then 16 bytes whose low nibbles are codes
0..15 and high nibbles 16..31): the same codes and exponents, no rounding. Float experts are
transposed to the engine's rows (one copy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from .safetensors_mmap import RawTensor
from .types import TensorData

#: numpy views of the safetensors dtypes an expert tensor may have.
_VIEW = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U8": np.uint8}
#: The experts' parameter path after ``model.layers.N.``.
EXPERTS = "mlp.experts."


def gptoss_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """GptOssConfig's expert settings (``num_local_experts`` experts of ``intermediate_size``,
    ``num_experts_per_tok`` per token; ``swiglu_limit``, which GptOssConfig does not declare
    and the modeling code fixes at 7.0, read where config.json has it) and its layer pattern:
    ``layer_types`` must slide on the even layers (the only pattern llama.cpp runs)."""

    def count(key: str) -> int:
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ModelFileError(f"config.json: {key!r} must be a positive integer, got {v!r:.80}")
        return v

    types = cfg.get("layer_types")
    if types is not None:
        want = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(len(types))]
        if types != want:
            raise UnsupportedError(f"gpt-oss layer_types {types!r:.200} (not even layers sliding)")
    limit = cfg.get("swiglu_limit", 7.0)
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
        raise ModelFileError(f"config.json: 'swiglu_limit' must be positive, got {limit!r:.80}")
    return {
        "n_expert": count("num_local_experts"),
        "n_expert_used": count("num_experts_per_tok"),
        "expert_ffn_dim": count("intermediate_size"),
        "swiglu_limit": float(limit),
    }


def _array(rt: RawTensor, ndim: int, source: str) -> np.ndarray:
    """``rt``'s values as a typed array of its shape (a view)."""
    if rt.dtype not in _VIEW or len(rt.shape) != ndim:
        raise ShapeError(f"{source}: tensor {rt.name!r} is {rt.dtype} {list(rt.shape)}")
    return np.asarray(rt.data).view(_VIEW[rt.dtype]).reshape(rt.shape)


def _data(name: str, dtype: str, x: np.ndarray) -> TensorData:
    """``x`` (n x rows x cols values, or n x rows x blocks x 17 MXFP4 bytes) as one merged
    tensor of n·rows rows (a vector where ``x`` is 2-D)."""
    raw = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    if x.ndim == 2:
        return TensorData(name, dtype, 1, x.size, raw)
    cols = x.shape[2] * 32 if dtype == "MXFP4" else x.shape[2]
    return TensorData(name, dtype, x.shape[0] * x.shape[1], cols, raw)


def ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' MXFP4 (``blocks`` ... x 16 bytes, low nibble the even code; ``scales`` ...
    the exponents) as ggml's blocks (... x 17: the exponent, then code j | code j+16 << 4)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8)


def hf_mxfp4(ggml: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`ggml_mxfp4`: ggml's blocks as transformers' (blocks, scales)."""
    qs = ggml[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), np.ascontiguousarray(ggml[..., 0])


def _take(raw: dict[str, RawTensor], name: str, ndim: int, source: str) -> tuple[str, np.ndarray]:
    """Tensor ``name`` out of ``raw``: (its dtype, its values)."""
    rt = raw.pop(name, None)
    if rt is None:
        raise ModelFileError(f"{source}: tensor {name!r} is missing")
    return rt.dtype, _array(rt, ndim, source)


def _layer_experts(raw: dict[str, RawTensor], i: int, source: str) -> dict[str, TensorData]:
    """Layer ``i``'s experts and their biases, in the engine's names."""
    p, b = f"model.layers.{i}.{EXPERTS}", f"blk.{i}."
    parts: dict[str, tuple[str, np.ndarray]] = {}
    if p + "gate_up_proj_blocks" in raw:
        gu = ggml_mxfp4(
            _take(raw, p + "gate_up_proj_blocks", 4, source)[1],
            _take(raw, p + "gate_up_proj_scales", 3, source)[1],
        )
        down = ggml_mxfp4(
            _take(raw, p + "down_proj_blocks", 4, source)[1],
            _take(raw, p + "down_proj_scales", 3, source)[1],
        )
        parts.update(gate=("MXFP4", gu[:, 0::2]), up=("MXFP4", gu[:, 1::2]), down=("MXFP4", down))
    else:
        dt, gu = _take(raw, p + "gate_up_proj", 3, source)
        gu = gu.transpose(0, 2, 1)  # n x 2·width x dim
        dd, down = _take(raw, p + "down_proj", 3, source)
        parts.update(
            gate=(dt, gu[:, 0::2]), up=(dt, gu[:, 1::2]), down=(dd, down.transpose(0, 2, 1))
        )
    bt, gub = _take(raw, p + "gate_up_proj_bias", 2, source)
    parts.update({"gate.bias": (bt, gub[:, 0::2]), "up.bias": (bt, gub[:, 1::2])})
    parts["down.bias"] = _take(raw, p + "down_proj_bias", 2, source)
    out = {}
    for x, (dt, v) in parts.items():
        proj, _, bias = x.partition(".")
        name = b + f"ffn_{proj}_exps" + (".bias" if bias else "")
        out[name] = _data(name, dt, v)
    return out


def gptoss_experts(raw: dict[str, RawTensor], n_layers: int, source: str) -> dict[str, TensorData]:
    """Every layer's experts (``raw``: the checkpoint's ``mlp.experts.*`` tensors by full name)
    as the engine's ``blk.N.ffn_{gate,up,down}_exps`` and their ``.bias`` vectors."""
    out: dict[str, TensorData] = {}
    for i in range(n_layers):
        out.update(_layer_experts(raw, i, source))
    if raw:
        raise UnsupportedError(f"{source}: expert tensors {sorted(raw)[:4]} (not gpt-oss's)")
    return out
