"""Synthetic llama models for tests and benchmarks (ReluLLaMA / ProSparse shapes).

No ReLU checkpoint is reachable offline, so ReLU code paths are exercised on models written
here: any shape, random weights, and a *planted* power law of FFN activation frequencies.
Everything a figure measures on these models is "synthetic".

Weights (all drawn per tensor from ``default_rng([seed, crc32(name)])``, so HF and GGUF writers
produce identical values):

* projections ~ N(0, 1/fan_in); ``attn_output`` and ``ffn_down`` also scaled by
  ``1/sqrt(2 * layers)`` so the residual stream stays near unit scale;
* norms ~ 1 + N(0, 0.05²); embeddings ~ N(0, 1).

Planted activation frequencies. Channel 0 of the residual stream is a *bias channel*: every
embedding row has ``x[0] = C`` (``BIAS_VALUE``) and ``attn_output``/``ffn_down`` write nothing to
it, so it stays ``C`` in every layer (real LLMs grow such "massive activations" and use them as
biases the same way). Neuron ``i`` of ``ffn_gate`` then sees ``z_i = W[i,0] g_0 C + noise_i``
before the norm's positive scale, with ``noise_i ~ N(0, sigma_i²)``, ``sigma_i² = sum_{j>0}
W[i,j]² g_j²`` for unit-variance ``x[1:]``. Setting ``W[i,0] = sigma_i Phi^-1(p_i) / (g_0 C)``
makes ``P(z_i > 0) = p_i``. The target frequencies follow Zipf's law over a random permutation
of the neurons: ``p_(r) = min(0.98, a / r)`` for rank ``r = 1..ffn`` with ``a`` chosen so that
the mean is ``active`` (floored at 1e-4). The law is exact for layer 0 and approximate deeper
in (the residual stream drifts a little). For ReLU models the FFN is
``down(relu(gate x) * up x)``, so a neuron is active exactly when ``z_i > 0``.

Planted predictability. ``ffn_gate[:, 1:]`` is a product ``A @ B`` of rank ``gate_rank``
(default 64): the gate sees the residual stream through a few directions, so a low-rank
predictor can tell which neurons fire, as predictors do on real ReLU LLMs; ``gate_rank=0`` gives
a full-rank random gate, which no small predictor can follow.

The tokenizer is byte-level BPE: 3 special tokens (``<|endoftext|>`` = BOS, ``<|im_start|>``,
``<|im_end|>`` = EOS), the 256 byte symbols, then merges over common English letters until
the vocabulary has ``vocab`` entries.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..runtime.chat import CHATML_TEMPLATE

BIAS_VALUE = 4.0
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 0, 2
HF_DTYPES = {"bf16": "BF16", "f16": "F16", "f32": "F32"}
GGUF_DTYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
#: general.file_type values (llama.cpp's llama_ftype) for whole-model dtypes.
_GGUF_FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7}
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


# --------------------------------------------------------------------------- number formats
def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest, ties to even); returns the uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    out = (rounded >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 values."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


# --------------------------------------------------------------------------- tokenizer
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_level_vocab(vocab: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokens (in id order) and merges of a deterministic byte-level BPE of size ``vocab``.

    Ids 0..2 are the special tokens, 3..258 the byte symbols, the rest merges built
    breadth-first from ``Ġ`` (space) and letters by English frequency.
    """
    base = len(SPECIAL_TOKENS) + 256
    if vocab < base:
        raise ShapeError(f"a synthetic byte-level vocabulary needs at least {base} tokens")
    b2u = bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    merges: list[tuple[str, str]] = []
    have = set(tokens)
    space = b2u[ord(" ")]
    letters = list(_LETTERS)
    frontier = [space, *letters]
    while len(tokens) < vocab:
        nxt = []
        for left in frontier:
            for c in letters:
                tok = left + c
                if tok in have:
                    continue
                tokens.append(tok)
                merges.append((left, c))
                have.add(tok)
                nxt.append(tok)
                if len(tokens) == vocab:
                    return tokens, merges
        frontier = nxt
    return tokens, merges


