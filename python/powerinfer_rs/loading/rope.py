"""RoPE scaling and partial rotation, as the two file formats state them.

The engine takes three config fields (:class:`.types.ModelConfig`): ``rope_dims`` (the values
of each head that rotate, 0 = all), ``rope_linear_factor`` (positions divided by it, 0 = none)
and ``rope_freq_factors`` (``rope_dims / 2`` divisors of the pairs' frequencies, empty = none).
Pair ``i`` at position ``p`` turns by ``p * theta^(-2i/rope_dims) / linear / factors[i]``;
layers with their own base (Gemma 3's sliding layers) are not scaled.

Supported:

* Llama 3.1/3.2's "llama3" scaling: in GGUF the ``rope_freqs.weight`` tensor llama.cpp's
  converter computes and llama.cpp divides each frequency by; in a Hugging Face
  ``config.json`` ``rope_scaling = {"rope_type": "llama3", factor, low_freq_factor,
  high_freq_factor, original_max_position_embeddings}``, turned into the same factors
  (:func:`llama3_factors`, HF's ``_compute_llama3_parameters`` as per-pair divisors);
* linear scaling: GGUF ``{arch}.rope.scaling.type = "linear"`` (llama.cpp's default type when
  the key is absent) with ``{arch}.rope.scaling.factor`` (or the older
  ``{arch}.rope.scale_linear``); HF ``{"rope_type"/"type": "linear", "factor": f}``;
* partial RoPE: GGUF ``{arch}.rope.dimension_count`` below the head size (llama.cpp's
  ``n_rot``), HF ``partial_rotary_factor`` (``int(head_dim * factor)`` values, HF's rule).

Refused with :class:`UnsupportedError` naming the type: YaRN, LongRoPE / "su" (and GGUF's
``rope_factors_long`` / ``rope_factors_short`` tensors), dynamic NTK and any other type.
Malformed values are typed errors: :class:`ShapeError` for a rotated size that is odd, zero or
larger than the head, or a ``rope_freqs`` tensor of the wrong length;
:class:`ModelFileError` for non-finite or non-positive factors and malformed keys.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError

#: RoPE scaling types read from files, as the engine implements them.
SUPPORTED_SCALING: tuple[str, ...] = ("linear", "llama3")
#: GGUF tensors of the scaling types the engine does not implement.
UNSUPPORTED_TENSORS: dict[str, str] = {
    "rope_factors_long": "LongRoPE (Phi-3 128k's rope_factors_long/short)",
    "rope_factors_short": "LongRoPE (Phi-3 128k's rope_factors_long/short)",
}


def _positive(v: Any, what: str) -> float:
    """``v`` as a positive finite float, else :class:`ModelFileError`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ModelFileError(f"{what} must be a positive number, got {v!r:.80}")
    return float(v)


def check_rope_dims(rope_dims: int, head_dim: int, what: str) -> int:
    """``rope_dims`` if it is even, positive and at most ``head_dim``; else ShapeError."""
    if isinstance(rope_dims, bool) or not isinstance(rope_dims, int):
        raise ModelFileError(f"{what} must be an integer, got {rope_dims!r:.80}")
    if rope_dims <= 0 or rope_dims % 2 or rope_dims > head_dim:
        raise ShapeError(
            f"{what}: RoPE over {rope_dims} values of each head of {head_dim}; it needs an "
            "even number, at least 2 and at most the head size"
        )
    return rope_dims


def check_freq_factors(factors: Any, rope_dims: int, what: str) -> list[float]:
    """``factors`` as a list of ``rope_dims / 2`` positive finite floats: ShapeError for the
    wrong count, ModelFileError for a bad value."""
    vals = np.asarray(factors, dtype=np.float64).reshape(-1)
    if vals.size != rope_dims // 2:
        raise ShapeError(
            f"{what}: {vals.size} RoPE frequency factors, {rope_dims // 2} expected (one per "
            f"rotated pair of {rope_dims} dims)"
        )
    bad = np.flatnonzero(~(np.isfinite(vals) & (vals > 0)))
    if bad.size:
        i = int(bad[0])
        raise ModelFileError(
            f"{what}: RoPE frequency factor {i} is {vals[i]}, must be a positive number"
        )
    return [float(v) for v in vals]


