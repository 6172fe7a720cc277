"""RoPE scaling and partial rotation, as the two file formats state them.

The engine takes these config fields (:class:`.types.ModelConfig`): ``rope_dims`` (the values
of each head that rotate, 0 = all), ``rope_linear_factor`` (positions divided by it, 0 = none),
``rope_freq_factors`` (``rope_dims / 2`` divisors of the pairs' frequencies, empty = none),
``rope_attn_factor`` (cos and sin times it, 0 = 1) and LongRoPE's ``rope_long_factors`` with
``rope_original_context`` (the divisors for a context above it: ``config.for_context``). Pair
``i`` at position ``p`` turns by ``p * theta^(-2i/rope_dims) / linear / factors[i]``; layers
with their own base (Gemma 3's sliding layers) are not scaled.

Supported:

* Llama 3.1/3.2's "llama3" scaling: in GGUF the ``rope_freqs.weight`` tensor llama.cpp's
  converter computes and llama.cpp divides each frequency by; in a Hugging Face
  ``config.json`` ``rope_scaling = {"rope_type": "llama3", factor, low_freq_factor,
  high_freq_factor, original_max_position_embeddings}``, turned into the same factors
  (:func:`llama3_factors`, HF's ``_compute_llama3_parameters`` as per-pair divisors);
* linear scaling: GGUF ``{arch}.rope.scaling.type = "linear"`` (llama.cpp's default type when
  the key is absent) with ``{arch}.rope.scaling.factor`` (or the older
  ``{arch}.rope.scale_linear``); HF ``{"rope_type"/"type": "linear", "factor": f}``;
* YaRN: GGUF ``rope.scaling.type = "yarn"`` with ``factor`` and
  ``original_context_length`` (llama.cpp: ``ext_factor`` 1, ``beta_fast`` 32, ``beta_slow``
  1, the magnitude ``0.1 ln(factor) + 1``, times ``rope.scaling.attn_factor``); HF
  ``{"rope_type": "yarn", factor, original_max_position_embeddings, attention_factor,
  beta_fast, beta_slow, mscale, mscale_all_dim, truncate}`` as ``_compute_yarn_parameters``.
  Its blend of interpolated and extrapolated frequencies is a divisor per pair
  (:func:`yarn_factors`), its ``mscale`` the magnitude. The context it reaches,
  ``factor * original``, is the model's ``max_context`` where the file says less;
* LongRoPE (Phi-3 128k, "longrope" / "su"): GGUF tensors ``rope_factors_short`` /
  ``rope_factors_long`` (read by the loader) with ``rope.scaling.attn_factor``; HF
  ``{"rope_type": "longrope", short_factor, long_factor, attention_factor}`` with the top
  level's ``original_max_position_embeddings``, the magnitude
  ``sqrt(1 + ln(max_position / original) / ln(original))`` as ``_compute_longrope_parameters``.
  The long factors serve a context above the original one, as llama.cpp chooses (by the
  context size; HF switches per forward call by the sequence's length);
* dynamic NTK (HF ``"dynamic"``): transformers grows the base only once a sequence passes
  ``max_position_embeddings`` (and keeps the keys already cached with the old one), so up to
  it the frequencies are plain RoPE's: that is what the engine runs, with ``max_context`` the
  model's ``max_position_embeddings`` (past it the engine refuses the context; GGUF has no
  such type);
* partial RoPE: GGUF ``{arch}.rope.dimension_count`` below the head size (llama.cpp's
  ``n_rot``), HF ``partial_rotary_factor`` (``int(head_dim * factor)`` values, HF's rule).

Refused with :class:`UnsupportedError` naming the type: any other type (GGUF's "dynamic"
included, which llama.cpp does not read). Malformed values are typed errors:
:class:`ShapeError` for a rotated size that is odd, zero or larger than the head, or a factor
tensor of the wrong length; :class:`ModelFileError` for non-finite or non-positive factors and
malformed keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError

#: RoPE scaling types of a config.json, as the engine implements them.
SUPPORTED_SCALING: tuple[str, ...] = ("linear", "llama3", "yarn", "longrope", "su", "dynamic")
#: RoPE scaling types of a GGUF file (``rope.scaling.type``), as llama.cpp reads them.
GGUF_SCALING: tuple[str, ...] = ("none", "linear", "yarn", "longrope")
#: GGUF tensors of LongRoPE's factors: name -> the config field they fill.
LONGROPE_TENSORS: dict[str, str] = {
    "rope_factors_short": "rope_freq_factors",
    "rope_factors_long": "rope_long_factors",
}
#: YaRN's defaults (llama.cpp's and HF's): the ramp's corners in rotations.
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


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


def yarn_extrapolation(
    theta: float,
    rope_dims: int,
    original_context: float,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
    truncate: bool = True,
) -> np.ndarray:
    """YaRN's share of each pair's frequency kept as it is (1: extrapolated, the fast pairs;
    0: interpolated, divided by the factor), in float64: 1 up to the pair that turns
    ``beta_fast`` times over ``original_context`` positions, 0 from the one that turns
    ``beta_slow`` times, linear between (llama.cpp's ``ggml_rope_yarn_corr_dims`` and
    ``rope_yarn_ramp``; HF's ``find_correction_range`` and ``linear_ramp_factor``, the corners
    rounded outwards unless ``truncate`` is false)."""

    def corner(rotations: float) -> float:
        return (
            rope_dims
            * math.log(original_context / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = corner(beta_fast), corner(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rope_dims - 1)
    ramp = (np.arange(rope_dims // 2, dtype=np.float64) - low) / max(high - low, 0.001)
    return 1.0 - np.clip(ramp, 0.0, 1.0)


def yarn_factors(
    theta: float,
    rope_dims: int,
    factor: float,
    original_context: float,
    beta_fast: float = YARN_BETA_FAST,
    beta_slow: float = YARN_BETA_SLOW,
    ext_factor: float = 1.0,
    truncate: bool = True,
) -> list[float]:
    """YaRN's frequencies as divisors of plain RoPE's, one per pair: pair ``i`` turns at
    ``inv_i * ((1 - m_i) / factor + m_i)`` with ``m_i = ext_factor * share_i``
    (:func:`yarn_extrapolation`), llama.cpp's ``theta_interp * (1 - ramp_mix) + theta_extrap *
    ramp_mix`` and HF's ``inv_freq_interpolation * (1 - e) + inv_freq_extrapolation * e``."""
    m = ext_factor * yarn_extrapolation(
        theta, rope_dims, original_context, beta_fast, beta_slow, truncate
    )
    return [float(v) for v in 1.0 / ((1.0 - m) / factor + m)]


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude for ``factor``: ``0.1 * mscale * ln(factor) + 1`` (1 up to factor 1),
    HF's ``get_mscale`` and llama.cpp's."""
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def longrope_attn_factor(scale: float, original_context: float) -> float:
    """LongRoPE's magnitude for a context ``scale`` times the original:
    ``sqrt(1 + ln(scale) / ln(original))`` (1 up to scale 1), as HF computes it and
    llama.cpp's converter writes it (``rope.scaling.attn_factor``)."""
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1.0 + math.log(scale) / math.log(original_context))


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
    """The RoPE fields of a ``config.json`` (``partial_rotary_factor``, ``rope_scaling``), and
    ``max_context`` where the scaling reaches further than ``max_position_embeddings`` (YaRN:
    ``factor * original``)."""
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
    scale = _HF_SCALING.get(kind) if isinstance(kind, str) else None
    if scale is None:
        raise UnsupportedError(
            f"RoPE scaling type {kind!r} (config.json rope_scaling {scaling!r:.200}); supported: "
            f"{', '.join(SUPPORTED_SCALING)}"
        )
    out.update(scale(_HfRope(cfg, scaling, str(kind), theta, rope_dims)))
    return out


