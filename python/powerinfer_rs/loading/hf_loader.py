"""Load a Hugging Face model directory (config.json + safetensors + tokenizer.json).

Supported: the families of :mod:`.archs` (Llama, Mistral, Bamboo, Qwen2, Qwen3, Phi-3,
Gemma 2, Gemma 3, OPT, Falcon) in BF16/F16/F32, either one ``model.safetensors`` or shards
listed by ``model.safetensors.index.json``. HF checkpoints keep q/k in the original layout, so RoPE
rotates the halves of each head: ``rope_style = "neox"``. Fused tensors (Phi-3's ``qkv_proj``
and ``gate_up_proj``) are split into row views. RoPE scaling (linear, Llama 3.1's llama3, YaRN,
LongRoPE, dynamic NTK up to ``max_position_embeddings``) and ``partial_rotary_factor`` are read
by :mod:`.rope`; other scaling types are refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, ShapeError, UnsupportedError
from ..runtime.tokenizer import Tokenizer
from .archs import (
    FAMILIES,
    LAYER_NORM_EPS,
    Family,
    family_config,
    family_named,
    hf_family,
    hf_layer_names,
    nextn_layer,
    split_fused,
)
from .hf_families import (
    deepseek_attention,
    falcon_qkv_in_order,
    family_fields,
    gemma_fields,
    merge_experts,
    moe_fields,
    number,
    split_kv_b,
)
from .hf_gptoss import gptoss_experts
from .regular_file import regular_file
from .rope import hf_rope_fields, rope_parameters_v4
from .safetensors_mmap import RawTensor, read_safetensors
from .types import LoadedModel, ModelConfig, TensorData, check_tensors, fingerprint

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(
    a for f in FAMILIES if not f.moe or f.hf_experts for a in f.hf_archs
)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(
    t for f in FAMILIES if not f.moe or f.hf_experts for t in f.hf_types
)


def load_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON object; :class:`ModelFileError` if unreadable, invalid or not an object."""
    try:
        with open(regular_file(path), encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{os.fspath(path)}: cannot read JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ModelFileError(f"{os.fspath(path)}: expected a JSON object")
    return obj


def _optional_json(path: Path) -> dict[str, Any]:
    return load_json(path) if path.is_file() else {}


def canonical_name(hf_name: str, family: Family | None = None) -> str | None:
    """Canonical tensor name for an HF parameter name of ``family`` (default llama); ``None``
    for tensors the engine ignores.

    A bias is named after its weight (canonical name plus ``.bias``); biases the family does
    not have raise :class:`UnsupportedError` (ignoring them would be wrong).
    """
    fam = family or family_named("llama")
    bias = hf_name.endswith(".bias")
    weight = hf_name[: -len(".bias")] + ".weight" if bias else hf_name
    name = fam.hf_globals.get(weight)
    m = re.fullmatch(re.escape(fam.hf_layer_prefix) + r"(\d+)\.(.+)", weight)
    names = hf_layer_names(fam)
    if fam.hf_experts and m and not bias:
        # Expert e's projection: blk.N.ffn_{gate,up,down}_exps.e, merged after loading.
        path, projs = fam.hf_experts
        em = re.fullmatch(re.escape(path) + r"(\d+)\.(\w+)\.weight", m.group(2))
        if em and em.group(2) in projs:
            return f"blk.{int(m.group(1))}.ffn_{projs[em.group(2)]}_exps.{int(em.group(1))}"
    if name is None and m and m.group(2) in names:
        name = f"blk.{int(m.group(1))}.{names[m.group(2)]}"
    if not bias:
        return name
    if name is None or name.rsplit(".", 1)[-1] + ".bias" not in fam.biases():
        raise UnsupportedError(f"tensor {hf_name!r}: biases are not supported")
    return name + ".bias"


#: transformers' activation names (activations.py ACT2FN) -> the engine's.
HF_ACTIVATIONS: dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
    "gelu": "gelu_erf",  # nn.functional.gelu, the exact form
    "gelu_python": "gelu_erf",
    "gelu_pytorch_tanh": "gelu",
    "gelu_new": "gelu",
    "gelu_fast": "gelu",
    "gelu_accurate": "gelu",
}