def build_tokenizer(vocab: int):  # -> tokenizers.Tokenizer
    """The synthetic byte-level BPE as a ``tokenizers.Tokenizer`` (saved as tokenizer.json)."""
    import tokenizers
    from tokenizers import AddedToken, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tokens, merges = byte_level_vocab(vocab)
    tok = tokenizers.Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


# --------------------------------------------------------------------------- weights
@dataclass
class SynthSpec:
    """Shape and planting parameters of a synthetic model."""

    dim: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    activation: str = "relu"
    max_context: int = 512
    seed: int = 0
    active: float = 0.1
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie: bool = False
    gate_rank: int = 64

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def validate(self) -> None:
        for k in ("dim", "ffn", "layers", "heads", "kv_heads", "vocab", "max_context"):
            if getattr(self, k) <= 0:
                raise ShapeError(f"{k} must be positive")
        if self.dim % self.heads or self.head_dim % 2:
            raise ShapeError("dim must be a multiple of heads with an even head_dim")
        if self.heads % self.kv_heads:
            raise ShapeError("heads must be a multiple of kv_heads")
        if self.activation not in ("relu", "silu", "gelu"):
            raise UnsupportedError(f"activation {self.activation!r}")
        if not 0.0 < self.active < 1.0:
            raise ShapeError("active must lie in (0, 1)")

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Canonical names and HF shapes (``(out, in)``, or ``(n,)`` for norms), file order."""
        d, hd = self.dim, self.head_dim
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd", (self.vocab, d))]
        for i in range(self.layers):
            out += [
                (f"blk.{i}.attn_norm", (d,)),
                (f"blk.{i}.attn_q", (self.heads * hd, d)),
                (f"blk.{i}.attn_k", (self.kv_heads * hd, d)),
                (f"blk.{i}.attn_v", (self.kv_heads * hd, d)),
                (f"blk.{i}.attn_output", (d, self.heads * hd)),
                (f"blk.{i}.ffn_norm", (d,)),
                (f"blk.{i}.ffn_gate", (self.ffn, d)),
                (f"blk.{i}.ffn_up", (self.ffn, d)),
                (f"blk.{i}.ffn_down", (d, self.ffn)),
            ]
        out.append(("output_norm", (d,)))
        if not self.tie:
            out.append(("output", (self.vocab, d)))
        return out


def zipf_frequencies(n: int, mean: float, cap: float = 0.98, floor: float = 1e-4) -> np.ndarray:
    """Firing probabilities ``min(cap, a / rank)`` (rank 1..n), ``a`` set so the mean is
    ``mean``; sorted hottest first."""
    ranks = np.arange(1, n + 1, dtype=np.float64)

    def _p(a: float) -> np.ndarray:
        return np.clip(a / ranks, floor, cap)

    lo, hi = 0.0, float(n)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _p(mid).mean() < mean:
            lo = mid
        else:
            hi = mid
    return _p(0.5 * (lo + hi))


class SynthWeights:
    """Deterministic generator of a synthetic model's float32 weights, one tensor at a time."""

    def __init__(self, spec: SynthSpec) -> None:
        spec.validate()
        self.spec = spec

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.spec.seed, zlib.crc32(name.encode())])

    def _normal(self, name: str, shape: tuple[int, ...], scale: float) -> np.ndarray:
        x = self._rng(name).standard_normal(shape, dtype=np.float32)
        if scale != 1.0:
            x *= np.float32(scale)
        return x

    def firing_probabilities(self, layer: int) -> np.ndarray:
        """Planted firing probability of every FFN neuron of ``layer`` (neuron order)."""
        s = self.spec
        p = zipf_frequencies(s.ffn, s.active)
        perm = self._rng(f"blk.{layer}.ffn_perm").permutation(s.ffn)
        out = np.empty(s.ffn)
        out[perm] = p
        return out

    def tensor(self, name: str) -> np.ndarray:
        """The float32 tensor ``name`` (canonical name) in HF layout."""
        s = self.spec
        d = s.dim
        resid_scale = 1.0 / math.sqrt(2.0 * s.layers)
        if name == "token_embd":
            x = self._normal(name, (s.vocab, d), 1.0)
            x[:, 0] = BIAS_VALUE
            return x
        if name == "output":
            return self._normal(name, (s.vocab, d), 1.0 / math.sqrt(d))
        if name.endswith("_norm"):
            g = 1.0 + self._normal(name, (d,), 0.05)
            g[0] = 1.0
            return g
        layer_s, kind = name.split(".")[1:]
        layer = int(layer_s)
        hd = s.head_dim
        if kind == "attn_q":
            return self._normal(name, (s.heads * hd, d), 1.0 / math.sqrt(d))
        if kind in ("attn_k", "attn_v"):
            return self._normal(name, (s.kv_heads * hd, d), 1.0 / math.sqrt(d))
        if kind == "attn_output":
            w = self._normal(name, (d, s.heads * hd), resid_scale / math.sqrt(s.heads * hd))
            w[0, :] = 0.0
            return w
        if kind == "ffn_up":
            return self._normal(name, (s.ffn, d), 1.0 / math.sqrt(d))
        if kind == "ffn_down":
            w = self._normal(name, (d, s.ffn), resid_scale / math.sqrt(s.ffn))
            w[0, :] = 0.0
            return w
        if kind == "ffn_gate":
            w = self._normal(name, (s.ffn, d), 1.0 / math.sqrt(d))
            r = s.gate_rank
            if 0 < r < d - 1:
                # Planted low-rank structure: the gate reads x[1:] through an r-dimensional
                # projection, so which neurons fire is predictable from few directions (as
                # PowerInfer/DejaVu predictors find in real LLMs). Entries keep variance 1/d.
                a = self._normal(name + "#a", (s.ffn, r), 1.0)
                b = self._normal(name + "#b", (r, d - 1), 1.0)
                w[:, 1:] = (a @ b / math.sqrt(r * d)).astype(np.float32)
            g = self.tensor(f"blk.{layer}.ffn_norm").astype(np.float64)
            sigma = np.sqrt(((w[:, 1:].astype(np.float64) * g[1:]) ** 2).sum(axis=1))
            nd = NormalDist()
            quant = np.array([nd.inv_cdf(float(p)) for p in self.firing_probabilities(layer)])
            w[:, 0] = (sigma * quant / (g[0] * BIAS_VALUE)).astype(np.float32)
            return w
        raise ShapeError(f"no synthetic tensor named {name!r}")

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, tensor)`` in file order, generated lazily."""
        for name, _ in self.spec.tensor_shapes():
            yield name, self.tensor(name)


def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder q/k rows the way llama.cpp's converter does: within each head, row ``j * hd/2 + i``
    (half ``j``) moves to ``2 i + j``, so "norm" RoPE on adjacent pairs equals HF's "neox"."""
    rows = w.shape[0]
    hd = rows // n_heads
    return w.reshape(n_heads, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------- HF writer
HF_NAMES = {
    "token_embd": "model.embed_tokens.weight",
    "output": "lm_head.weight",
    "output_norm": "model.norm.weight",
    "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight",
    "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}


def hf_name(name: str) -> str:
    """HF parameter name of a canonical tensor name."""
    if name in HF_NAMES:
        return HF_NAMES[name]
    _, layer, kind = name.split(".")
    return f"model.layers.{layer}.{HF_NAMES[kind]}"


def _encode_hf(x: np.ndarray, st_dtype: str) -> np.ndarray:
    if st_dtype == "BF16":
        return f32_to_bf16_bits(x)
    return x.astype(np.float16 if st_dtype == "F16" else np.float32, copy=False)


def write_safetensors(
    path: Path, entries: list[tuple[str, str, tuple[int, ...]]], arrays: Iterator[np.ndarray]
) -> int:
    """Write a safetensors file from ``(name, dtype, shape)`` entries and matching arrays
    (streamed, in order). The header is padded with spaces to a multiple of 8. Returns the
    number of data bytes."""
    size = {"BF16": 2, "F16": 2, "F32": 4}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dt, shape in entries:
        n = math.prod(shape) * size[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for (name, _, shape), arr in zip(entries, arrays):
            if arr.shape != tuple(shape):
                raise ShapeError(f"{name}: array shape {arr.shape} != {shape}")
            f.write(np.ascontiguousarray(arr).tobytes())
    os.replace(tmp, path)
    return off


def write_hf_model(
    out_dir: str | os.PathLike[str],
    *,
    dim: int,
    ffn: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    dtype: str = "bf16",
    activation: str = "relu",
    max_context: int = 512,
    seed: int = 0,
    active: float = 0.1,
    shards: int = 1,
    tie: bool = False,
    gate_rank: int = 64,
) -> Path:
    """Write a synthetic HF llama directory (config.json, safetensors, tokenizer files).

    ``shards=2`` splits the weights over two files with a ``model.safetensors.index.json``.
    """
    if dtype not in HF_DTYPES:
        raise UnsupportedError(f"dtype {dtype!r} (choose from {', '.join(HF_DTYPES)})")
    if shards not in (1, 2):
        raise ShapeError("shards must be 1 or 2")
    spec = SynthSpec(
        dim,
        ffn,
        layers,
        heads,
        kv_heads,
        vocab,
        activation,
        max_context,
        seed,
        active,
        tie=tie,
        gate_rank=gate_rank,
    )
    gen = SynthWeights(spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = HF_DTYPES[dtype]
    torch_dtype = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": activation,
        "max_position_embeddings": max_context,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": vocab,
        "tie_word_embeddings": tie,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": torch_dtype,
        "powerinfer_rs_synthetic": {"seed": seed, "active": active, "law": "zipf"},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, indent=2)
    )
    build_tokenizer(vocab).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": SPECIAL_TOKENS[BOS_ID],
                "eos_token": SPECIAL_TOKENS[EOS_ID],
                "add_bos_token": False,
                "chat_template": CHATML_TEMPLATE,
                "model_max_length": max_context,
            },
            indent=2,
        )
    )

    names = [n for n, _ in spec.tensor_shapes()]
    shapes = dict(spec.tensor_shapes())
    groups = [names] if shards == 1 else [names[: len(names) // 2], names[len(names) // 2 :]]
    files = (
        ["model.safetensors"]
        if shards == 1
        else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    )
    for stale in list(out.glob("model*.safetensors")) + [out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    weight_map: dict[str, str] = {}
    total = 0
    for group, fname in zip(groups, files):
        entries = [(hf_name(n), st, shapes[n]) for n in group]
        arrays = (_encode_hf(gen.tensor(n), st) for n in group)
        total += write_safetensors(out / fname, entries, arrays)
        weight_map.update({hf_name(n): fname for n in group})
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return out


# --------------------------------------------------------------------------- GGUF writer
def _gguf_encode(x: np.ndarray, dtype: str) -> np.ndarray:
    import gguf

    if dtype == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "F16":
        return x.astype(np.float16)
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[dtype])


def write_gguf_model(
    out_path: str | os.PathLike[str],
    *,
    dim: int,
    ffn: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    dtype: str = "F16",
    activation: str = "relu",
    max_context: int = 512,
    seed: int = 0,
    active: float = 0.1,
    tie: bool = False,
    gate_rank: int = 64,
) -> Path:
    """Write the same synthetic model as :func:`write_hf_model` as a llama GGUF file.

    2-D weights are stored in ``dtype`` (norms always F32); q/k rows are permuted as llama.cpp's
    converter does. The activation is recorded as ``powerinfer_rs.activation`` (llama.cpp
    ignores the key and always runs SiLU). Returns ``out_path``.
    """
    import gguf

    dtype = dtype.upper()
    if dtype not in GGUF_DTYPES:
        raise UnsupportedError(f"dtype {dtype!r} (choose from {', '.join(GGUF_DTYPES)})")
    spec = SynthSpec(
        dim,
        ffn,
        layers,
        heads,
        kv_heads,
        vocab,
        activation,
        max_context,
        seed,
        active,
        tie=tie,
        gate_rank=gate_rank,
    )
    gen = SynthWeights(spec)
    if dtype.startswith("Q") and (dim % 32 or ffn % 32):
        raise ShapeError(f"{dtype} needs dim and ffn to be multiples of 32")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")

    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"synthetic-llama-{activation}-d{dim}-f{ffn}-l{layers}")
    w.add_block_count(layers)
    w.add_context_length(max_context)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_vocab_size(vocab)
    w.add_file_type(_GGUF_FILE_TYPE[dtype])
    w.add_string("powerinfer_rs.activation", activation)
    w.add_uint32("powerinfer_rs.synthetic_seed", seed)
    w.add_float32("powerinfer_rs.synthetic_active", active)
    tokens, merges = byte_level_vocab(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name for the GPT-2 split ("gpt2" is rejected)
    w.add_token_list(tokens)
    w.add_token_types([3 if i < len(SPECIAL_TOKENS) else 1 for i in range(vocab)])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    order = spec.tensor_shapes()
    qtype = gguf.GGMLQuantizationType[dtype]
    for name, shape in order:
        if len(shape) == 1:
            w.add_tensor_info(f"{name}.weight", shape, np.dtype(np.float32), shape[0] * 4)
            continue
        rows, cols = shape
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = rows * cols // block * size
        np_dt = {"F32": np.float32, "F16": np.float16}.get(dtype, np.uint8)
        raw_shape = shape if dtype in ("F32", "F16") else (rows, cols // block * size)
        w.add_tensor_info(
            f"{name}.weight",
            raw_shape,
            np.dtype(np_dt),
            nbytes,
            raw_dtype=None if dtype in ("F32", "F16") else qtype,
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in order:
        x = gen.tensor(name)
        if name.endswith("attn_q"):
            x = permute_qk(x, heads)
        elif name.endswith("attn_k"):
            x = permute_qk(x, kv_heads)
        w.write_tensor_data(x if len(shape) == 1 else _gguf_encode(x, dtype))
    w.close()
    os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """``python -m powerinfer_rs.synth``: write a synthetic model."""
    ap = argparse.ArgumentParser(
        prog="python -m powerinfer_rs.synth",
        description="Write a synthetic llama model (random weights, planted power-law FFN "
        "activation frequencies) as an HF directory or a GGUF file.",
    )
    ap.add_argument("--dim", type=int, default=256, help="hidden size")
    ap.add_argument("--ffn", type=int, default=704, help="FFN (intermediate) size")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None, help="KV heads (default: --heads)")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument(
        "--active",
        type=float,
        default=0.1,
        help="mean fraction of FFN neurons active per token (planted)",
    )
    ap.add_argument("--activation", choices=["relu", "silu", "gelu"], default="relu")
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument(
        "--format",
        default="hf",
        choices=["hf", "gguf-f32", "gguf-f16", "gguf-q8_0", "gguf-q4_0", "gguf-q4_1"],
    )
    ap.add_argument("--dtype", choices=list(HF_DTYPES), default="bf16", help="for --format hf")
    ap.add_argument("--shards", type=int, choices=[1, 2], default=1, help="for --format hf")
    ap.add_argument("--tie", action="store_true", help="tie the output head to the embeddings")
    ap.add_argument(
        "--gate-rank",
        type=int,
        default=64,
        help="rank of the planted low-rank gate structure that makes activity predictable "
        "(0 = full-rank random gate)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (hf) or .gguf path")
    a = ap.parse_args(argv)
    common = dict(
        dim=a.dim,
        ffn=a.ffn,
        layers=a.layers,
        heads=a.heads,
        kv_heads=a.kv_heads or a.heads,
        vocab=a.vocab,
        activation=a.activation,
        max_context=a.max_context,
        seed=a.seed,
        active=a.active,
        tie=a.tie,
        gate_rank=a.gate_rank,
    )
    t0 = time.perf_counter()
    try:
        if a.format == "hf":
            path = write_hf_model(a.out, dtype=a.dtype, shards=a.shards, **common)
        else:
            path = write_gguf_model(a.out, dtype=a.format.split("-", 1)[1].upper(), **common)
    except (ShapeError, UnsupportedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote synthetic model {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0

