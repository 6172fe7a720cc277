"""The parts of ``config.json`` particular to some families (:mod:`.archs`): Gemma's norms,
scales, soft-caps and layer pattern; OPT's and Falcon's sizes, norms and refused variants."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from .archs import Family
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
