"""The synthetic llama model itself (ReluLLaMA / ProSparse shapes): its shape (:class:`SynthSpec`),
weights (:class:`SynthWeights`) and byte-level BPE vocabulary; :mod:`.synth` writes it to files.

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

import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..loading.types import ModelConfig

BIAS_VALUE = 4.0
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 0, 2
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

    def model_config(self) -> ModelConfig:
        """The config the GGUF loader reads from this model's file (also a model shape for the
        planner without any weights)."""
        return ModelConfig(
            arch="llama",
            n_layers=self.layers,
            dim=self.dim,
            ffn_dim=self.ffn,
            n_heads=self.heads,
            n_kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab,
            max_context=self.max_context,
            rms_eps=self.rms_eps,
            rope_theta=self.rope_theta,
            rope_style="norm",
            activation=self.activation,
            bos_token_id=BOS_ID,
            eos_token_ids=[EOS_ID],
            tie_embeddings=self.tie,
        )

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

    def gate_factors(self, layer: int) -> tuple[np.ndarray, np.ndarray, float] | None:
        """``(a [ffn, r], b [r, dim - 1], scale)`` with ``ffn_gate[:, 1:] = a @ b / scale``
        (the planted low-rank gate), or None for a full-rank gate."""
        s, name = self.spec, f"blk.{layer}.ffn_gate"
        r = s.gate_rank
        if not 0 < r < s.dim - 1:
            return None
        a = self._normal(name + "#a", (s.ffn, r), 1.0)
        return a, self._normal(name + "#b", (r, s.dim - 1), 1.0), math.sqrt(r * s.dim)

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
            factors = self.gate_factors(layer)
            if factors is not None:
                # Planted low-rank structure: the gate reads x[1:] through an r-dimensional
                # projection, so which neurons fire is predictable from few directions (as
                # PowerInfer/DejaVu predictors find in real LLMs). Entries keep variance 1/d.
                a, b, scale = factors
                w[:, 1:] = (a @ b / scale).astype(np.float32)
            g = self.tensor(f"blk.{layer}.ffn_norm").astype(np.float64)
            sigma = np.sqrt(((w[:, 1:].astype(np.float64) * g[1:]) ** 2).sum(axis=1))
            nd = NormalDist()
            quant = np.array([nd.inv_cdf(float(p)) for p in self.firing_probabilities(layer)])
            w[:, 0] = (sigma * quant / (g[0] * BIAS_VALUE)).astype(np.float32)
            return w
        raise ShapeError(f"no synthetic tensor named {name!r}")

    def gguf_tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a llama GGUF stores it: q/k rows permuted (:func:`permute_qk`)."""
        x = self.tensor(name)
        if name.endswith("attn_q"):
            return permute_qk(x, self.spec.heads)
        if name.endswith("attn_k"):
            return permute_qk(x, self.spec.kv_heads)
        return x

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