def _activation(key: str, act: Any) -> str:
    out = HF_ACTIVATIONS.get(act) if isinstance(act, str) else None
    if out is None:
        raise UnsupportedError(
            f"config.json: {key} {act!r} is not supported ({', '.join(HF_ACTIVATIONS)})"
        )
    return out


def _req_int(cfg: dict[str, Any], key: str, default: Any = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ModelFileError(f"config.json: {key!r} is missing")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFileError(f"config.json: {key!r} must be an integer, got {v!r}")
    return v


def _ids(v: Any) -> list[int]:
    if isinstance(v, bool):
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [x for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def config_from_hf(cfg: dict[str, Any]) -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed ``config.json`` (token ids filled later).
    A key the file leaves out takes the family's transformers default (:mod:`.archs`
    ``hf_defaults``), as ``from_pretrained`` would; a key set to null stays null."""
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list):
        raise ModelFileError(f"config.json: 'architectures' must be a list, got {archs!r:.80}")
    mtype = cfg.get("model_type")
    fam = hf_family(mtype, archs if isinstance(archs, list) else [])
    if fam is None:
        raise UnsupportedError(
            f"architecture {archs or mtype!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if fam.moe and fam.hf_experts is None:
        raise UnsupportedError(
            f"{fam.name}: its Hugging Face checkpoints need the model's own code; convert the "
            "model to GGUF with llama.cpp's convert_hf_to_gguf.py and load that"
        )
    # transformers 5's rope_parameters in 4.x's keys (a 4.x key in the file wins).
    cfg = {**fam.hf_defaults, **rope_parameters_v4(cfg), **cfg}
    if (cfg.get("attention_bias") or cfg.get("mlp_bias")) and not fam.biases():
        raise UnsupportedError("attention/MLP biases are not supported")
    if cfg.get("use_sliding_window"):
        raise UnsupportedError("use_sliding_window (Qwen2's per-layer windows) is not supported")
    window = cfg.get("sliding_window") if fam.window else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise ModelFileError(f"config.json: 'sliding_window' must be an integer, got {window!r}")
    dim = _req_int(cfg, "hidden_size")
    n_heads = _req_int(cfg, "num_attention_heads")
    if n_heads <= 0:
        raise ShapeError(f"num_attention_heads must be positive, got {n_heads}")
    head_dim = cfg.get("head_dim") or dim // n_heads
    extra = gemma_fields(fam, cfg) if fam.scale_embeddings else {}
    extra.update(family_fields(fam, cfg))
    extra.update(moe_fields(fam, cfg))
    act_name = cfg.get(fam.hf_act_key, "silu")
    if act_name == "fatrelu":  # ProSparse: ReLU passing only x > hidden_act_param
        act_name = "relu"
        extra["relu_threshold"] = number(cfg, "hidden_act_param", 0.0)

    rope_theta = cfg.get("rope_theta", 10000.0)
    eps = cfg.get(fam.hf_eps_key, 1e-6) if fam.hf_eps_key else LAYER_NORM_EPS
    for k, v in (("rope_theta", rope_theta), (fam.hf_eps_key or "eps", eps)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -1e300 < v < 1e300:
            raise ModelFileError(f"config.json: {k!r} must be a finite number, got {v!r:.80}")
    head_dim = _req_int({"head_dim": head_dim}, "head_dim")
    if head_dim <= 0:
        raise ShapeError(f"config.json: head_dim must be positive, got {head_dim}")
    if fam.name == "deepseek2":  # the latent row is the head (:func:`deepseek_attention`)
        extra.update(deepseek_attention(cfg))
        head_dim = extra.pop("head_dim")
    else:
        extra.update(hf_rope_fields(cfg, head_dim, float(rope_theta)))
    # YaRN's reach (factor x original) where max_position_embeddings says less.
    max_context = max(_req_int(cfg, "max_position_embeddings", 2048), extra.pop("max_context", 0))
    bos = cfg.get("bos_token_id")
    kv = extra.pop("n_kv_heads", None) or cfg.get("num_key_value_heads")
    sizes = {
        "ffn_dim": _req_int(cfg, "intermediate_size", extra.pop("ffn_dim", None)),
        # None: one KV head per query head (transformers' fallback).
        "n_kv_heads": _req_int(
            {"num_key_value_heads": kv if kv is not None else n_heads}, "num_key_value_heads"
        ),
        "rms_eps": float(eps),
    }
    c = family_config(
        fam,
        n_layers=_req_int(cfg, "num_hidden_layers"),
        dim=dim,
        n_heads=n_heads,
        head_dim=head_dim,
        vocab_size=_req_int(cfg, "vocab_size"),
        max_context=max_context,
        **sizes,
        rope_theta=float(rope_theta),
        rope_style=extra.pop("rope_style", "neox"),
        activation=_activation(fam.hf_act_key, act_name),
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        add_bos=False,
        tie_embeddings=bool(cfg.get("tie_word_embeddings")),
        sliding_window=window or 0,
        **extra,
    )
    return c


def _weight_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.is_file():
        wm = load_json(index).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise ModelFileError(f"{index}: 'weight_map' must map tensor names to file names")
        files = []
        for name in dict.fromkeys(wm.values()):
            f = d / name
            try:
                found = Path(name).name == name and f.is_file()
            except OSError:  # a name too long for the file system, ...
                found = False
            if not found:
                raise ModelFileError(f"{index}: shard {name[:200]!r} is missing")
            files.append(f)
        return files
    single = d / "model.safetensors"
    if single.is_file():
        return [single]
    shards = sorted(d.glob("*.safetensors"))
    if not shards:
        raise ModelFileError(f"{d}: no model.safetensors or model.safetensors.index.json")
    return shards


def _tensors(files: list[Path], family: Family, cfg: ModelConfig) -> dict[str, TensorData]:
    out: dict[str, TensorData] = {}
    # gpt-oss's fused experts (3-D, or MXFP4 blocks as bytes): loading/hf_gptoss.py.
    gptoss = family.name == "gpt-oss"
    experts: dict[str, RawTensor] = {}
    for f in files:
        raw: dict[str, RawTensor] = read_safetensors(f, bytes_too=gptoss)
        for hf_name, rt in raw.items():
            if gptoss and ".mlp.experts." in hf_name:
                experts[hf_name] = rt
                continue
            if rt.dtype == "U8":
                raise UnsupportedError(f"{f}: tensor {hf_name!r} of bytes (U8)")
            try:
                name = canonical_name(hf_name, family)
            except UnsupportedError as e:
                raise UnsupportedError(f"{f}: {e}") from None
            if name is None:
                continue
            if name in out:
                raise ModelFileError(f"{f}: tensor {hf_name!r} appears in more than one shard")
            if len(rt.shape) == 1:
                rows, cols = 1, rt.shape[0]
            elif len(rt.shape) == 2:
                rows, cols = rt.shape
            else:
                raise ShapeError(f"{f}: tensor {hf_name!r} has {len(rt.shape)} dimensions")
            if rows == 0 or cols == 0:
                raise ShapeError(f"{f}: tensor {hf_name!r} is empty")
            out[name] = TensorData(name, rt.dtype, rows, cols, rt.data)
    if gptoss:
        out.update(gptoss_experts(experts, cfg.n_layers, str(files[0].parent)))
    return out


def _chat_template(d: Path, tok_cfg: dict[str, Any]) -> str | None:
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ModelFileError(f"{jinja}: {e}") from e
    t = tok_cfg.get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        named = {
            x.get("name"): x.get("template")
            for x in t
            if isinstance(x, dict) and isinstance(x.get("name"), str)
        }
        t = named.get("default") or next(iter(named.values()), None)
    return t if isinstance(t, str) else None


def load_hf_dir(path: str | os.PathLike[str]) -> LoadedModel:
    """Load an HF model directory (memory-mapped safetensors, zero copy)."""
    d = Path(path)
    if not (d / "config.json").is_file():
        raise ModelFileError(f"{d}: no config.json (not a Hugging Face model directory)")
    cfg_json = load_json(d / "config.json")
    cfg = config_from_hf(cfg_json)

    tok_cfg = _optional_json(d / "tokenizer_config.json")
    gen_cfg = _optional_json(d / "generation_config.json")
    if not (d / "tokenizer.json").is_file():
        raise ModelFileError(f"{d}: no tokenizer.json")
    # Token ids named by the files first; the config class's defaults (in cfg) only where
    # none is.
    extra_eos = _ids(gen_cfg.get("eos_token_id")) + _ids(cfg_json.get("eos_token_id"))
    named_bos = _ids(cfg_json.get("bos_token_id")) + _ids(gen_cfg.get("bos_token_id"))
    default = (cfg.bos_token_id, cfg.eos_token_ids)
    tok = Tokenizer.from_hf_files(
        d / "tokenizer.json",
        tok_cfg,
        extra_eos,
        bos_id=named_bos[0] if named_bos else None,
        default_ids=default,
    )
    cfg.bos_token_id = tok.bos_id
    cfg.eos_token_ids = list(tok.eos_ids)
    cfg.add_bos = tok.add_bos
    cfg.validate()
    if tok.vocab_size > cfg.vocab_size:
        raise ShapeError(
            f"{d}: tokenizer has {tok.vocab_size} tokens, the model only {cfg.vocab_size}"
        )

    family = family_named(cfg.arch)
    weight_files = _weight_files(d)
    tensors = _tensors(weight_files, family, cfg)
    if family.name == "glm4moe":  # the NextN/MTP layers past the decoder: never run
        for name in [n for n in tensors if nextn_layer(n, cfg)]:
            del tensors[name]
    if family.moe and family.name != "gpt-oss":  # gpt-oss's are merged already
        merge_experts(tensors, cfg, str(d))
    if family.name == "deepseek2":
        split_kv_b(tensors, cfg)
        # V3's correction bias, not V2's.
        cfg.expert_score_bias = f"blk.{cfg.dense_lead_layers}.exp_probs_b.bias" in tensors
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    if family.name == "falcon" and 1 < cfg.n_kv_heads == cfg.n_heads:
        falcon_qkv_in_order(tensors, cfg.n_heads, cfg.head_dim)
    split_fused(family, tensors, q_dim, kv_dim, cfg.ffn_dim)
    pos = tensors.get("position_embd")
    if cfg.learned_pos and pos is not None and pos.rows - cfg.pos_offset != cfg.max_context:
        raise ShapeError(
            f"{d}: embed_positions has {pos.rows} rows, max_position_embeddings + "
            f"{cfg.pos_offset} = {cfg.max_context + cfg.pos_offset}"
        )
    # tie_word_embeddings (the family's default where config.json is silent) ties the head to
    # the embeddings whatever lm_head the files hold, as transformers does; an untied model
    # without lm_head falls back to the embeddings, as llama.cpp does.
    if (cfg.tie_embeddings or "output" not in tensors) and "token_embd" in tensors:
        tensors["output"] = tensors["token_embd"]
        cfg.tie_embeddings = True
    check_tensors(cfg, tensors, str(d))
    return LoadedModel(
        config=cfg,
        tensors=tensors,
        tokenizer=tok,
        chat_template=_chat_template(d, tok_cfg),
        path=str(d),
        fingerprint=fingerprint(cfg, tensors),
        files=[str(f) for f in weight_files],
    )
