"""The data types every loader returns: tensors as raw byte views, the model config, the model.

Weights are never converted here. A :class:`TensorData` is a 1-D ``uint8`` view of the
memory-mapped file in the tensor's on-disk format (see :data:`BLOCK_LAYOUT`), so the Rust side
gets the bytes without a copy and decides itself how to repack them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .. import _core
from ..errors import ModelFileError, ShapeError, UnsupportedError

if TYPE_CHECKING:
    from ..runtime.tokenizer import Tokenizer

#: dtype name -> (elements per block, bytes per block). Quantised formats are GGML's layouts
#: (documented bit for bit in crates/core/src/dtype.rs): Q8_0 = f16 scale + 32 x i8; Q4_0 =
#: f16 scale + 16 bytes of nibbles; Q4_1 = f16 scale, f16 min + 16 bytes of nibbles; Q5_0/Q5_1
#: add 4 bytes of fifth bits; the K-quants are 256-weight super-blocks.
BLOCK_LAYOUT: dict[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
    "MXFP4": (32, 17),
    "TQ1_0": (256, 54),
    "TQ2_0": (256, 66),
    "NVFP4": (64, 36),
    "Q1_0": (128, 18),
    "Q2_0": (64, 18),
    "IQ2_XXS": (256, 66),
    "IQ2_XS": (256, 74),
    "IQ2_S": (256, 82),
    "IQ3_XXS": (256, 98),
    "IQ3_S": (256, 110),
    "IQ1_S": (256, 50),
    "IQ1_M": (256, 56),
}

SUPPORTED_DTYPES: tuple[str, ...] = tuple(BLOCK_LAYOUT)
#: "gelu" is GELU's tanh approximation (llama.cpp's, transformers' "gelu_pytorch_tanh"),
#: "gelu_erf" the exact form (transformers' "gelu").
ACTIVATIONS: tuple[str, ...] = ("silu", "relu", "gelu", "gelu_erf")


def row_bytes(dtype: str, cols: int) -> int:
    """Bytes one row of ``cols`` elements takes in ``dtype``.

    Raises :class:`UnsupportedError` for an unknown dtype and :class:`ShapeError` when a
    quantised row is not a whole number of blocks.
    """
    try:
        block, size = BLOCK_LAYOUT[dtype]
    except KeyError:
        raise UnsupportedError(
            f"weight dtype {dtype!r} is not supported (supported: {', '.join(SUPPORTED_DTYPES)})"
        ) from None
    if cols <= 0 or cols % block:
        raise ShapeError(f"a {dtype} row needs a positive multiple of {block} elements, got {cols}")
    return cols // block * size


@dataclass
class TensorData:
    """One weight matrix (or vector) as raw bytes.

    ``rows`` is the number of output features for ``y = W @ x`` (vocabulary size for the
    embedding, 1 for norm vectors) and ``cols`` the number of input features. ``data`` is a
    1-D C-contiguous ``uint8`` view into the memory-mapped file, ``rows * row_bytes`` long.
    """

    name: str
    dtype: str
    rows: int
    cols: int
    data: np.ndarray

    def __post_init__(self) -> None:
        if self.rows <= 0:
            raise ShapeError(f"tensor {self.name}: rows must be positive, got {self.rows}")
        want = self.rows * row_bytes(self.dtype, self.cols)
        d = self.data
        if not isinstance(d, np.ndarray) or d.dtype != np.uint8 or d.ndim != 1:
            raise ModelFileError(f"tensor {self.name}: data must be a 1-D uint8 array")
        if not d.flags.c_contiguous:
            raise ModelFileError(f"tensor {self.name}: data is not contiguous")
        if d.size != want:
            raise ModelFileError(
                f"tensor {self.name}: {d.size} bytes, expected {want} for "
                f"{self.rows}x{self.cols} {self.dtype}"
            )

    @property
    def row_bytes(self) -> int:
        """Bytes per row."""
        return row_bytes(self.dtype, self.cols)

    @property
    def nbytes(self) -> int:
        """Total bytes of the tensor."""
        return int(self.data.size)


#: The RoPE scaling fields with their "none" values: left out of the fingerprint when unset,
#: so models without scaling keep the fingerprints their plans and profiles were made with.
ROPE_DEFAULTS: dict[str, object] = {
    "rope_dims": 0,
    "rope_linear_factor": 0.0,
    "rope_freq_factors": [],
    "rope_attn_factor": 0.0,
    "rope_long_factors": [],
    "rope_original_context": 0,
}
#: The expert fields GLM-4.5 added, left out of the fingerprint when unset for the same reason.
MOE_DEFAULTS: dict[str, object] = {
    "dense_lead_layers": 0,
    "expert_score_bias": False,
    "expert_groups": 0,
    "expert_groups_used": 0,
    # gpt-oss's
    "attn_sinks": False,
    "expert_bias": False,
    "swiglu_limit": 0.0,
}
#: The latent-attention fields DeepSeek-V2/V3 added (0: ordinary attention), likewise.
MLA_DEFAULTS: dict[str, object] = {
    "mla_kv_lora_rank": 0,
    "mla_q_lora_rank": 0,
    "mla_qk_nope": 0,
    "mla_v_head_dim": 0,
}

#: The model config, declared once by the engine (crates/py/src/config.rs): built with
#: keywords (``arch``, the eight sizes, ``rms_eps``, ``rope_theta``, ``rope_style`` and
#: ``activation`` required), its fields read and set as attributes, ``validate()``,
#: ``replace(**changes)``, ``to_dict()``, ``FIELDS``, and the tensors it implies
#: (``layer_tensors()``, ``global_tensors()``).
#:
#: ``arch`` names the family (:mod:`.archs`); the fields after ``tie_embeddings`` say what it
#: changes in the llama layer: q/k/v biases, per-head q/k RMSNorm, a sliding attention window
#: (0: none) and which layers slide (``swa_pattern`` 0: all; p: all but every p-th), the RoPE
#: base of sliding layers, an offset added to every norm weight (Gemma's ``1 + w``), norms
#: after attention and FFN, an embedding scale, the attention's query scale and soft-caps of
#: the attention scores and the final logits (for the floats, 0 means "not set"), FATReLU's
#: threshold (ProSparse: a ReLU activation that passes only ``x > t``) and whether the up
#: projection is activated too (Bamboo); OPT's and Falcon's LayerNorm, learned positions (row
#: ``pos + pos_offset`` of ``position_embd``), gate-less FFN, FFN and output biases, and
#: parallel attention and FFN.
#:
#: RoPE (:mod:`.rope`): ``rope_dims`` values at the start of each head rotate (0: all of
#: ``head_dim``; fewer for partial RoPE), pair ``i`` at position ``p`` by
#: ``p * theta^(-2i/rope_dims) / rope_linear_factor / rope_freq_factors[i]`` (linear
#: scaling, 0 = none; Llama 3.1's per-pair factors, ``rope_dims / 2`` of them, empty = none;
#: YaRN's ramp as per-pair factors too), the rotated values times ``rope_attn_factor`` (YaRN's
#: and LongRoPE's attention factor, 0 = 1); LongRoPE's ``rope_long_factors`` replace the
#: factors for a context above ``rope_original_context`` (``config.for_context(n_ctx)``);
#: layers with their own base (``rope_theta_local``) are not scaled.
#:
#: Multi-head latent attention (DeepSeek-V2/V3; ``mla_kv_lora_rank`` 0: none): the latent's
#: width ``mla_kv_lora_rank``, the query's compression ``mla_q_lora_rank`` (0: one ``attn_q``),
#: each query head's ``mla_qk_nope`` values absorbed through ``attn_k_b`` and each head's
#: output width ``mla_v_head_dim``; ``head_dim`` is then the cached row (``kv_lora_rank +
#: rope_dims``), ``n_kv_heads`` 1 and ``rope_dims`` the rotated part.
ModelConfig = _core.ModelConfig


@dataclass
class LoadedModel:
    """A model ready for the engine: config, raw tensors, tokenizer and chat template."""

    config: ModelConfig
    tensors: dict[str, TensorData]
    tokenizer: Tokenizer
    chat_template: str | None
    path: str
    fingerprint: str
    #: the files the weights are read from: ``[path]``, the shards of a split GGUF, or a
    #: directory's safetensors files (empty when the loader does not say)
    files: list[str] = field(default_factory=list)
    #: the GGUF's ``{arch}.pooling_type`` (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last,
    #: 4 rank), None where the file does not say (see :mod:`..runtime.embeddings`)
    pooling_type: int | None = None


def layer_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Canonical suffix (after ``blk.N.``) -> ``(rows, cols)`` of the tensors every layer of
    ``config``'s family needs past a mixture of experts' leading dense layers (the engine's
    own list: ``ModelConfig.layer_tensors``)."""
    return {n: (r, c) for n, r, c, required in config.layer_tensors() if required}