def llama3_factors(
    theta: float,
    rope_dims: int,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_context: float,
) -> list[float]:
    """The "llama3" divisors of the ``rope_dims / 2`` pair frequencies, as llama.cpp's converter
    stores them in ``rope_freqs.weight`` and as HF's ``_compute_llama3_parameters`` scales
    ``inv_freq`` (both in float32): 1 for wavelengths below ``original / high_freq_factor``,
    ``factor`` above ``original / low_freq_factor``, and between them
    ``1 / ((1 - s) / factor + s)`` with ``s = (original / wavelength - low) / (high - low)``."""
    f32 = np.float32
    inv = f32(1.0) / (f32(theta) ** (np.arange(0, rope_dims, 2, dtype=f32) / f32(rope_dims)))
    wavelen = f32(2 * math.pi) / inv
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    out: list[float] = []
    for w in wavelen:
        if w < high_wavelen:
            out.append(1.0)
        elif w > low_wavelen:
            out.append(float(f32(factor)))
        else:
            s = (f32(original_context) / w - f32(low_freq_factor)) / f32(
                high_freq_factor - low_freq_factor
            )
            out.append(float(f32(1.0) / ((f32(1.0) - s) / f32(factor) + s)))
    return out


def _scaling_name(scaling: dict[str, Any]) -> Any:
    return scaling.get("rope_type", scaling.get("type"))