@dataclass
class _HfRope:
    """One config.json's RoPE scaling as the per-type readers below take it."""

    cfg: dict[str, Any]
    scaling: dict[str, Any]
    kind: str
    theta: float
    rope_dims: int

    def num(self, key: str, default: float | None = None) -> float:
        """``rope_scaling[key]``, positive (``default`` when absent or null)."""
        v = self.scaling.get(key)
        if v is None and default is not None:
            return default
        return _positive(v, f"config.json: {self.kind} rope_scaling {key!r}")

    def top(self, key: str) -> float | None:
        """A positive number at the top level of config.json, or None when absent."""
        v = self.cfg.get(key)
        return None if v is None else _positive(v, f"config.json: {key!r}")

    def base(self) -> float:
        """The RoPE base, which YaRN's ramp takes the log of: above 1."""
        t = _positive(self.theta, "config.json: 'rope_theta'")
        if t <= 1.0:
            raise ModelFileError(f"config.json: {self.kind} RoPE needs rope_theta above 1, got {t}")
        return t


def _hf_linear(r: _HfRope) -> dict[str, Any]:
    f = r.num("factor")
    return {"rope_linear_factor": 0.0 if f == 1.0 else f}


def _hf_llama3(r: _HfRope) -> dict[str, Any]:
    _positive(r.theta, "config.json: 'rope_theta'")
    low, high = r.num("low_freq_factor"), r.num("high_freq_factor")
    if high <= low:
        raise ModelFileError(
            f"config.json: llama3 rope_scaling needs high_freq_factor ({high}) above "
            f"low_freq_factor ({low})"
        )
    factors = llama3_factors(
        r.theta,
        r.rope_dims,
        r.num("factor"),
        low,
        high,
        r.num("original_max_position_embeddings"),
    )
    return {"rope_freq_factors": check_freq_factors(factors, r.rope_dims, "config.json")}