def tensor_table(config: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """Canonical tensor name -> ``(rows, cols, required)`` of every tensor ``config`` implies
    or allows (the tied output head, Falcon's ``attn_norm_2``), as the engine reads them."""
    out = {n: (r, c, req) for n, r, c, req in config.global_tensors()}
    # A mixture of experts' leading dense layers (GLM-4.5) have a dense FFN.
    lead, per_layer = config.layer_tensors(0), config.layer_tensors()
    for i in range(config.n_layers):
        layer = lead if i < config.dense_lead_layers else per_layer
        out.update({f"blk.{i}.{n}": (r, c, req) for n, r, c, req in layer})
    return out


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Canonical tensor name -> ``(rows, cols)`` of the tensors ``config`` implies: the
    required ones and the output head (the loaders give a tied head as ``token_embd``)."""
    return {
        n: (r, c)
        for n, (r, c, required) in tensor_table(config).items()
        if required or n == "output"
    }


def check_layer_count(config: ModelConfig, tensors: dict[str, TensorData], source: str) -> None:
    """:class:`ModelFileError` when the file's tensors cannot hold ``config.n_layers`` layers,
    before anything loops over the layers (a block count of 10^7 in a 15 KB file used to spend
    minutes and gigabytes listing the tensors it would need)."""
    lead = min(config.dense_lead_layers, config.n_layers)
    dense = sum(1 for t in config.layer_tensors(0) if t[3]) if lead else 0
    need = lead * dense + (config.n_layers - lead) * len(layer_shapes(config))
    if need > len(tensors):
        raise ModelFileError(
            f"{source}: {config.n_layers} layers need {need} layer tensors, the file has "
            f"{len(tensors)} tensors in all"
        )


def check_tensors(
    config: ModelConfig,
    tensors: dict[str, TensorData],
    source: str,
    shapes: dict[str, tuple[int, int]] | None = None,
) -> None:
    """Check that every required tensor is present with the shape ``config`` implies (or the
    given ``shapes``, by name).

    Norm and bias vectors must be float (F32/F16/BF16). Raises :class:`ModelFileError` naming
    the first missing tensor, :class:`ShapeError` naming the first mis-shaped one.
    """
    check_layer_count(config, tensors, source)
    table = tensor_table(config) if shapes is None else {n: (*s, True) for n, s in shapes.items()}
    for name, (rows, cols, required) in table.items():
        t = tensors.get(name)
        if t is None:
            if required or name == "output":
                raise ModelFileError(f"{source}: required tensor {name!r} is missing")
            continue
        if (t.rows, t.cols) != (rows, cols):
            raise ShapeError(
                f"{source}: tensor {name!r} has shape {t.rows}x{t.cols}, "
                f"the config implies {rows}x{cols}"
            )
        if rows == 1 and t.dtype not in ("F32", "F16", "BF16"):
            raise UnsupportedError(f"{source}: norm tensor {name!r} is {t.dtype}, expected float")


def fingerprint(config: ModelConfig, tensors: dict[str, TensorData], sample: int = 64) -> str:
    """A stable hex digest of the config, the tensor table and a few bytes of each tensor.

    Hashes the first, middle and last ``sample`` bytes of every tensor, never whole tensors,
    so it costs microseconds even for large models.
    """
    h = hashlib.sha256()
    fields = config.to_dict()
    for k, none in {**ROPE_DEFAULTS, **MOE_DEFAULTS, **MLA_DEFAULTS}.items():
        if fields.get(k) == none:
            del fields[k]
    h.update(json.dumps(fields, sort_keys=True).encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{t.rows}|{t.cols}\n".encode())
        n = t.data.size
        mid = max(0, n // 2 - sample // 2)
        for start in (0, mid, max(0, n - sample)):
            h.update(t.data[start : start + sample].tobytes())
    return h.hexdigest()[:32]