def rope_parameters_v4(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RoPE keys of a config.json saved by transformers 5 (``rope_parameters``: one dict
    with ``rope_theta``, ``rope_type`` and the scaling's own keys, or one per layer type,
    ``full_attention`` and ``sliding_attention``) in the 4.x spelling: ``rope_theta``,
    ``rope_scaling``, ``partial_rotary_factor`` and (the sliding layers' base)
    ``rope_local_base_freq``. Empty when the file has no ``rope_parameters``."""
    rp = cfg.get("rope_parameters")
    if rp is None:
        return {}
    if not isinstance(rp, dict):
        raise ModelFileError(f"config.json: 'rope_parameters' must be an object, got {rp!r:.80}")
    local = None
    if "full_attention" in rp or "sliding_attention" in rp:
        glob, local = rp.get("full_attention") or {}, rp.get("sliding_attention")
    else:
        glob = rp
    if not isinstance(glob, dict) or not isinstance(local, (dict, type(None))):
        raise ModelFileError(f"config.json: 'rope_parameters' is malformed: {rp!r:.200}")
    out: dict[str, Any] = {"rope_scaling": glob}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key in glob:
            out[key] = glob[key]
    if local is not None and "rope_theta" in local:
        out["rope_local_base_freq"] = local["rope_theta"]
    return out


def hf_rope_fields(cfg: dict[str, Any], head_dim: int, theta: float) -> dict[str, Any]:
    """The RoPE fields of a ``config.json`` (``partial_rotary_factor``, ``rope_scaling``)."""
    rope_dims = head_dim
    prf = cfg.get("partial_rotary_factor")
    if prf is not None:
        p = _positive(prf, "config.json: 'partial_rotary_factor'")
        if p > 1:
            raise ModelFileError(f"config.json: 'partial_rotary_factor' {prf} is above 1")
        rope_dims = check_rope_dims(
            int(head_dim * p), head_dim, f"config.json: partial_rotary_factor {prf}"
        )
    out: dict[str, Any] = {"rope_dims": 0 if rope_dims == head_dim else rope_dims}
    scaling = cfg.get("rope_scaling")
    if scaling is None or scaling == {}:
        return out
    if not isinstance(scaling, dict):
        raise ModelFileError(f"config.json: 'rope_scaling' must be an object, got {scaling!r:.80}")
    kind = _scaling_name(scaling)
    if kind == "default":
        return out
    if kind == "linear":
        f = _positive(scaling.get("factor"), "config.json: rope_scaling 'factor'")
        out["rope_linear_factor"] = 0.0 if f == 1.0 else f
        return out
    if kind == "llama3":
        _positive(theta, "config.json: 'rope_theta'")

        def num(key: str) -> float:
            return _positive(scaling.get(key), f"config.json: llama3 rope_scaling {key!r}")

        low, high = num("low_freq_factor"), num("high_freq_factor")
        if high <= low:
            raise ModelFileError(
                f"config.json: llama3 rope_scaling needs high_freq_factor ({high}) above "
                f"low_freq_factor ({low})"
            )
        factors = llama3_factors(
            theta, rope_dims, num("factor"), low, high, num("original_max_position_embeddings")
        )
        out["rope_freq_factors"] = check_freq_factors(factors, rope_dims, "config.json")
        return out
    raise UnsupportedError(
        f"RoPE scaling type {kind!r} (config.json rope_scaling {scaling!r:.200}); supported: "
        f"{', '.join(SUPPORTED_SCALING)}"
    )


def gguf_rope_fields(
    meta: dict[str, Any], arch: str, head_dim: int, rope_dims: int
) -> dict[str, Any]:
    """The RoPE fields of GGUF metadata (``{arch}.rope.*``; ``rope_dims`` the value of
    ``rope.dimension_count``), without the ``rope_freqs`` tensor (:func:`rope_freqs_values`).
    Semantics as llama.cpp's: a missing scaling type is "linear", a factor of 0 means none,
    "none" ignores the factor."""
    rope_dims = check_rope_dims(rope_dims, head_dim, f"{arch}.rope.dimension_count")
    out: dict[str, Any] = {"rope_dims": 0 if rope_dims == head_dim else rope_dims}
    kind = meta.get(f"{arch}.rope.scaling.type", "linear")
    key = f"{arch}.rope.scaling.factor"
    if key not in meta and f"{arch}.rope.scale_linear" in meta:
        key = f"{arch}.rope.scale_linear"
    factor = meta.get(key, 0.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ModelFileError(f"GGUF metadata key {key!r} must be a number, got {factor!r:.80}")
    if factor != 0.0:
        _positive(factor, f"GGUF metadata key {key!r}")
    if not isinstance(kind, str):
        raise ModelFileError(f"GGUF metadata key {arch}.rope.scaling.type must be a string")
    if kind == "none" or (factor in (0.0, 1.0) and kind in ("linear", "yarn", "longrope")):
        return out  # no scaling (YaRN and LongRoPE with factor 1 change nothing either)
    if kind == "linear":
        out["rope_linear_factor"] = float(factor)
        return out
    raise UnsupportedError(
        f"RoPE scaling type {kind!r} (factor {factor}); supported: none, linear, and llama3's "
        "rope_freqs tensor"
    )


def rope_freqs_values(dtype: str, dims: list[int], raw: np.ndarray, rope_dims: int) -> list[float]:
    """The factors of a GGUF ``rope_freqs.weight`` tensor (``dims`` innermost first, ``raw`` its
    bytes): float, ``rope_dims / 2`` of them, each positive and finite."""
    if dtype not in ("F32", "F16", "BF16"):
        raise UnsupportedError(f"tensor 'rope_freqs.weight' of type {dtype} (expected F32)")
    n = int(np.prod(dims)) if dims else 0
    if len([d for d in dims if d != 1]) > 1 or n != rope_dims // 2:
        raise ShapeError(
            f"tensor 'rope_freqs.weight' has shape {list(dims)}, expected [{rope_dims // 2}] "
            f"(one factor per rotated pair of {rope_dims} dims)"
        )
    if dtype == "F32":
        vals = raw.view(np.float32)
    elif dtype == "F16":
        vals = raw.view(np.float16)
    else:
        vals = (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return check_freq_factors(vals, rope_dims, "tensor 'rope_freqs.weight'")
