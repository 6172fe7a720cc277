"""Load a llama-architecture GGUF file: config from its metadata, tensors as raw mmap views.

Weights keep their GGUF encoding (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K);
nothing is dequantised.
GGUF lists dimensions innermost first (``ne[0]`` = columns), so a 2-D tensor ``[cols, rows]``
becomes ``TensorData(rows=ne[1], cols=ne[0])``. The ``llama`` arch in GGUF always has its
q/k rows permuted by the converter, so RoPE rotates adjacent pairs: ``rope_style = "norm"``.

The header is parsed by :mod:`.gguf_file` (fast and strict) rather than ``gguf.GGUFReader``.
The activation is SiLU unless the file carries ``powerinfer_rs.activation`` (our synthetic
ReLU models do; llama.cpp ignores the key).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, ShapeError, UnsupportedError
from ..runtime.tokenizer import Tokenizer
from .gguf_file import MAGIC, GGUFFile, starts_with
from .types import (
    ACTIVATIONS,
    SUPPORTED_DTYPES,
    LoadedModel,
    ModelConfig,
    TensorData,
    check_tensors,
    fingerprint,
    row_bytes,
)

SUPPORTED_ARCHS: tuple[str, ...] = ("llama",)
ACTIVATION_KEY = "powerinfer_rs.activation"


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Parse a GGUF file's header (memory-mapped, read-only); ModelFileError if malformed."""
    return GGUFFile(path)


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


def _int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    v = meta.get(key, default)
    if isinstance(v, list):
        if v and all(x == v[0] for x in v):
            v = v[0]
        else:
            raise UnsupportedError(f"per-layer values for {key} are not supported: {v!r}")
    if v is None:
        raise ModelFileError(f"GGUF metadata key {key!r} is missing")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFileError(f"GGUF metadata key {key!r} must be an integer, got {v!r}")
    return v


def _float(meta: dict[str, Any], key: str, default: float) -> float:
    v = meta.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ModelFileError(f"GGUF metadata key {key!r} must be a number, got {v!r}")
    return float(v)


def config_from_metadata(meta: dict[str, Any], tokenizer: Tokenizer | None) -> ModelConfig:
    """Build the :class:`ModelConfig` from GGUF metadata (``llama.*`` keys)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedError(
            f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    a = arch
    dim = _int(meta, f"{a}.embedding_length")
    n_heads = _int(meta, f"{a}.attention.head_count")
    n_kv = _int(meta, f"{a}.attention.head_count_kv", n_heads)
    if n_heads <= 0 or dim <= 0:
        raise ShapeError(f"embedding_length ({dim}) and head_count ({n_heads}) must be positive")
    head_dim = _int(meta, f"{a}.attention.key_length", dim // n_heads)
    if _int(meta, f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedError("attention.value_length differing from key_length")
    rope_dims = _int(meta, f"{a}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise UnsupportedError(
            f"partial RoPE (rope.dimension_count {rope_dims} != head_dim {head_dim})"
        )
    scaling = meta.get(f"{a}.rope.scaling.type")
    factor = meta.get(f"{a}.rope.scaling.factor", 1.0)
    if scaling not in (None, "none") and factor not in (0, 0.0, 1, 1.0):
        raise UnsupportedError(f"RoPE scaling {scaling!r} (factor {factor})")
    tokens = meta.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, list) else None
    vocab = _int(meta, f"{a}.vocab_size", n_tokens)
    activation = meta.get(ACTIVATION_KEY, "silu")
    if activation not in ACTIVATIONS:
        raise UnsupportedError(f"activation {activation!r} (supported: {ACTIVATIONS})")
    cfg = ModelConfig(
        arch=a,
        n_layers=_int(meta, f"{a}.block_count"),
        dim=dim,
        ffn_dim=_int(meta, f"{a}.feed_forward_length"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        max_context=_int(meta, f"{a}.context_length", 2048),
        rms_eps=_float(meta, f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=_float(meta, f"{a}.rope.freq_base", 10000.0),
        rope_style="norm",
        activation=activation,
        bos_token_id=tokenizer.bos_id if tokenizer else None,
        eos_token_ids=list(tokenizer.eos_ids) if tokenizer else [],
        add_bos=tokenizer.add_bos if tokenizer else False,
        tie_embeddings=False,
    )
    cfg.validate()
    return cfg


def _tensor_views(gf: GGUFFile) -> dict[str, TensorData]:
    """Canonical name -> TensorData for every weight tensor in the file."""
    path = gf.path
    buf = gf.data  # np.memmap, uint8, the whole file
    size = int(buf.size)
    out: dict[str, TensorData] = {}
    for t in gf.tensors:
        full = t.name
        if full.endswith(".bias") or full.startswith("rope_freqs"):
            raise UnsupportedError(f"{path}: tensor {full!r} (biases / rope factors) not supported")
        if not full.endswith(".weight"):
            continue
        name = full[: -len(".weight")]
        dtype = t.type_name
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedError(
                f"{path}: tensor {full!r} has type {dtype} "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        dims = list(t.dims)
        if any(d <= 0 for d in dims) or any(d != 1 for d in dims[2:]):
            raise ShapeError(f"{path}: tensor {full!r} has unusable shape {dims}")
        cols = dims[0]
        rows = dims[1] if len(dims) > 1 else 1
        nbytes = rows * row_bytes(dtype, cols)
        start = t.offset
        if start + nbytes > size:
            raise ModelFileError(
                f"{path}: tensor {full!r} extends past the end of the file (truncated?)"
            )
        out[name] = TensorData(name, dtype, rows, cols, buf[start : start + nbytes])
    return out


def load_gguf(path: str | os.PathLike[str]) -> LoadedModel:
    """Load a llama GGUF file (memory-mapped, zero copy)."""
    p = str(Path(path))
    gf = open_gguf(p)
    meta = gf.metadata
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedError(
            f"{p}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    tok = Tokenizer.from_gguf(meta)
    cfg = config_from_metadata(meta, tok)
    tensors = _tensor_views(gf)
    if "output" not in tensors and "token_embd" in tensors:
        tensors["output"] = tensors["token_embd"]
        cfg.tie_embeddings = True
    check_tensors(cfg, tensors, p)
    if tok.vocab_size > cfg.vocab_size:
        raise ShapeError(
            f"{p}: tokenizer has {tok.vocab_size} tokens, the model only {cfg.vocab_size}"
        )
    return loaded_model(p, meta, cfg, tensors, tok)


def loaded_model(
    path: str, meta: dict[str, Any], cfg: ModelConfig, tensors: dict[str, TensorData], tok: Any
) -> LoadedModel:
    """The :class:`LoadedModel` of a GGUF file: its chat template from the metadata ``meta``
    and its fingerprint."""
    template = meta.get("tokenizer.chat_template")
    return LoadedModel(
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        chat_template=template if isinstance(template, str) else None,
        path=path,
        fingerprint=fingerprint(cfg, tensors),
    )


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file starting with the GGUF magic."""
    return starts_with(path, MAGIC)
