"""The synthetic llama model itself (ReluLLaMA / ProSparse shapes): its shape (:class:`SynthSpec`)
and weights (:class:`SynthWeights`), with the vocabulary of :mod:`.synth_vocab`; :mod:`.synth`
writes it to files. ``arch`` picks the family (:mod:`..loading.archs`): the same layer plus that
family's tensors (q/k/v biases ~ N(0, 0.2²), per-head q/k norms and Gemma's post norms like the
other norms), its sliding window, soft-caps, FATReLU threshold (``relu_threshold``), and its
file layout (fused tensors, RoPE row order).

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
a full-rank random gate, which no small predictor can follow. Between the two, ``gate_noise``
(``eta`` in [0, 1], default 0) is the share of each row's non-bias gate variance that comes from
a full-rank random part: ``ffn_gate[:, 1:] = sqrt(1 - eta) A @ B + sqrt(eta) N`` with ``N ~
N(0, 1/dim)`` (the full-rank gate ``gate_rank=0`` would have), so a low-rank predictor can no
longer be exact (real gates are not exactly low rank either). ``sigma_i`` above is computed from
the row as written, noise included, so the planted frequencies stay exact for layer 0; with
``gate_noise=0`` every weight is bit for bit what it was before the option existed. A merged
expert's gates take the same mix.

Regimes: ``active=0.1`` is ProSparse-like (about 10% of neurons fire per token), ``active=0.3``
close to ReluLLaMA (about 30%).

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
from ..loading.archs import Family, family_config, family_named
from ..loading.rope import llama3_factors, longrope_attn_factor, yarn_factors, yarn_mscale
from ..loading.types import ModelConfig
from .synth_vocab import (  # noqa: F401  (re-exported: the vocabulary of the synthetic models)
    BOS_ID,
    EOS_ID,
    SPECIAL_TOKENS,
    build_tokenizer,
    byte_level_vocab,
    bytes_to_unicode,
)

BIAS_VALUE = 4.0


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
    #: Share of each gate row's non-bias variance from a full-rank random part (module docs).
    gate_noise: float = 0.0
    arch: str = "llama"
    sliding_window: int = 0
    attn_softcap: float = 50.0
    final_softcap: float = 30.0
    relu_threshold: float = 0.0
    #: RoPE scaling: "none", "linear" (positions divided by ``rope_factor``), "llama3"
    #: (Llama 3.1's per-pair factors from ``rope_factor``, ``rope_low_freq_factor``,
    #: ``rope_high_freq_factor`` and ``rope_original_context``), "yarn" (``rope_factor`` over
    #: ``rope_original_context``) or "longrope" (Phi-3's short and long factors,
    #: :meth:`longrope_factors`, for ``max_context`` over ``rope_original_context``).
    rope_scaling: str = "none"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_context: int = 8192
    #: Partial RoPE: the first ``int(head_dim * partial_rotary)`` values of each head rotate.
    partial_rotary: float = 1.0
    #: Mixture-of-experts families: experts per layer (0: 8), experts per token (0: 2), each
    #: expert's width (0: ``ffn``; Qwen's files carry it apart from ``feed_forward_length``,
    #: OLMoE's and Mixtral's as ``feed_forward_length``) and Qwen2-MoE's shared expert's (0:
    #: ``ffn``).
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    #: SmallThinker's router gating ("softmax" or "sigmoid": its expert_gating_func key;
    #: GLM-4.5's is sigmoid).
    expert_gating: str = "softmax"
    #: GLM-4.5: leading dense layers (first_k_dense_replace), shared experts of the experts'
    #: width (n_shared_experts), the weights' scale (routed_scaling_factor), q/k norms
    #: (use_qk_norm), NextN/MTP blocks after the decoder (num_nextn_predict_layers), and the
    #: expert groups (n_group / topk_group: 0 none; Hugging Face only, which llama.cpp's
    #: converter does not write for the family).
    dense_lead: int = 0
    shared_experts: int = 1
    expert_scale: float = 1.0
    use_qk_norm: bool = False
    nextn: int = 0
    expert_groups: int = 0
    expert_groups_used: int = 0

    def __post_init__(self) -> None:
        # A mixture-of-experts family without expert counts: 8 experts, 2 per token.
        if family_named(self.arch).moe:
            self.experts = self.experts or 8
            self.experts_used = self.experts_used or 2
        if self.arch == "glm4moe":
            self.expert_gating = "sigmoid"

    @property
    def glm(self) -> bool:
        """GLM-4.5's layer (:attr:`dense_lead` and the fields after it)."""
        return self.arch == "glm4moe"

    def moe_layer(self, layer: int) -> bool:
        """Whether ``layer`` has experts (GLM-4.5's first ``dense_lead`` layers do not)."""
        return self.family.moe and layer >= self.dense_lead

    @property
    def qk_norm(self) -> bool:
        """Whether q and k are RMS-normed (the family's, or GLM-4.5's ``use_qk_norm``)."""
        return self.family.qk_norm or (self.glm and self.use_qk_norm)

    @property
    def eff(self) -> int:
        """Each expert's width."""
        return self.expert_ffn or self.ffn

    @property
    def shared_width(self) -> int:
        """The shared expert's width (Qwen2-MoE's; GLM-4.5's shared experts as one), 0
        without one."""
        if self.glm:
            return self.eff * self.shared_experts
        return (self.shared_ffn or self.ffn) if self.family.shared_expert_gate else 0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def window(self) -> int:
        """The attention window the model has: ``sliding_window``, or for Gemma 2 (which
        always slides) transformers' and llama.cpp's default 4096 when it is 0."""
        if self.arch == "gemma2" and not self.sliding_window:
            return 4096
        if self.arch == "smallthinker" and self.sliding_window:
            return 4096  # llama.cpp's smallthinker.cpp, whatever the file says
        return self.sliding_window

    @property
    def hf_head_dim(self) -> int | None:
        """``head_dim`` as the family's config class stores it: None for Mistral (whose
        class keeps null), Falcon, OPT and Qwen2 (which have no such key), else the size."""
        no_head_dim = ("mistral", "mixtral", "bamboo", "falcon", "opt", "qwen2", "qwen2moe")
        no_head_dim += ("glm4moe",)
        if self.arch in (*no_head_dim, "olmoe"):
            return None
        return self.head_dim

    @property
    def rope_dims(self) -> int:
        """Values of each head that RoPE rotates (HF's ``int(head_dim * partial_rotary)``)."""
        return int(self.head_dim * self.partial_rotary)

    def rope_fields(self) -> dict[str, object]:
        """The config's RoPE fields (:mod:`..loading.rope`) of this model."""
        out: dict[str, object] = {
            "rope_dims": 0 if self.rope_dims == self.head_dim else self.rope_dims
        }
        if self.rope_scaling == "linear":
            out["rope_linear_factor"] = self.rope_factor
        elif self.rope_scaling == "llama3":
            out["rope_freq_factors"] = self.llama3_factors()
        elif self.rope_scaling == "yarn":
            orig, f = self.rope_original_context, self.rope_factor
            out["rope_freq_factors"] = yarn_factors(self.rope_theta, self.rope_dims, f, orig)
            out["rope_attn_factor"] = yarn_mscale(f)
        elif self.rope_scaling == "longrope":
            orig = self.rope_original_context
            out["rope_freq_factors"], out["rope_long_factors"] = self.longrope_factors()
            out["rope_original_context"] = orig
            out["rope_attn_factor"] = longrope_attn_factor(self.max_context / orig, orig)
        return out

    def longrope_factors(self) -> tuple[list[float], list[float]]:
        """LongRoPE's (short, long) per-pair factors of this model: the short ones near 1
        (``1 + 0.5 i / pairs``), the long ones growing to ``rope_factor`` (Phi-3's shape)."""
        n = self.rope_dims // 2
        short = [1.0 + 0.5 * i / n for i in range(n)]
        long = [1.0 + (self.rope_factor - 1.0) * (i / max(n - 1, 1)) ** 1.5 for i in range(n)]
        return short, long

    def llama3_factors(self) -> list[float]:
        """The "llama3" per-pair factors (llama.cpp's ``rope_freqs.weight``)."""
        return llama3_factors(
            self.rope_theta,
            self.rope_dims,
            self.rope_factor,
            self.rope_low_freq_factor,
            self.rope_high_freq_factor,
            self.rope_original_context,
        )

    @property
    def family(self) -> Family:
        """The model family (:mod:`..loading.archs`)."""
        return family_named(self.arch)

    def validate(self) -> None:
        for k in ("dim", "ffn", "layers", "heads", "kv_heads", "vocab", "max_context"):
            if getattr(self, k) <= 0:
                raise ShapeError(f"{k} must be positive")
        if self.dim % self.heads or self.head_dim % 2:
            raise ShapeError("dim must be a multiple of heads with an even head_dim")
        if self.heads % self.kv_heads:
            raise ShapeError("heads must be a multiple of kv_heads")
        if self.activation not in ("relu", "silu", "gelu", "gelu_erf"):
            raise UnsupportedError(f"activation {self.activation!r}")
        if not 0.0 < self.active < 1.0:
            raise ShapeError("active must lie in (0, 1)")
        if not 0.0 <= self.gate_noise <= 1.0:
            raise ShapeError(f"gate_noise must lie in [0, 1], got {self.gate_noise}")
        if self.sliding_window < 0 or (self.sliding_window and not self.family.window):
            raise ShapeError(f"sliding_window {self.sliding_window} for {self.arch}")
        if self.arch == "opt" and self.kv_heads != self.heads:
            raise ShapeError("opt has one KV head per query head: kv_heads must equal heads")
        kinds = ("none", "linear", "llama3", "yarn", "longrope")
        if self.rope_scaling not in kinds:
            raise UnsupportedError(f"rope_scaling {self.rope_scaling!r} ({', '.join(kinds)})")
        if self.rope_scaling == "longrope" and self.arch != "phi3":
            raise UnsupportedError("longrope: Phi-3's (llama.cpp's converter writes it for phi3)")
        if self.rope_scaling in ("yarn", "longrope") and not (
            0 < self.rope_original_context < self.max_context and self.rope_theta > 1
        ):
            raise ShapeError(f"{self.rope_scaling} needs 0 < rope_original_context < max_context")
        if not 0.0 < self.partial_rotary <= 1.0:
            raise ShapeError("partial_rotary must lie in (0, 1]")
        if self.rope_dims < 2 or self.rope_dims % 2:
            raise ShapeError(f"partial_rotary {self.partial_rotary} rotates {self.rope_dims} dims")
        if self.rope_scaling != "none" and self.family.learned_pos:
            raise ShapeError(f"{self.arch} has no RoPE to scale")
        if self.rope_scaling != "none" and not self.rope_factor > 0:
            raise ShapeError("rope_factor must be positive")
        if self.rope_scaling == "llama3" and not (
            0 < self.rope_low_freq_factor < self.rope_high_freq_factor
            and self.rope_original_context > 0
        ):
            raise ShapeError("llama3 RoPE needs 0 < low_freq_factor < high_freq_factor")
        if self.arch in ("gemma2", "opt") and not self.tie:
            # llama.cpp's gemma2 and PowerInfer's opt always read the head from token_embd.
            raise ShapeError(f"{self.arch} ties its output head to the embeddings: pass tie=True")
        # What llama.cpp's converter cannot write for the family (so no file of it exists).
        if self.arch in ("gemma2", "falcon") and self.rope_theta != 10000.0:
            raise ShapeError(f"{self.arch}: llama.cpp's converter writes no RoPE base (10000)")
        if self.arch in ("gemma2", "falcon") and self.rope_scaling != "none":
            raise ShapeError(f"{self.arch}: llama.cpp's converter writes no {self.rope_scaling}")
        if self.family.moe:
            if not 0 < self.experts_used <= self.experts:
                raise ShapeError(f"{self.arch}: need 0 < experts_used <= experts")
            if self.expert_gating not in ("softmax", "sigmoid"):
                raise UnsupportedError(f"expert_gating {self.expert_gating!r}")
            if self.expert_gating != "softmax" and self.arch not in ("smallthinker", "glm4moe"):
                raise ShapeError(f"{self.arch} routes with a softmax")
            if not 0 <= self.dense_lead <= self.layers or (self.dense_lead and not self.glm):
                raise ShapeError(f"{self.arch}: dense_lead {self.dense_lead}")
            g, k = self.expert_groups, self.expert_groups_used
            if g and (self.experts % g or not 0 < k <= g or not self.glm):
                raise ShapeError(f"expert groups {g}/{k} for {self.experts} experts")
            fixed = ("olmoe", "mixtral", "smallthinker")
            if self.arch in fixed and self.expert_ffn not in (0, self.ffn):
                raise ShapeError(f"{self.arch}: the experts are ffn wide (expert_ffn 0)")
            if self.arch == "olmoe" and self.rms_eps != 1e-5:
                raise ShapeError("olmoe: llama.cpp's converter writes the epsilon 1e-5")
            if self.arch == "olmoe" and self.kv_heads != self.heads:
                # llama.cpp's olmoe reads attn_k_norm of n_embd (OLMoE-1B-7B has no GQA).
                raise ShapeError("olmoe: one KV head per query head (kv_heads = heads)")
        elif self.experts or self.experts_used:
            raise ShapeError(f"{self.arch} has no experts")
        if self.arch == "falcon" and self.kv_heads not in (1, self.heads):
            # The 7B layout: multi-query, or one K/V head per query head.
            raise ShapeError("falcon has 1 KV head or one per query head")

    def model_config(self) -> ModelConfig:
        """The config the GGUF loader reads from this model's file (also a model shape for the
        planner without any weights)."""
        f = self.family
        return family_config(
            f,
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
            activation=self.activation,
            bos_token_id=BOS_ID,
            eos_token_ids=[EOS_ID],
            tie_embeddings=self.tie,
            sliding_window=self.window,
            embed_scale=float(self.dim) ** 0.5 if f.scale_embeddings else 0.0,
            attn_softcap=self.softcaps[0],
            final_softcap=self.softcaps[1],
            relu_threshold=self.relu_threshold,
            n_expert=self.experts,
            n_expert_used=self.experts_used,
            expert_gating=self.expert_gating,
            no_rope_step=4 if self.arch == "smallthinker" and self.window else 0,
            expert_ffn_dim=self.eff if self.experts else 0,
            shared_ffn_dim=self.shared_width,
            **self._glm_fields(),
            **self.rope_fields(),  # type: ignore[arg-type]
        )

    def _glm_fields(self) -> dict[str, object]:
        """GLM-4.5's config fields (:attr:`dense_lead` and after)."""
        if not self.glm:
            return {}
        scale = 0.0 if self.expert_scale == 1.0 else self.expert_scale
        return {
            "dense_lead_layers": self.dense_lead,
            "expert_norm_weights": True,
            "expert_weights_scale": scale,
            "qk_norm": self.use_qk_norm,
            "expert_groups": self.expert_groups if self.expert_groups > 1 else 0,
            "expert_groups_used": self.expert_groups_used if self.expert_groups > 1 else 0,
        }

    @property
    def softcaps(self) -> tuple[float, float]:
        """(attention, final) soft-caps: Gemma 2's, 0 for the other families."""
        on = self.arch == "gemma2"
        return (self.attn_softcap, self.final_softcap) if on else (0.0, 0.0)

    def tensor_shapes(self, fused: bool = False) -> list[tuple[str, tuple[int, ...]]]:
        """Canonical names and HF shapes (``(out, in)``, or ``(n,)`` for norms and biases),
        file order; ``fused``: as the family's files store them (Phi-3's ``attn_qkv`` and
        gate+up ``ffn_up``)."""
        d, hd, f = self.dim, self.head_dim, self.family
        q, kv = self.heads * hd, self.kv_heads * hd
        fuse_qkv, fuse_ffn = fused and f.fused_qkv, fused and f.fused_gate_up
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd", (self.vocab, d))]
        if f.learned_pos:
            out.append(("position_embd", (self.max_context + f.pos_offset, d)))

        def norm(name: str) -> list[tuple[str, tuple[int, ...]]]:
            return [(name, (d,))] + ([(name + ".bias", (d,))] if f.layer_norm else [])

        for i in range(self.layers + self.nextn):
            p = f"blk.{i}."
            if i >= self.layers:  # a NextN/MTP block: its own tensors, then a decoder layer
                out += [(p + "nextn.eh_proj", (d, 2 * d)), (p + "nextn.enorm", (d,))]
                out += [(p + "nextn.hnorm", (d,)), (p + "nextn.shared_head_norm", (d,))]
            out += norm(p + "attn_norm")
            if fuse_qkv:
                out.append((p + "attn_qkv", (q + 2 * kv, d)))
            else:
                out += [(p + "attn_q", (q, d)), (p + "attn_k", (kv, d)), (p + "attn_v", (kv, d))]
            if f.qkv_bias:
                out += [(p + f"attn_{x}.bias", (n,)) for x, n in zip("qkv", (q, kv, kv))]
            if self.qk_norm:
                nq, nk = (q, kv) if f.qk_norm_full else (hd, hd)
                out += [(p + "attn_q_norm", (nq,)), (p + "attn_k_norm", (nk,))]
            out.append((p + "attn_output", (d, q)))
            out += [(p + "attn_output.bias", (d,))] if f.out_bias else []
            if f.post_norms:
                out.append((p + "post_attention_norm", (d,)))
            out += [] if f.parallel else norm(p + "ffn_norm")
            if self.moe_layer(i):
                out += self._expert_shapes(p)
                continue
            if fuse_ffn:
                out.append((p + "ffn_up", (2 * self.ffn, d)))
            elif f.no_gate:
                out.append((p + "ffn_up", (self.ffn, d)))
            else:
                out += [(p + "ffn_gate", (self.ffn, d)), (p + "ffn_up", (self.ffn, d))]
            out += [(p + "ffn_up.bias", (self.ffn,))] if f.ffn_bias else []
            out.append((p + "ffn_down", (d, self.ffn)))
            out += [(p + "ffn_down.bias", (d,))] if f.ffn_bias else []
            if f.post_norms:
                out.append((p + "post_ffw_norm", (d,)))
        out += norm("output_norm")
        if not self.tie:
            out.append(("output", (self.vocab, d)))
        return out

    def _expert_shapes(self, p: str) -> list[tuple[str, tuple[int, ...]]]:
        """A layer's router and merged experts (3-D: experts first, as the converter stacks
        them), then the shared expert and its gate."""
        d, e, ef, sf = self.dim, self.experts, self.eff, self.shared_width
        out: list[tuple[str, tuple[int, ...]]] = [
            (p + "ffn_gate_inp", (e, d)),
            (p + "ffn_gate_exps", (e, ef, d)),
            (p + "ffn_up_exps", (e, ef, d)),
            (p + "ffn_down_exps", (e, d, ef)),
        ]
        if self.glm:
            out.append((p + "exp_probs_b.bias", (e,)))
        if sf and self.family.shared_expert_gate:
            out.append((p + "ffn_gate_inp_shexp", (d,)))
        if sf:
            out += [(p + "ffn_gate_shexp", (sf, d))]
            out += [(p + "ffn_up_shexp", (sf, d)), (p + "ffn_down_shexp", (d, sf))]
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

    def _noisy_gate(self, low: np.ndarray, full: np.ndarray) -> np.ndarray:
        """A gate's non-bias part: the planted low-rank ``low`` with ``gate_noise`` of its
        variance from the full-rank random ``full`` (both of entry variance 1/dim); ``low``
        itself, untouched, without noise."""
        eta = self.spec.gate_noise
        if not eta:
            return low
        mixed = low.astype(np.float64) * math.sqrt(1.0 - eta) + full * math.sqrt(eta)
        return mixed.astype(np.float32)

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
        if ".nextn." in name:  # never run: any values of its shape
            shape = dict(s.tensor_shapes())[name]
            return self._normal(name, shape, 1.0 / math.sqrt(shape[-1]))
        if name.endswith(".exp_probs_b.bias"):
            # GLM's correction bias: large enough to change which experts are chosen.
            return self._normal(name, (s.experts,), 0.3)
        if name.endswith(".bias"):
            # As wide as the rows of its weight; what is added to the residual stream leaves
            # the bias channel 0 alone.
            base = name[: -len(".bias")].rsplit(".", 1)[-1]
            rows = {"attn_q": s.heads, "attn_k": s.kv_heads, "attn_v": s.kv_heads}
            n = rows[base] * s.head_dim if base in rows else s.ffn if base == "ffn_up" else d
            b = self._normal(name, (n,), 0.2)
            if n == d:
                b[0] = 0.0
            return b
        if name == "position_embd":
            x = self._normal(name, (s.max_context + s.family.pos_offset, d), 0.5)
            x[:, 0] = 0.0
            return x
        if s.family.no_gate and name.endswith("ffn_up"):
            # The one activated projection carries the planted law of the gate.
            return self.tensor(name[: -len("ffn_up")] + "ffn_gate")
        if name.endswith(("attn_q_norm", "attn_k_norm")):
            n = s.head_dim
            if s.family.qk_norm_full:  # OLMoE: q and k normed whole
                n *= s.heads if name.endswith("attn_q_norm") else s.kv_heads
            return 1.0 + self._normal(name, (n,), 0.05)
        if s.family.moe and ("_exps" in name or "_shexp" in name or "gate_inp" in name):
            return self._expert_tensor(name, resid_scale)
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
                w[:, 1:] = self._noisy_gate((a @ b / scale).astype(np.float32), w[:, 1:])
            g = self.tensor(f"blk.{layer}.ffn_norm").astype(np.float64)
            sigma = np.sqrt(((w[:, 1:].astype(np.float64) * g[1:]) ** 2).sum(axis=1))
            nd = NormalDist()
            quant = np.array([nd.inv_cdf(float(p)) for p in self.firing_probabilities(layer)])
            w[:, 0] = (sigma * quant / (g[0] * BIAS_VALUE)).astype(np.float32)
            return w
        raise ShapeError(f"no synthetic tensor named {name!r}")

    def _expert_tensor(self, name: str, resid_scale: float) -> np.ndarray:
        """A router, merged expert or shared expert tensor: projections ~ N(0, 1/fan_in),
        the down projections also scaled by ``resid_scale`` and writing nothing to the bias
        channel 0; the router's logits of unit scale, so routing is decided, not near ties."""
        s, d = self.spec, self.spec.dim
        kind = name.rsplit(".", 1)[-1]
        e, ef, sf = s.experts, s.eff, s.shared_width
        if kind == "ffn_gate_inp":
            return self._normal(name, (e, d), 2.0 / math.sqrt(d))
        if kind == "ffn_gate_inp_shexp":
            return self._normal(name, (d,), 1.0 / math.sqrt(d))
        if kind == "ffn_gate_exps" and s.activation == "relu":
            return self._planted_expert_gates(name)
        if kind in ("ffn_gate_exps", "ffn_up_exps"):
            return self._normal(name, (e, ef, d), 1.0 / math.sqrt(d))
        if kind in ("ffn_gate_shexp", "ffn_up_shexp"):
            return self._normal(name, (sf, d), 1.0 / math.sqrt(d))
        width = {"ffn_down_exps": ef, "ffn_down_shexp": sf}.get(kind)
        if width is None:
            raise ShapeError(f"no synthetic tensor named {name!r}")
        shape = (e, d, ef) if kind == "ffn_down_exps" else (d, sf)
        w = self._normal(name, shape, resid_scale / math.sqrt(width))
        w[..., 0, :] = 0.0
        return w

    def _planted_expert_gates(self, name: str) -> np.ndarray:
        """ReLU experts' gates with the dense gate's planted law (see the module docs): in
        each expert, neuron i fires with probability p_i (Zipf over a random permutation of
        the expert's neurons, mean ``active``), through its weight on the bias channel; and
        the planted predictability: with ``gate_rank`` r (0 < r < dim - 1) each expert's gate
        reads x[1:] through the layer's r directions, ``gate[e][:, 1:] = a_e @ b / sqrt(r dim)``
        (entries of variance 1/dim), so a predictor per expert can tell which neurons fire."""
        s, d = self.spec, self.spec.dim
        layer = int(name.split(".")[1])
        w = self._normal(name, (s.experts, s.eff, d), 1.0 / math.sqrt(d))
        r = s.gate_rank
        if 0 < r < d - 1:
            b = self._normal(name + "#b", (r, d - 1), 1.0)
            for e in range(s.experts):
                a = self._normal(f"{name}#a{e}", (s.eff, r), 1.0)
                low = (a @ b / math.sqrt(r * d)).astype(np.float32)
                w[e, :, 1:] = self._noisy_gate(low, w[e, :, 1:])
        g = self.tensor(f"blk.{layer}.ffn_norm").astype(np.float64)
        nd = NormalDist()
        p = zipf_frequencies(s.eff, s.active)
        for e in range(s.experts):
            perm = self._rng(f"{name}#perm{e}").permutation(s.eff)
            probs = np.empty(s.eff)
            probs[perm] = p
            sigma = np.sqrt(((w[e, :, 1:].astype(np.float64) * g[1:]) ** 2).sum(axis=1))
            quant = np.array([nd.inv_cdf(float(q)) for q in probs])
            w[e, :, 0] = (sigma * quant / (g[0] * BIAS_VALUE)).astype(np.float32)
        return w

    def file_tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` of :meth:`SynthSpec.tensor_shapes` ``(fused=True)``: the canonical
        tensor, or the family's fused one (q, k, v stacked; gate then up)."""
        f = self.spec.family
        layer, _, kind = name.rpartition(".")
        if f.fused_qkv and kind == "attn_qkv":
            return np.concatenate([self.tensor(f"{layer}.attn_{x}") for x in "qkv"])
        if f.fused_gate_up and kind == "ffn_up":
            return np.concatenate([self.tensor(f"{layer}.ffn_gate"), self.tensor(name)])
        return self.tensor(name)

    def gguf_tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` (fused names as :meth:`file_tensor`) as a GGUF of the family stores
        it: for llama's "norm" RoPE, q/k rows permuted (:func:`permute_qk`)."""
        x = self.file_tensor(name)
        if self.spec.family.rope_style != "norm":
            return x
        if name.endswith("attn_q"):
            return permute_qk(x, self.spec.heads, self.spec.rope_dims)
        if name.endswith("attn_k"):
            return permute_qk(x, self.spec.kv_heads, self.spec.rope_dims)
        return x

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, tensor)`` in file order, generated lazily."""
        for name, _ in self.spec.tensor_shapes():
            yield name, self.tensor(name)


def permute_qk(w: np.ndarray, n_heads: int, rope_dims: int | None = None) -> np.ndarray:
    """Reorder q/k rows the way llama.cpp's converter does: within each head, row ``j * hd/2 + i``
    (half ``j``) moves to ``2 i + j``, so "norm" RoPE on adjacent pairs equals HF's "neox".

    With partial RoPE (``rope_dims`` < head size; llama.cpp's converter has no such llama) only
    the rotated rows at the start of each head are reordered, over ``rope_dims / 2`` pairs, so
    the "norm" pairs of the GGUF file are HF's halves of its rotated part."""
    rows = w.shape[0]
    hd = rows // n_heads
    rot = rope_dims or hd
    heads = w.reshape(n_heads, hd, *w.shape[1:])
    part = heads[:, :rot].reshape(n_heads, 2, rot // 2, *w.shape[1:]).swapaxes(1, 2)
    out = heads.copy()
    out[:, :rot] = part.reshape(n_heads, rot, *w.shape[1:])
    return out.reshape(w.shape)
