"""The data types every loader returns: tensors as raw byte views, the model config, the model.

Weights are never converted here. A :class:`TensorData` is a 1-D ``uint8`` view of the
memory-mapped file in the tensor's on-disk format (see :data:`BLOCK_LAYOUT`), so the Rust side
gets the bytes without a copy and decides itself how to repack them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from .rope import check_freq_factors, check_rope_dims

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
}

SUPPORTED_DTYPES: tuple[str, ...] = tuple(BLOCK_LAYOUT)
#: "gelu" is GELU's tanh approximation (llama.cpp's, transformers' "gelu_pytorch_tanh"),
#: "gelu_erf" the exact form (transformers' "gelu").
ACTIVATIONS: tuple[str, ...] = ("silu", "relu", "gelu", "gelu_erf")
ROPE_STYLES: tuple[str, ...] = ("norm", "neox")

#: Per-layer tensors, canonical suffixes after ``blk.{i}.``.
LAYER_TENSORS: tuple[str, ...] = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


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


#: The config values the Rust core takes (``_core.Model(config, tensors)``), in its order; the
#: first eight are positive integers.
CORE_CONFIG_FIELDS = (
    "n_layers",
    "dim",
    "ffn_dim",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "vocab_size",
    "max_context",
    "rms_eps",
    "rope_theta",
    "rope_style",
    "activation",
    "qkv_bias",
    "qk_norm",
    "sliding_window",
    "swa_pattern",
    "rope_theta_local",
    "norm_offset",
    "post_norms",
    "embed_scale",
    "attn_scale",
    "attn_softcap",
    "final_softcap",
    "relu_threshold",
    "up_act",
    "layer_norm",
    "learned_pos",
    "pos_offset",
    "no_gate",
    "ffn_bias",
    "out_bias",
    "parallel",
    "rope_dims",
    "rope_linear_factor",
    "rope_freq_factors",
)

#: The RoPE scaling fields with their "none" values: left out of the fingerprint when unset,
#: so models without scaling keep the fingerprints their plans and profiles were made with.
ROPE_DEFAULTS: dict[str, object] = {
    "rope_dims": 0,
    "rope_linear_factor": 0.0,
    "rope_freq_factors": [],
}


@dataclass
class ModelConfig:
    """Hyper-parameters of a llama-style decoder, in the engine's own vocabulary.

    ``arch`` names the family (:mod:`.archs`); the fields after ``tie_embeddings`` say what it
    changes in the llama layer: q/k/v biases, per-head q/k RMSNorm, a sliding attention window
    (0: none) and which layers slide (``swa_pattern`` 0: all; p: all but every p-th), the RoPE
    base of sliding layers, an offset added to every norm weight (Gemma's ``1 + w``), norms
    after attention and FFN, an embedding scale, the attention's query scale and soft-caps of
    the attention scores and the final logits (for the floats, 0 means "not set"), FATReLU's
    threshold (ProSparse: a ReLU activation that passes only ``x > t``) and whether the up
    projection is activated too (Bamboo); OPT's and Falcon's LayerNorm, learned positions (row
    ``pos + pos_offset`` of ``position_embd``), gate-less FFN, FFN and output biases, and
    parallel attention and FFN.

    RoPE (:mod:`.rope`): ``rope_dims`` values at the start of each head rotate (0: all of
    ``head_dim``; fewer for partial RoPE), pair ``i`` at position ``p`` by
    ``p * theta^(-2i/rope_dims) / rope_linear_factor / rope_freq_factors[i]`` (linear
    scaling, 0 = none; Llama 3.1's per-pair factors, ``rope_dims / 2`` of them, empty = none);
    layers with their own base (``rope_theta_local``) are not scaled.
    """

    arch: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    rms_eps: float
    rope_theta: float
    rope_style: str
    activation: str
    bos_token_id: int | None
    eos_token_ids: list[int] = field(default_factory=list)
    add_bos: bool = False
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window: int = 0
    swa_pattern: int = 0
    rope_theta_local: float = 0.0
    norm_offset: float = 0.0
    post_norms: bool = False
    embed_scale: float = 0.0
    attn_scale: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    relu_threshold: float = 0.0
    up_act: bool = False
    layer_norm: bool = False
    learned_pos: bool = False
    pos_offset: int = 0
    no_gate: bool = False
    ffn_bias: bool = False
    out_bias: bool = False
    parallel: bool = False
    rope_dims: int = 0
    rope_linear_factor: float = 0.0
    rope_freq_factors: list[float] = field(default_factory=list)

    @property
    def rotary_dims(self) -> int:
        """Values of each head that RoPE rotates."""
        return self.rope_dims or self.head_dim

    def validate(self) -> None:
        """Check the values fit together; raise :class:`ShapeError` / :class:`UnsupportedError`."""
        for name in CORE_CONFIG_FIELDS[:8]:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ShapeError(f"config {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ShapeError(
                f"n_heads ({self.n_heads}) is not a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim % 2:
            raise ShapeError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not (0 < self.rms_eps < math.inf and 0 < self.rope_theta < math.inf):
            raise ShapeError(
                "rms_eps and rope_theta must be positive and finite, got "
                f"{self.rms_eps}, {self.rope_theta}"
            )
        if self.rope_style not in ROPE_STYLES:
            raise UnsupportedError(f"rope style {self.rope_style!r} (supported: {ROPE_STYLES})")
        if self.activation not in ACTIVATIONS:
            raise UnsupportedError(f"activation {self.activation!r} (supported: {ACTIVATIONS})")
        if self.relu_threshold and self.activation != "relu":
            raise UnsupportedError("relu_threshold (FATReLU) needs the relu activation")
        for name in ("sliding_window", "swa_pattern", "pos_offset"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ShapeError(f"config {name} must be a non-negative integer, got {v!r}")
        self._validate_rope()
        ids = list(self.eos_token_ids)
        if self.bos_token_id is not None:
            ids.append(self.bos_token_id)
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise ShapeError(f"special token id {t} outside the vocabulary ({self.vocab_size})")

    def _validate_rope(self) -> None:
        if self.rope_dims:
            check_rope_dims(self.rope_dims, self.head_dim, "config rope_dims")
        lin = self.rope_linear_factor
        if isinstance(lin, bool) or not isinstance(lin, (int, float)) or not 0 <= lin < math.inf:
            raise ShapeError(f"config rope_linear_factor must be >= 0 and finite, got {lin!r}")
        if self.rope_freq_factors:
            self.rope_freq_factors = check_freq_factors(
                self.rope_freq_factors, self.rotary_dims, "config rope_freq_factors"
            )


@dataclass
class LoadedModel:
    """A model ready for the engine: config, raw tensors, tokenizer and chat template."""

    config: ModelConfig
    tensors: dict[str, TensorData]
    tokenizer: Tokenizer
    chat_template: str | None
    path: str
    fingerprint: str


def layer_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Canonical suffix (after ``blk.N.``) -> ``(rows, cols)`` of the tensors every layer of
    ``config``'s family needs."""
    c = config
    q_dim = c.n_heads * c.head_dim
    kv_dim = c.n_kv_heads * c.head_dim
    per_layer = {
        "attn_norm": (1, c.dim),
        "attn_q": (q_dim, c.dim),
        "attn_k": (kv_dim, c.dim),
        "attn_v": (kv_dim, c.dim),
        "attn_output": (c.dim, q_dim),
        "ffn_norm": (1, c.dim),
        "ffn_gate": (c.ffn_dim, c.dim),
        "ffn_up": (c.ffn_dim, c.dim),
        "ffn_down": (c.dim, c.ffn_dim),
    }
    if c.qkv_bias:
        per_layer.update(
            {"attn_q.bias": (1, q_dim), "attn_k.bias": (1, kv_dim), "attn_v.bias": (1, kv_dim)}
        )
    if c.qk_norm:
        per_layer.update({"attn_q_norm": (1, c.head_dim), "attn_k_norm": (1, c.head_dim)})
    if c.post_norms:
        per_layer.update({"post_attention_norm": (1, c.dim), "post_ffw_norm": (1, c.dim)})
    if c.no_gate:
        del per_layer["ffn_gate"]
    if c.parallel:  # the FFN reads attn_norm (or an optional attn_norm_2)
        del per_layer["ffn_norm"]
    if c.out_bias:
        per_layer["attn_output.bias"] = (1, c.dim)
    if c.ffn_bias:
        per_layer.update({"ffn_up.bias": (1, c.ffn_dim), "ffn_down.bias": (1, c.dim)})
    if c.layer_norm:
        for norm in [k for k in per_layer if k.endswith("_norm")]:
            per_layer[norm + ".bias"] = (1, c.dim)
    return per_layer


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """Canonical tensor name -> ``(rows, cols)`` implied by ``config``."""
    c = config
    shapes: dict[str, tuple[int, int]] = {
        "token_embd": (c.vocab_size, c.dim),
        "output": (c.vocab_size, c.dim),
        "output_norm": (1, c.dim),
    }
    if c.layer_norm:
        shapes["output_norm.bias"] = (1, c.dim)
    if c.learned_pos:
        shapes["position_embd"] = (c.max_context + c.pos_offset, c.dim)
    per_layer = layer_shapes(c)
    for i in range(c.n_layers):
        for suffix, shape in per_layer.items():
            shapes[f"blk.{i}.{suffix}"] = shape
    return shapes


def check_layer_count(config: ModelConfig, tensors: dict[str, TensorData], source: str) -> None:
    """:class:`ModelFileError` when the file's tensors cannot hold ``config.n_layers`` layers,
    before anything loops over the layers (a block count of 10^7 in a 15 KB file used to spend
    minutes and gigabytes listing the tensors it would need)."""
    need = config.n_layers * len(layer_shapes(config))
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
    for name, (rows, cols) in (shapes or expected_shapes(config)).items():
        t = tensors.get(name)
        if t is None:
            raise ModelFileError(f"{source}: required tensor {name!r} is missing")
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
    fields = asdict(config)
    for k, none in ROPE_DEFAULTS.items():
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