def _hf_yarn(r: _HfRope) -> dict[str, Any]:
    """``_compute_yarn_parameters``: the ramp's factors and the attention factor (given, or
    ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`` where both are set,
    else ``get_mscale(factor)``)."""
    factor = r.num("factor")
    original = r.num("original_max_position_embeddings", r.top("max_position_embeddings"))
    truncate = r.scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelFileError(
            f"config.json: yarn rope_scaling 'truncate' must be a bool, got {truncate!r}"
        )
    attn = r.scaling.get("attention_factor")
    if attn is not None:
        attn = r.num("attention_factor")
    elif r.scaling.get("mscale") and r.scaling.get("mscale_all_dim"):
        attn = yarn_mscale(factor, r.num("mscale")) / yarn_mscale(factor, r.num("mscale_all_dim"))
    else:
        attn = yarn_mscale(factor)
    # `or`: HF's defaults stand for 0 too.
    fast = r.num("beta_fast", YARN_BETA_FAST) if r.scaling.get("beta_fast") else YARN_BETA_FAST
    slow = r.num("beta_slow", YARN_BETA_SLOW) if r.scaling.get("beta_slow") else YARN_BETA_SLOW
    factors = yarn_factors(r.base(), r.rope_dims, factor, original, fast, slow, 1.0, truncate)
    return {
        "rope_freq_factors": check_freq_factors(factors, r.rope_dims, "config.json"),
        "rope_attn_factor": 0.0 if attn == 1.0 else attn,
        "max_context": int(factor * original),
    }


def _hf_longrope(r: _HfRope) -> dict[str, Any]:
    """``_compute_longrope_parameters``: the short and long factors, the original context from
    the top level (Phi-3) or ``rope_scaling`` (transformers 5), the attention factor (given,
    or :func:`longrope_attn_factor` of ``max_position_embeddings / original``)."""
    max_pos = r.top("max_position_embeddings")
    original = r.top("original_max_position_embeddings")
    if original is None and r.scaling.get("original_max_position_embeddings") is not None:
        original = r.num("original_max_position_embeddings")
    if original is not None and max_pos is not None:
        scale = max_pos / original
    else:
        original = max_pos if max_pos is not None else r.num("original_max_position_embeddings")
        scale = r.num("factor", 1.0)
    attn = r.scaling.get("attention_factor")
    attn = r.num("attention_factor") if attn is not None else longrope_attn_factor(scale, original)
    fields = {}
    for key, field in (("short_factor", "rope_freq_factors"), ("long_factor", "rope_long_factors")):
        v = r.scaling.get(key)
        if not isinstance(v, list):
            raise ModelFileError(
                f"config.json: {r.kind} rope_scaling needs a list {key!r}, got {v!r:.80}"
            )
        fields[field] = check_freq_factors(v, r.rope_dims, f"config.json: rope_scaling {key!r}")
    return {
        **fields,
        "rope_attn_factor": 0.0 if attn == 1.0 else attn,
        "rope_original_context": int(original),
    }


def _hf_dynamic(r: _HfRope) -> dict[str, Any]:
    """Dynamic NTK: plain RoPE up to ``max_position_embeddings`` (see the module docs)."""
    r.num("factor")
    return {}


#: config.json's scaling types and their readers.
_HF_SCALING = {
    "linear": _hf_linear,
    "llama3": _hf_llama3,
    "yarn": _hf_yarn,
    "longrope": _hf_longrope,
    "su": _hf_longrope,
    "dynamic": _hf_dynamic,
}


def _gguf_number(meta: dict[str, Any], key: str, default: float) -> float:
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ModelFileError(f"GGUF metadata key {key!r} must be a number, got {v!r:.80}")
    return float(v)


def gguf_original_context(meta: dict[str, Any], arch: str) -> int:
    """llama.cpp's ``n_ctx_orig_yarn``: ``rope.scaling.original_context_length``, else the
    training context (``context_length``); what YaRN's ramp and LongRoPE's choice count."""
    for key in (f"{arch}.rope.scaling.original_context_length", f"{arch}.context_length"):
        if key in meta:
            v = meta[key]
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ModelFileError(f"GGUF metadata key {key!r} must be a positive integer")
            return v
    raise ModelFileError(f"GGUF metadata lacks {arch}.context_length")


