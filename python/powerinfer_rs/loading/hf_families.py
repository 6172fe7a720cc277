"""The parts of ``config.json`` particular to some families (:mod:`.archs`): Gemma's norms,
scales, soft-caps and layer pattern; OPT's and Falcon's sizes, norms and refused variants; the
experts of the mixture-of-experts families, and their per-expert tensors merged into the
engine's 3-D layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from .archs import Family
from .rope import hf_rope_fields, yarn_mscale
from .types import TensorData


def number(cfg: dict[str, Any], key: str, default: float) -> float:
    """A positive number from config.json, ``default`` when absent or null."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise ModelFileError(f"config.json: {key!r} must be a positive number, got {v!r}")
    return float(v)


def _swa_pattern(fam: Family, cfg: dict[str, Any]) -> int:
    """Gemma's sliding layers: ``sliding_window_pattern`` p (all but every p-th slide), or a
    ``layer_types`` list, which must follow such a pattern."""
    p = cfg.get("sliding_window_pattern", fam.swa_pattern)
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ModelFileError(f"config.json: 'sliding_window_pattern' must be an integer, got {p!r}")
    types = cfg.get("layer_types")
    if isinstance(types, list):
        want = [
            "full_attention" if p and (i + 1) % p == 0 else "sliding_attention"
            for i in range(len(types))
        ]
        if types != want:
            raise UnsupportedError(f"layer_types {types!r} (not every {p}-th layer global)")
    return p


def gemma_fields(fam: Family, cfg: dict[str, Any]) -> dict[str, Any]:
    """The config fields of Gemma 2/3 checkpoints (norms stored as ``w - 1``, embeddings times
    sqrt(dim), query_pre_attn_scalar, soft-caps, alternating windows and RoPE bases)."""
    dim = cfg["hidden_size"]  # checked by the caller, as is head_dim (later)
    hd = cfg.get("head_dim")
    ok = isinstance(hd, int) and not isinstance(hd, bool) and hd > 0
    head_dim = hd if ok else dim // cfg["num_attention_heads"]
    return {
        "swa_pattern": _swa_pattern(fam, cfg),
        "rope_theta_local": number(cfg, "rope_local_base_freq", fam.rope_theta_local)
        if fam.rope_theta_local
        else 0.0,
        "norm_offset": fam.hf_norm_offset,
        "embed_scale": float(dim) ** 0.5 if fam.scale_embeddings else 0.0,
        "attn_scale": number(cfg, "query_pre_attn_scalar", float(head_dim)) ** -0.5,
        "attn_softcap": number(cfg, "attn_logit_softcapping", 0.0),
        "final_softcap": number(cfg, "final_logit_softcapping", 0.0),
    }


def family_fields(fam: Family, cfg: dict[str, Any]) -> dict[str, Any]:
    """For OPT and Falcon their sizes (``ffn_dim``, ``n_kv_heads``, popped by the caller) and
    the variants the engine refuses. ``cfg`` has the family's transformers defaults filled in."""
    out: dict[str, Any] = {}
    if fam.name == "opt":
        if not cfg.get("do_layer_norm_before", True):
            raise UnsupportedError("OPT with do_layer_norm_before false (post-norm, OPT-350m)")
        if (cfg.get("word_embed_proj_dim") or cfg.get("hidden_size")) != cfg.get("hidden_size"):
            raise UnsupportedError("OPT with word_embed_proj_dim != hidden_size (project_in/out)")
        if not cfg.get("enable_bias", True):
            raise UnsupportedError("OPT without biases")
        out["ffn_dim"] = cfg.get("ffn_dim")
    elif fam.name == "falcon":
        if cfg.get("new_decoder_architecture"):
            raise UnsupportedError("Falcon's new_decoder_architecture (40B/180B q/k/v grouping)")
        if cfg.get("alibi") or cfg.get("bias") or not cfg.get("parallel_attn", True):
            raise UnsupportedError("Falcon with alibi, biases or sequential attention")
        hidden = cfg.get("hidden_size")
        four = 4 * hidden if isinstance(hidden, int) else None
        out["ffn_dim"] = cfg.get("ffn_hidden_size") or four
        # The old layout (7B): multi-query, or one K/V head per query head (num_kv_heads is
        # read only by the new decoder architecture, which is refused above).
        multi = cfg.get("multi_query", True)
        out["n_kv_heads"] = 1 if multi else cfg.get("num_attention_heads")
    return out


