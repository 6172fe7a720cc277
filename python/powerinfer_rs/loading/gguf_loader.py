"""Load a GGUF file of a supported family (:mod:`.archs`: llama/mistral, qwen2, qwen3, phi3,
gemma2, gemma3, falcon and the mixtures of experts (qwen3moe, qwen2moe, olmoe, mixtral,
smallthinker, glm4moe, deepseek2) with llama.cpp's keys and tensor names; bamboo and opt with
PowerInfer's): config from its metadata, tensors as raw mmap views. GLM-4.5's NextN/MTP blocks
past the decoder (``nextn_predict_layers``) are left out, as llama.cpp skips them.

Weights keep their GGUF encoding (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K);
nothing is dequantised.
GGUF lists dimensions innermost first (``ne[0]`` = columns), so a 2-D tensor ``[cols, rows]``
becomes ``TensorData(rows=ne[1], cols=ne[0])``. The ``llama`` arch in GGUF always has its
q/k rows permuted by the converter, so RoPE rotates adjacent pairs: ``rope_style = "norm"``;
the other families keep HF's row order (``"neox"``). Fused tensors (Phi-3's ``attn_qkv`` and
gate+up ``ffn_up``) are split into row views.

RoPE scaling (linear, Llama 3.1's ``rope_freqs`` factors, YaRN, LongRoPE's factor tensors) and
partial RoPE (``rope.dimension_count`` below the head size) are read by :mod:`.rope`;
other scaling types are refused.

The header is parsed by :mod:`.gguf_file` (fast and strict) rather than ``gguf.GGUFReader``.
What a file leaves implicit is what llama.cpp's graph for its arch does (:mod:`.archs` says it
family by family): the activation (SiLU; GELU for Gemma 2/3 and Falcon), Gemma 2's window
(4096) and soft-caps (50, 30), Gemma 3's local RoPE base (10000), Gemma 2's head tied to the
embeddings. The norm epsilon is required, as llama.cpp requires it. Files that llama.cpp cannot
express carry keys of ours: ``powerinfer_rs.activation`` (a ReLU llama, ...; llama.cpp ignores
the key) and ``powerinfer_rs.relu_threshold`` (FATReLU).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from ..runtime.tokenizer import Tokenizer
from .archs import GGUF_FAMILIES, Family, family_config, family_named, nextn_layer, split_fused
from .gguf_file import MAGIC, GGUFTensorInfo, starts_with
from .gguf_split import GGUFModelFiles
from .rope import (
    LONGROPE_TENSORS,
    gguf_original_context,
    gguf_rope_fields,
    gguf_scaling_type,
    rope_freqs_values,
)
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

SUPPORTED_ARCHS: tuple[str, ...] = tuple(GGUF_FAMILIES)
ACTIVATION_KEY = "powerinfer_rs.activation"
#: FATReLU's threshold (ProSparse) in our synthetic files; llama.cpp ignores the key.
RELU_THRESHOLD_KEY = "powerinfer_rs.relu_threshold"


def open_gguf(path: str | os.PathLike[str]) -> GGUFModelFiles:
    """Parse a GGUF model's header (memory-mapped, read-only): one file, or every shard of a
    split one given by its first (:mod:`.gguf_split`); ModelFileError if malformed."""
    return GGUFModelFiles(path)


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


def _float(meta: dict[str, Any], key: str, default: float | None) -> float:
    v = meta.get(key, default)
    if v is None:
        raise ModelFileError(f"GGUF metadata key {key!r} is missing")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ModelFileError(f"GGUF metadata key {key!r} must be a number, got {v!r}")
    return float(v)


def config_from_metadata(meta: dict[str, Any], tokenizer: Tokenizer | None) -> ModelConfig:
    """Build the :class:`ModelConfig` from GGUF metadata (``{arch}.*`` keys)."""
    fam = _family(meta)
    a = fam.gguf_arch
    dim = _int(meta, f"{a}.embedding_length")
    n_heads = _int(meta, f"{a}.attention.head_count")
    n_kv = _int(meta, f"{a}.attention.head_count_kv", n_heads)
    if n_heads <= 0 or dim <= 0:
        raise ShapeError(f"embedding_length ({dim}) and head_count ({n_heads}) must be positive")
    head_dim = _int(meta, f"{a}.attention.key_length", dim // n_heads)
    mla = fam.name == "deepseek2"  # value_length: the latent part of the key row
    if not mla and _int(meta, f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedError("attention.value_length differing from key_length")
    if head_dim <= 0:
        raise ShapeError(f"attention.key_length ({head_dim}) must be positive")
    rope_dims = _int(meta, f"{a}.rope.dimension_count", head_dim)
    rope = gguf_rope_fields(meta, a, head_dim, rope_dims)
    # YaRN's reach (factor x original) where the file's context_length says less.
    max_context = max(_int(meta, f"{a}.context_length", 2048), rope.pop("max_context", 0))
    tokens = meta.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if isinstance(tokens, list) else None
    vocab = _int(meta, f"{a}.vocab_size", n_tokens)
    activation = meta.get(ACTIVATION_KEY, fam.activation)
    if activation not in ACTIVATIONS:
        raise UnsupportedError(f"activation {activation!r} (supported: {ACTIVATIONS})")
    window = _int(meta, f"{a}.attention.sliding_window", fam.gguf_window) if fam.window else 0
    if window and fam.gguf_fixed_window:
        window = fam.gguf_fixed_window
    eps_kind = "epsilon" if fam.layer_norm else "rms_epsilon"
    n_layers = _int(meta, f"{a}.block_count")
    attn_cap, final_cap = (
        0.0 if d is None else _float(meta, f"{a}.{k}_logit_softcapping", d)
        for k, d in zip(("attn", "final"), fam.gguf_softcaps)
    )
    rope_local = fam.rope_theta_local
    if fam.gguf_rope_base_swa:
        rope_local = _float(meta, f"{a}.rope.freq_base_swa", rope_local)
    cfg = family_config(
        fam,
        n_layers=n_layers,
        dim=dim,
        ffn_dim=_int(meta, f"{a}.feed_forward_length"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        vocab_size=vocab,
        max_context=max_context,
        rms_eps=_float(meta, f"{a}.attention.layer_norm_{eps_kind}", None),
        rope_theta=_float(meta, f"{a}.rope.freq_base", 10000.0),
        activation=activation,
        bos_token_id=tokenizer.bos_id if tokenizer else None,
        eos_token_ids=list(tokenizer.eos_ids) if tokenizer else [],
        add_bos=tokenizer.add_bos if tokenizer else False,
        sliding_window=window,
        swa_pattern=_swa_pattern(meta, fam, n_layers) if window else fam.swa_pattern,
        rope_theta_local=rope_local,
        embed_scale=float(dim) ** 0.5 if fam.scale_embeddings else 0.0,
        attn_scale=_gemma_27b_scale(fam, n_layers, dim, n_heads),
        attn_softcap=attn_cap,
        final_softcap=final_cap,
        relu_threshold=_float(meta, RELU_THRESHOLD_KEY, 0.0),
        **rope,
    )
    _read_experts(meta, fam, cfg)
    if window and fam.gguf_fixed_window:
        cfg.no_rope_step = 4  # llama.cpp's n_no_rope_layer_step: the global layers
    cfg.validate()
    return cfg


def _read_experts(meta: dict[str, Any], fam: Family, cfg: ModelConfig) -> None:
    """The expert settings of a mixture-of-experts file into ``cfg``, as llama.cpp reads
    them: ``expert_count`` and ``expert_used_count`` (both required), each expert's width from
    ``expert_feed_forward_length`` (Qwen2/3-MoE: else ``feed_forward_length /
    expert_used_count``; OLMoE and Mixtral: ``feed_forward_length``), Qwen2-MoE's shared
    expert from ``expert_shared_feed_forward_length`` (else ``feed_forward_length``). The
    routing (gating, renormalisation) is the family's, as in llama.cpp's graphs."""
    if not fam.moe:
        return
    a = fam.gguf_arch
    n_expert = _int(meta, f"{a}.expert_count", 0)
    n_used = _int(meta, f"{a}.expert_used_count", 0)
    if n_expert <= 0 or n_used <= 0:
        raise ModelFileError(
            f"{a}.expert_count ({n_expert}) and {a}.expert_used_count ({n_used}) must be positive"
        )
    if fam.name in ("qwen2moe", "qwen3moe"):
        expert_ffn = _int(meta, f"{a}.expert_feed_forward_length", cfg.ffn_dim // n_used)
    elif fam.name == "glm4moe":
        expert_ffn = _glm4moe_experts(meta, cfg)
    elif fam.name == "gpt-oss":  # openai-moe.cpp: expert_feed_forward_length, required
        expert_ffn = _int(meta, f"{a}.expert_feed_forward_length")
    elif fam.name == "deepseek2":
        expert_ffn = _deepseek2_experts(meta, cfg)
    elif fam.name == "smallthinker":
        expert_ffn = _int(meta, f"{a}.expert_feed_forward_length", cfg.ffn_dim)
        gating = meta.get(f"{a}.expert_gating_func")
        # gguf's ExpertGatingFuncType: 1 softmax, 2 sigmoid (llama.cpp aborts without one).
        names = {1: "softmax", 2: "sigmoid"}
        if gating is None:
            raise ModelFileError(f"{a}.expert_gating_func is missing")
        if gating not in names:
            raise UnsupportedError(f"{a}.expert_gating_func {gating!r} (1 softmax, 2 sigmoid)")
        cfg.expert_gating = names[gating]
    else:
        expert_ffn = cfg.ffn_dim
    cfg.n_expert, cfg.n_expert_used, cfg.expert_ffn_dim = n_expert, n_used, expert_ffn
    if fam.shared_expert_gate:
        cfg.shared_ffn_dim = _int(meta, f"{a}.expert_shared_feed_forward_length", cfg.ffn_dim)


def _shared_lead_and_routing(
    meta: dict[str, Any], cfg: ModelConfig, a: str, gating: int, scale: float
) -> int:
    """The expert keys GLM-4.5's and DeepSeek's graphs read alike, into ``cfg``; returns each
    expert's width (``expert_feed_forward_length``, required). ``expert_shared_count``
    (required) shared experts of that width make one shared expert; the first
    ``leading_dense_block_count`` layers (default 0) are dense; ``expert_gating_func`` (1
    softmax, 2 sigmoid; absent: ``gating``); ``expert_weights_norm`` (default false);
    ``expert_weights_scale`` (absent: ``scale``; 1 and 0 both mean none)."""
    expert_ffn = _int(meta, f"{a}.expert_feed_forward_length")
    cfg.shared_ffn_dim = expert_ffn * _int(meta, f"{a}.expert_shared_count")
    cfg.dense_lead_layers = _int(meta, f"{a}.leading_dense_block_count", 0)
    func = meta.get(f"{a}.expert_gating_func", gating)
    if func not in (1, 2):
        raise UnsupportedError(f"{a}.expert_gating_func {func!r} (1 softmax, 2 sigmoid)")
    cfg.expert_gating = "softmax" if func == 1 else "sigmoid"
    norm = meta.get(f"{a}.expert_weights_norm", False)
    if not isinstance(norm, bool):
        raise ModelFileError(f"GGUF metadata key {a}.expert_weights_norm must be a bool")
    cfg.expert_norm_weights = norm
    weights_scale = _float(meta, f"{a}.expert_weights_scale", scale)
    cfg.expert_weights_scale = 0.0 if weights_scale == 1.0 else weights_scale
    return expert_ffn


def _glm4moe_experts(meta: dict[str, Any], cfg: ModelConfig) -> int:
    """GLM-4.5's expert settings into ``cfg`` as llama.cpp's glm4-moe.cpp reads them; returns
    each expert's width (``expert_feed_forward_length``, required). ``expert_shared_count``
    (required) shared experts of that width make one shared expert; the first
    ``leading_dense_block_count`` layers (default 0) are dense; ``expert_gating_func`` (1
    softmax, 2 sigmoid; absent: sigmoid); ``expert_weights_norm`` (default false) and
    ``expert_weights_scale`` (the converter writes routed_scaling_factor; absent: 1); the
    last ``nextn_predict_layers`` blocks (default 0) are the NextN/MTP layers llama.cpp loads
    but never runs, so the decoder has ``block_count`` less those."""
    a = "glm4moe"
    expert_ffn = _shared_lead_and_routing(meta, cfg, a, gating=2, scale=1.0)
    nextn = _int(meta, f"{a}.nextn_predict_layers", 0)
    if not 0 <= nextn < cfg.n_layers:
        raise ModelFileError(
            f"{a}.nextn_predict_layers {nextn} must lie below block_count {cfg.n_layers}"
        )
    cfg.n_layers -= nextn
    return expert_ffn


def _deepseek2_experts(meta: dict[str, Any], cfg: ModelConfig) -> int:
    """DeepSeek-V2/V3's latent attention and expert settings into ``cfg`` as llama.cpp's
    deepseek2.cpp reads them; returns each expert's width (``expert_feed_forward_length``,
    required). Attention: ``kv_lora_rank`` (required); ``q_lora_rank`` (required, as
    llama.cpp requires it of every file but its "lite" layer counts 26/27/48; absent there: one
    ``attn_q``); ``key_length_mla`` (qk_nope + rope) and ``value_length_mla`` (v_head_dim), which
    llama.cpp takes from ``key_length`` / ``value_length`` when absent (pre-MLA files, whose
    ``attn_kv_b`` this loader does not read); ``key_length`` must be ``kv_lora_rank + rope``.
    Experts: ``expert_shared_count`` (required) shared experts of the expert width,
    ``leading_dense_block_count`` (default 0), ``expert_gating_func`` (1 softmax, 2 sigmoid;
    absent: softmax, DeepSeek-V2's), ``expert_weights_norm`` (default false),
    ``expert_weights_scale`` (default: none), ``expert_group_count`` /
    ``expert_group_used_count`` (default: no groups). YaRN: :func:`_deepseek2_yarn`."""
    a = "deepseek2"
    cfg.mla_kv_lora_rank = _int(meta, f"{a}.attention.kv_lora_rank")
    lite = cfg.n_layers in (26, 27, 48)
    q_lora = meta.get(f"{a}.attention.q_lora_rank")
    if q_lora is None and not lite:
        raise ModelFileError(f"GGUF metadata key '{a}.attention.q_lora_rank' is missing")
    cfg.mla_q_lora_rank = 0 if lite or q_lora is None else _int(meta, f"{a}.attention.q_lora_rank")
    if f"{a}.attention.key_length_mla" not in meta:
        raise UnsupportedError(
            f"a {a} file without attention.key_length_mla (converted before MLA: attn_kv_b)"
        )
    qk = _int(meta, f"{a}.attention.key_length_mla")
    cfg.mla_qk_nope = qk - cfg.rotary_dims
    cfg.mla_v_head_dim = _int(meta, f"{a}.attention.value_length_mla")
    if _int(meta, f"{a}.attention.value_length") != cfg.mla_kv_lora_rank:
        raise ShapeError(f"{a}.attention.value_length is not kv_lora_rank")
    _deepseek2_yarn(meta, cfg)
    expert_ffn = _shared_lead_and_routing(meta, cfg, a, gating=1, scale=0.0)
    groups = _int(meta, f"{a}.expert_group_count", 0)
    if groups > 1:
        cfg.expert_groups = groups
        cfg.expert_groups_used = _int(meta, f"{a}.expert_group_used_count")
    return expert_ffn


def _deepseek2_yarn(meta: dict[str, Any], cfg: ModelConfig) -> None:
    """DeepSeek's YaRN as llama.cpp's deepseek2 graph applies it: the frequencies ramp as for
    any YaRN file (``cfg``'s factors, already read), but the rotation keeps the magnitude
    ``rope.scaling.attn_factor`` (default 1: llama.cpp cancels YaRN's ``0.1 ln(factor) + 1``
    there) and the attention scores are scaled by ``mscale² / sqrt(qk_nope + rope)`` instead,
    ``mscale = attn_factor · (1 + 0.1 · mscale_all_dim · ln(factor))`` with ``mscale_all_dim``
    = ``rope.scaling.yarn_log_multiplier / 0.1`` (the converter writes 0.1 · mscale_all_dim),
    as transformers' DeepSeek attention scales its softmax. YaRN without that key is refused."""
    a = "deepseek2"
    if gguf_scaling_type(meta, a) != "yarn" or meta.get(f"{a}.rope.scaling.factor", 0.0) in (
        0.0,
        1.0,
    ):
        return
    key = f"{a}.rope.scaling.yarn_log_multiplier"
    if key not in meta:
        raise UnsupportedError(f"{a} with YaRN but without {key}")
    mscale_all = _float(meta, key, None) / 0.1
    factor = _float(meta, f"{a}.rope.scaling.factor", None)
    attn = _float(meta, f"{a}.rope.scaling.attn_factor", 1.0)
    mscale = attn * (1.0 + 0.1 * mscale_all * float(np.log(factor)))
    cfg.rope_attn_factor = 0.0 if attn == 1.0 else attn
    cfg.attn_scale = mscale * mscale / float(np.sqrt(cfg.mla_qk_nope + cfg.rotary_dims))


def _swa_pattern(meta: dict[str, Any], fam: Family, n_layers: int) -> int:
    """Which layers slide (0: all, p: all but every p-th), as llama.cpp's load_swa_pattern:
    ``attention.sliding_window_pattern`` as a number p, or as one flag per layer (which must
    follow such a pattern), else the family's own."""
    key = f"{fam.gguf_arch}.attention.sliding_window_pattern"
    v = meta.get(key)
    if v is None or not fam.swa_pattern:
        return fam.swa_pattern
    if isinstance(v, list):
        for p in range(n_layers + 1):
            if fam.swa_dense_first:  # the global layers are 0, p, 2p, ...
                pattern = [p == 0 or i % p != 0 for i in range(n_layers)]
            else:
                pattern = [p == 0 or i % p < p - 1 for i in range(n_layers)]
            if v == pattern:
                return p
        raise UnsupportedError(f"{key}: per-layer windows {v!r:.200} follow no pattern")
    return _int(meta, key)


def _gemma_27b_scale(fam: Family, n_layers: int, dim: int, n_heads: int) -> float:
    """The query scale GGUF files leave implicit: llama.cpp scales Gemma 2/3 27B queries by
    (dim / n_heads)^-1/2 (their query_pre_attn_scalar), every other model by head_dim^-1/2
    (0 here: the engine's default). The 27B models are told apart by their layer count."""
    if (fam.gguf_arch, n_layers) in (("gemma2", 46), ("gemma3", 62)):
        return float(dim / n_heads) ** -0.5
    return 0.0


def _family(meta: dict[str, Any]) -> Family:
    arch = meta.get("general.architecture")
    fam = GGUF_FAMILIES.get(arch) if isinstance(arch, str) else None
    if fam is None:
        raise UnsupportedError(
            f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    if arch == "llama" and _int(meta, "llama.expert_count", 0) > 0:
        return family_named("mixtral")  # llama's arch with experts
    return fam


def _read_rope_tensor(
    gf: GGUFModelFiles, t: GGUFTensorInfo, name: str, fam: Family, cfg: ModelConfig
) -> None:
    """A RoPE factor tensor into ``cfg``: ``rope_freqs`` (Llama 3.1's factors) as
    ``rope_freq_factors``; LongRoPE's ``rope_factors_short`` / ``_long`` as
    ``rope_freq_factors`` / ``rope_long_factors`` with the original context they switch at
    (llama.cpp reads them from phi3 files, and from the others whose ``rope.scaling.type`` is
    "longrope")."""
    path, buf, a = gf.path_of(t), gf.data_of(t), fam.gguf_arch
    full = f"{name}.weight"
    if name in LONGROPE_TENSORS and a != "phi3" and gguf_scaling_type(gf.metadata, a) != "longrope":
        raise UnsupportedError(
            f"{path}: tensor {full!r}: LongRoPE factors in a {a} file whose rope.scaling.type is "
            "not 'longrope' (llama.cpp reads them only then, and from phi3 files)"
        )
    nbytes = t.nbytes
    if nbytes is None or t.offset + nbytes > int(buf.size):
        raise ModelFileError(f"{path}: tensor {full!r} extends past the end of the file")
    raw = np.asarray(buf[t.offset : t.offset + nbytes])
    try:
        vals = rope_freqs_values(t.type_name, list(t.dims), raw, cfg.rotary_dims, name)
    except (ShapeError, ModelFileError, UnsupportedError) as e:
        raise type(e)(f"{path}: {e}") from None
    if name == "rope_freqs":
        cfg.rope_freq_factors = vals
        return
    setattr(cfg, LONGROPE_TENSORS[name], vals)
    cfg.rope_original_context = gguf_original_context(gf.metadata, a)


def _check_rope_tensors(path: str, names: set[str], cfg: ModelConfig) -> None:
    """llama.cpp's use of the factor tensors found: ``rope_freqs`` or LongRoPE's, not both;
    LongRoPE without its long factors runs plain frequencies past the original context."""
    longrope = names & set(LONGROPE_TENSORS)
    if longrope and "rope_freqs" in names:
        raise UnsupportedError(
            f"{path}: both rope_freqs and LongRoPE's {sorted(longrope)} (llama.cpp reads one)"
        )
    if longrope and "rope_factors_long" not in longrope:
        cfg.rope_long_factors = [1.0] * (cfg.rotary_dims // 2)


def _tensor_views(gf: GGUFModelFiles, fam: Family, cfg: ModelConfig) -> dict[str, TensorData]:
    """Canonical name -> TensorData for every weight tensor in the file or its shards (and the
    biases of the families that have them; PowerInfer's ``ffn_down_t.bias`` is
    ``ffn_down.bias``), each a view of its own shard's memory map. The RoPE factor tensors go
    into ``cfg`` (:func:`_read_rope_tensor`)."""
    out: dict[str, TensorData] = {}
    rope_tensors: set[str] = set()
    biases = fam.biases()
    for t in gf.tensors:
        path = gf.path_of(t)
        buf = gf.data_of(t)  # np.memmap, uint8, the whole shard
        size = int(buf.size)
        full = t.name.replace("ffn_down_t.bias", "ffn_down.bias")
        bias = full.endswith(".bias") and full.rsplit(".", 2)[-2] + ".bias" in biases
        if full.endswith(".bias") and not bias:
            raise UnsupportedError(f"{path}: tensor {full!r} (a bias the family has not)")
        if not (full.endswith(".weight") or bias):
            continue
        name = full if bias else full[: -len(".weight")]
        if fam.name == "glm4moe" and nextn_layer(name, cfg):
            continue  # a NextN/MTP block: never run
        name = _renamed(name, fam)
        dtype = t.type_name
        if name == "rope_freqs" or name in LONGROPE_TENSORS:
            _read_rope_tensor(gf, t, name, fam, cfg)
            rope_tensors.add(name)
            continue
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedError(
                f"{path}: tensor {full!r} has type {dtype} "
                f"(supported: {', '.join(SUPPORTED_DTYPES)})"
            )
        dims = list(t.dims)
        if name.endswith(".ffn_gate_up_exps"):
            raise UnsupportedError(
                f"{path}: tensor {full!r}: experts with gate and up fused "
                "(convert_hf_to_gguf.py --fuse-gate-up-exps) are not supported"
            )
        # Merged experts are 3-D ({cols, rows, n_expert}): expert e is rows e*rows.. of a 2-D
        # view of n_expert * rows rows.
        flat = 3 if name.endswith(("_exps", ".attn_k_b", ".attn_v_b")) else 2
        if any(d <= 0 for d in dims) or any(d != 1 for d in dims[flat:]):
            raise ShapeError(f"{path}: tensor {full!r} has unusable shape {dims}")
        cols = dims[0]
        rows = int(np.prod(dims[1:flat], dtype=np.int64)) if len(dims) > 1 else 1
        if name.endswith("_exps.bias"):  # gpt-oss's {width, n_expert} biases: one vector
            cols, rows = cols * rows, 1
        nbytes = rows * row_bytes(dtype, cols)
        start = t.offset
        if start + nbytes > size:
            raise ModelFileError(
                f"{path}: tensor {full!r} extends past the end of the file (truncated?)"
            )
        out[name] = TensorData(name, dtype, rows, cols, buf[start : start + nbytes])
    _check_rope_tensors(gf.path, rope_tensors, cfg)
    return out


def _renamed(name: str, fam: Family) -> str:
    """The canonical name of a layer tensor the family's files name otherwise
    (:attr:`.archs.Family.gguf_layer_names`)."""
    if not fam.gguf_layer_names or not name.startswith("blk."):
        return name
    _, layer, kind = name.split(".", 2)
    return f"blk.{layer}.{fam.gguf_layer_names.get(kind, kind)}"


def _optional_tensors(fam: Family, cfg: ModelConfig, tensors: dict[str, TensorData]) -> None:
    """GLM-4.5's optional q/k norms and q/k/v biases: on where the file has them (llama.cpp
    creates them as not required)."""
    if fam.name == "glm4moe":
        cfg.qk_norm = "blk.0.attn_q_norm" in tensors
        cfg.qkv_bias = "blk.0.attn_q.bias" in tensors
    if fam.name == "deepseek2":  # V3's correction bias (exp_probs_b), not V2's
        cfg.expert_score_bias = f"blk.{cfg.dense_lead_layers}.exp_probs_b.bias" in tensors


def load_gguf(path: str | os.PathLike[str]) -> LoadedModel:
    """Load a GGUF file of a supported family (memory-mapped, zero copy)."""
    p = str(Path(path))
    gf = open_gguf(p)
    meta = gf.metadata
    try:
        fam = _family(meta)
    except UnsupportedError as e:
        raise UnsupportedError(f"{p}: {e}") from None
    tok = Tokenizer.from_gguf(meta)
    cfg = config_from_metadata(meta, tok)
    tensors = _tensor_views(gf, fam, cfg)
    _optional_tensors(fam, cfg, tensors)
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    split_fused(fam, tensors, q_dim, kv_dim, cfg.ffn_dim)
    fit_position_table(cfg, tensors, p)
    if fam.gguf_tied:
        tensors.pop("output", None)  # llama.cpp's gemma2 never reads output.weight
    if "output" not in tensors and "token_embd" in tensors:
        tensors["output"] = tensors["token_embd"]
        cfg.tie_embeddings = True
    check_tensors(cfg, tensors, p)
    if tok.vocab_size > cfg.vocab_size:
        raise ShapeError(
            f"{p}: tokenizer has {tok.vocab_size} tokens, the model only {cfg.vocab_size}"
        )
    return loaded_model(p, meta, cfg, tensors, tok, files=gf.paths)


def fit_position_table(cfg: ModelConfig, tensors: dict[str, TensorData], path: str) -> None:
    """Bound the context of a learned-position family by its table (PowerInfer's OPT files
    say context 2050 = 2048 + the offset of 2) and cut the table to ``context + offset`` rows."""
    pos = tensors.get("position_embd")
    if not cfg.learned_pos or pos is None:
        return
    cfg.max_context = min(cfg.max_context, pos.rows - cfg.pos_offset)
    if cfg.max_context <= 0:
        raise ShapeError(f"{path}: position_embd has only {pos.rows} rows")
    rows = cfg.max_context + cfg.pos_offset
    tensors["position_embd"] = TensorData(
        "position_embd", pos.dtype, rows, pos.cols, pos.data[: rows * pos.row_bytes]
    )


def loaded_model(
    path: str,
    meta: dict[str, Any],
    cfg: ModelConfig,
    tensors: dict[str, TensorData],
    tok: Any,
    files: list[str] | None = None,
) -> LoadedModel:
    """The :class:`LoadedModel` of a GGUF file: its chat template from the metadata ``meta``
    and its fingerprint; ``files``: the shards of a split file (default: ``[path]``)."""
    template = meta.get("tokenizer.chat_template")
    pooling = meta.get(f"{meta.get('general.architecture')}.pooling_type")
    if isinstance(pooling, bool) or not isinstance(pooling, int):
        pooling = None
    return LoadedModel(
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        chat_template=template if isinstance(template, str) else None,
        path=path,
        fingerprint=fingerprint(cfg, tensors),
        files=list(files or [path]),
        pooling_type=pooling,
    )


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file starting with the GGUF magic."""
    return starts_with(path, MAGIC)