def gguf_scaling_type(meta: dict[str, Any], arch: str) -> str:
    """``rope.scaling.type``, llama.cpp's "linear" when absent; UnsupportedError naming any
    type llama.cpp does not read."""
    kind = meta.get(f"{arch}.rope.scaling.type", "linear")
    if not isinstance(kind, str):
        raise ModelFileError(f"GGUF metadata key {arch}.rope.scaling.type must be a string")
    if kind not in GGUF_SCALING:
        raise UnsupportedError(
            f"RoPE scaling type {kind!r} in GGUF metadata; supported: {', '.join(GGUF_SCALING)} "
            "(and llama3's rope_freqs tensor)"
        )
    return kind


def gguf_rope_fields(
    meta: dict[str, Any], arch: str, head_dim: int, rope_dims: int
) -> dict[str, Any]:
    """The RoPE fields of GGUF metadata (``{arch}.rope.*``; ``rope_dims`` the value of
    ``rope.dimension_count``), without the factor tensors (``rope_freqs``:
    :func:`rope_freqs_values`; LongRoPE's: the loader), and ``max_context`` where YaRN
    reaches further than ``context_length``. Semantics as llama.cpp's: a missing scaling type
    is "linear", a factor of 0 means none, "none" ignores the factor;
    ``rope.scaling.attn_factor`` scales the rotation whatever the type; YaRN's ``ext_factor``
    is 1, its ramp's corners 32 and 1 rotations (llama.cpp reads no ``yarn_*`` keys for these
    families) over :func:`gguf_original_context`, its magnitude ``0.1 ln(factor) + 1``."""
    rope_dims = check_rope_dims(rope_dims, head_dim, f"{arch}.rope.dimension_count")
    out: dict[str, Any] = {"rope_dims": 0 if rope_dims == head_dim else rope_dims}
    kind = gguf_scaling_type(meta, arch)
    key = f"{arch}.rope.scaling.factor"
    if key not in meta and f"{arch}.rope.scale_linear" in meta:
        key = f"{arch}.rope.scale_linear"
    factor = meta.get(key, 0.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ModelFileError(f"GGUF metadata key {key!r} must be a number, got {factor!r:.80}")
    if factor != 0.0:
        _positive(factor, f"GGUF metadata key {key!r}")
    attn_key = f"{arch}.rope.scaling.attn_factor"
    attn = _positive(_gguf_number(meta, attn_key, 1.0), f"GGUF metadata key {attn_key!r}")
    if kind == "none" or factor in (0.0, 1.0):
        factor = 1.0  # no scaling (YaRN and LongRoPE with factor 1 change nothing either)
    elif kind in ("linear", "longrope"):
        out["rope_linear_factor"] = float(factor)
    else:  # yarn
        theta = _positive(_gguf_number(meta, f"{arch}.rope.freq_base", 10000.0), "freq_base")
        if theta <= 1.0:
            raise ModelFileError(f"GGUF: YaRN needs {arch}.rope.freq_base above 1, got {theta}")
        original = gguf_original_context(meta, arch)
        out["rope_freq_factors"] = yarn_factors(theta, rope_dims, factor, original)
        attn *= yarn_mscale(factor)
        out["max_context"] = int(factor * original)
    if attn != 1.0:
        out["rope_attn_factor"] = attn
    return out


def longrope_values(
    name: str, dtype: str, dims: list[int], raw: np.ndarray, rope_dims: int
) -> list[float]:
    """The factors of a GGUF LongRoPE tensor (``rope_factors_short`` / ``_long``), as
    :func:`rope_freqs_values` reads ``rope_freqs``."""
    return rope_freqs_values(dtype, dims, raw, rope_dims, name)


def rope_freqs_values(
    dtype: str, dims: list[int], raw: np.ndarray, rope_dims: int, name: str = "rope_freqs"
) -> list[float]:
    """The factors of a GGUF ``rope_freqs.weight`` tensor (or of LongRoPE's, ``name``; ``dims``
    innermost first, ``raw`` its bytes): float, ``rope_dims / 2`` of them, each positive and
    finite."""
    if dtype not in ("F32", "F16", "BF16"):
        raise UnsupportedError(f"tensor '{name}.weight' of type {dtype} (expected F32)")
    n = int(np.prod(dims)) if dims else 0
    if len([d for d in dims if d != 1]) > 1 or n != rope_dims // 2:
        raise ShapeError(
            f"tensor '{name}.weight' has shape {list(dims)}, expected [{rope_dims // 2}] "
            f"(one factor per rotated pair of {rope_dims} dims)"
        )
    if dtype == "F32":
        vals = raw.view(np.float32)
    elif dtype == "F16":
        vals = raw.view(np.float16)
    else:
        vals = (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return check_freq_factors(vals, rope_dims, f"tensor '{name}.weight'")