def falcon_qkv_in_order(tensors: dict[str, TensorData], n_heads: int, head_dim: int) -> None:
    """Reorder, in place, the fused q/k/v of an HF Falcon with one K/V head per query head:
    its ``query_key_value`` rows go head by head (q, k, v of head 0, then of head 1, ...:
    modeling_falcon's ``view(num_heads, 3, head_dim)``), the engine's (and llama.cpp's
    converter's) are [all q; all k; all v]. One copy of each such tensor."""
    for name in [n for n in tensors if n.endswith(".attn_qkv")]:
        t = tensors[name]
        if t.rows != 3 * n_heads * head_dim:
            raise ShapeError(
                f"tensor {name} has {t.rows} rows, the config implies {3 * n_heads * head_dim}"
            )
        rows = np.asarray(t.data).reshape(n_heads, 3, head_dim, t.row_bytes)
        data = np.ascontiguousarray(rows.transpose(1, 0, 2, 3)).reshape(-1)
        tensors[name] = TensorData(name, t.dtype, t.rows, t.cols, data)


def _count(cfg: dict[str, Any], key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ModelFileError(f"config.json: {key!r} must be a positive integer, got {v!r:.80}")
    return v


def moe_fields(fam: Family, cfg: dict[str, Any]) -> dict[str, Any]:
    """The expert settings of a mixture-of-experts ``config.json`` (as the family's modeling
    code reads them; ``cfg`` has the class's defaults filled in): Qwen's and OLMoE's
    ``num_experts``, Mixtral's ``num_local_experts``, ``num_experts_per_tok``, Qwen's expert
    and shared-expert widths, and whether the top-k weights are renormalised (Qwen's and
    OLMoE's ``norm_topk_prob``; Mixtral always). Qwen's dense layers (``mlp_only_layers``,
    ``decoder_sparse_step`` > 1) and OLMoE's ``clip_qkv`` are refused."""
    if not fam.moe:
        return {}
    if fam.name == "glm4moe":
        return _glm4moe_fields(cfg)
    if fam.name == "gpt-oss":
        from .hf_gptoss import gptoss_fields

        return gptoss_fields(cfg)
    if fam.name == "deepseek2":
        return _deepseek_fields(cfg)
    out: dict[str, Any] = {}
    key = "num_local_experts" if fam.name == "mixtral" else "num_experts"
    out["n_expert"] = _count(cfg, key)
    out["n_expert_used"] = _count(cfg, "num_experts_per_tok")
    if fam.name in ("qwen2moe", "qwen3moe"):
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            raise UnsupportedError(
                "Qwen MoE with dense layers (mlp_only_layers, decoder_sparse_step > 1)"
            )
        out["expert_ffn_dim"] = _count(cfg, "moe_intermediate_size")
    else:  # OLMoE's and Mixtral's experts are intermediate_size wide
        out["expert_ffn_dim"] = _count(cfg, "intermediate_size")
    if fam.name == "qwen2moe":
        out["shared_ffn_dim"] = _count(cfg, "shared_expert_intermediate_size")
    if fam.name == "olmoe" and cfg.get("clip_qkv") is not None:
        raise UnsupportedError("OLMoE with clip_qkv")
    norm = cfg.get("norm_topk_prob")
    out["expert_norm_weights"] = True if fam.name == "mixtral" else bool(norm)
    return out


def _glm4moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Glm4MoeConfig's expert and attention settings (as modeling_glm4_moe reads them):
    ``n_routed_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` per
    token chosen by sigmoid plus the correction bias within the ``topk_group`` best of
    ``n_group`` groups, renormalised when ``norm_topk_prob``, times ``routed_scaling_factor``;
    ``n_shared_experts`` shared experts of the same width as one; the first
    ``first_k_dense_replace`` layers dense; q/k/v biases with ``attention_bias``, q/k norms with
    ``use_qk_norm``."""
    ef = _count(cfg, "moe_intermediate_size")
    shared = cfg.get("n_shared_experts")
    lead = cfg.get("first_k_dense_replace")
    for key, v in (("n_shared_experts", shared), ("first_k_dense_replace", lead)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ModelFileError(f"config.json: {key!r} must be an integer >= 0, got {v!r:.80}")
    groups, used = _count(cfg, "n_group"), _count(cfg, "topk_group")
    scale = number(cfg, "routed_scaling_factor", 1.0)
    return {
        "n_expert": _count(cfg, "n_routed_experts"),
        "n_expert_used": _count(cfg, "num_experts_per_tok"),
        "expert_ffn_dim": ef,
        "shared_ffn_dim": ef * shared,
        "dense_lead_layers": lead,
        "expert_groups": groups if groups > 1 else 0,
        "expert_groups_used": used if groups > 1 else 0,
        "expert_norm_weights": bool(cfg.get("norm_topk_prob")),
        "expert_weights_scale": 0.0 if scale == 1.0 else scale,
        "qkv_bias": bool(cfg.get("attention_bias")),
        "qk_norm": bool(cfg.get("use_qk_norm")),
    }


def _deepseek_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV2/V3Config's expert settings, as GLM-4.5's (:func:`_glm4moe_fields`: the same
    keys) but routed as ``scoring_func`` says (V2's softmax, V3's sigmoid); V2's
    ``group_limited_greedy`` (each group scored by its best expert, not its best two) is
    refused. No q/k/v biases or q/k norms."""
    score = cfg.get("scoring_func", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise UnsupportedError(f"DeepSeek scoring_func {score!r} (softmax, sigmoid)")
    out = _glm4moe_fields({**cfg, "attention_bias": False, "use_qk_norm": False})
    if cfg.get("topk_method") == "group_limited_greedy" and out["expert_groups"]:
        raise UnsupportedError("DeepSeek-V2's group_limited_greedy routing over expert groups")
    out.pop("qkv_bias")
    out.pop("qk_norm")
    out["expert_gating"] = score
    return out


def deepseek_attention(cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepseekV2/V3Config's latent attention as config fields: ``kv_lora_rank``,
    ``q_lora_rank`` (null: one q_proj), ``qk_nope_head_dim``, ``qk_rope_head_dim`` (the rotated
    dims, adjacent pairs: the modeling code interleaves q_pe/k_pe before rotate_half),
    ``v_head_dim``; the cached row is ``kv_lora_rank + qk_rope_head_dim`` wide with one KV
    head, as llama.cpp's converter writes it. YaRN (V2/V3's ``rope_scaling``) as the modeling
    code applies it: transformers' YaRN over the rope dims (its magnitude
    ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)``), the softmax scale
    times ``get_mscale(factor, mscale_all_dim)²`` where ``mscale_all_dim`` is set; other
    scaling types are refused."""
    q_lora = cfg.get("q_lora_rank")
    r, rope = _count(cfg, "kv_lora_rank"), _count(cfg, "qk_rope_head_dim")
    out = _deepseek_yarn(cfg, rope, _count(cfg, "qk_nope_head_dim") + rope)
    return {
        **out,
        "mla_kv_lora_rank": r,
        "mla_q_lora_rank": 0 if q_lora is None else _count(cfg, "q_lora_rank"),
        "mla_qk_nope": _count(cfg, "qk_nope_head_dim"),
        "mla_v_head_dim": _count(cfg, "v_head_dim"),
        "rope_dims": rope,
        "head_dim": r + rope,
        "n_kv_heads": 1,
        "rope_style": "norm",
    }


def _deepseek_yarn(cfg: dict[str, Any], rope: int, qk_head: int) -> dict[str, Any]:
    """The RoPE fields of a DeepSeek config (:func:`deepseek_attention`)."""
    scaling = cfg.get("rope_scaling")
    if not scaling:
        return {}
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    if kind != "yarn":
        raise UnsupportedError(f"DeepSeek with rope_scaling {scaling!r:.80} (YaRN only)")
    out = hf_rope_fields(cfg, rope, number(cfg, "rope_theta", 10000.0))
    out.pop("rope_dims", None)
    mscale_all = scaling.get("mscale_all_dim")
    if mscale_all:
        m = yarn_mscale(number(scaling, "factor", 1.0), number(scaling, "mscale_all_dim", 1.0))
        out["attn_scale"] = m * m / qk_head**0.5
    return out


def split_kv_b(tensors: dict[str, TensorData], cfg: Any) -> None:
    """Split, in place, each layer's fused ``kv_b_proj`` (``attn_kv_b``: per head qk_nope
    rows of k then v_head_dim rows of v, each kv_lora_rank wide) as llama.cpp's converter does:
    ``attn_k_b`` per head transposed (kv_lora_rank rows of qk_nope) and ``attn_v_b``. One copy
    each (float formats: elements moved whole)."""
    h, r, nope, vd = cfg.n_heads, cfg.mla_kv_lora_rank, cfg.mla_qk_nope, cfg.mla_v_head_dim
    for name in [n for n in tensors if n.endswith(".attn_kv_b")]:
        t = tensors.pop(name)
        p = name[: -len("attn_kv_b")]
        if (t.rows, t.cols) != (h * (nope + vd), r):
            raise ShapeError(
                f"tensor {name} is {t.rows}x{t.cols}, the config implies {h * (nope + vd)}x{r}"
            )
        if t.dtype not in ("F32", "F16", "BF16"):
            raise UnsupportedError(f"tensor {name}: a fused kv_b_proj in {t.dtype}")
        size = t.row_bytes // r
        x = np.asarray(t.data).reshape(h, nope + vd, r, size)
        k_b = np.ascontiguousarray(x[:, :nope].transpose(0, 2, 1, 3)).reshape(-1)
        v_b = np.ascontiguousarray(x[:, nope:]).reshape(-1)
        tensors[p + "attn_k_b"] = TensorData(p + "attn_k_b", t.dtype, h * r, nope, k_b)
        tensors[p + "attn_v_b"] = TensorData(p + "attn_v_b", t.dtype, h * vd, r, v_b)


def merge_experts(tensors: dict[str, TensorData], cfg: Any, source: str) -> None:
    """Merge, in place, the per-expert tensors of a Hugging Face checkpoint
    (``blk.N.ffn_{gate,up,down}_exps.e``, one per expert) into the engine's merged ones
    (``blk.N.ffn_gate_exps``: expert e's rows after expert e - 1's), as llama.cpp's converter
    stacks them. One copy of the experts' bytes: the checkpoint's tensors are separate."""
    groups: dict[str, dict[int, TensorData]] = {}
    for name in [n for n in tensors if "_exps." in n]:
        base, e = name.rsplit(".", 1)
        groups.setdefault(base, {})[int(e)] = tensors.pop(name)
    for base, experts in groups.items():
        n = cfg.n_expert
        missing = sorted(set(range(n)) - set(experts))
        extra = sorted(set(experts) - set(range(n)))
        if missing or extra:
            raise ModelFileError(
                f"{source}: {base} has experts {sorted(experts)[:8]}..., the config says "
                f"{n} (missing {missing[:8]}, extra {extra[:8]})"
            )
        first = experts[0]
        for e, t in experts.items():
            if (t.dtype, t.rows, t.cols) != (first.dtype, first.rows, first.cols):
                raise ShapeError(
                    f"{source}: expert {e} of {base} is {t.dtype} {t.rows}x{t.cols}, expert 0 "
                    f"{first.dtype} {first.rows}x{first.cols}"
                )
        data = np.concatenate([np.asarray(experts[e].data) for e in range(n)])
        tensors[base] = TensorData(base, first.dtype, n * first.rows, first.cols, data)
