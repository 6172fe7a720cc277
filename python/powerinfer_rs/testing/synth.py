"""Synthetic llama models written as files, for tests and benchmarks: a Hugging Face directory
(:func:`write_hf_model`) or a GGUF file (:func:`write_gguf_model`) of the model of
:mod:`.synth_model` (random weights with a planted power law of FFN activation frequencies;
everything a figure measures on these models is "synthetic"), and the command line
``python -m powerinfer_rs.synth``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..loading.archs import FAMILIES, Family, hf_layer_names
from ..loading.gguf_loader import ACTIVATION_KEY, RELU_THRESHOLD_KEY
from ..loading.rope import longrope_attn_factor
from ..stages.args import float_in, nonneg_int, positive_float, positive_int, run_cli, share
from .synth_model import (
    BOS_ID,
    EOS_ID,
    SPECIAL_TOKENS,
    SynthSpec,
    SynthWeights,
    build_tokenizer,
    byte_level_vocab,
    f32_to_bf16_bits,
)
from .synth_types import GGUF_DTYPES, GGUF_FILE_TYPE, encode, tensor_dtype
from .synth_vocab import FAMILY_TEMPLATES, chat_template  # noqa: F401  (re-exported)

HF_DTYPES = {"bf16": "BF16", "f16": "F16", "f32": "F32"}


# --------------------------------------------------------------------------- HF writer
def hf_name(name: str, family: Family | None = None) -> str:
    """HF parameter name of a canonical (or fused) tensor name of ``family`` (default llama);
    a bias is named after its weight."""
    fam = family or FAMILIES[0]
    names = {v: k for k, v in hf_layer_names(fam).items()}
    if name.startswith("blk.") and name.split(".", 2)[2] in names:  # GLM's exp_probs_b.bias
        _, layer, kind = name.split(".", 2)
        return f"{fam.hf_layer_prefix}{layer}.{names[kind]}"
    if name.endswith(".bias"):
        return hf_name(name[: -len(".bias")], fam)[: -len(".weight")] + ".bias"
    glob = {v: k for k, v in fam.hf_globals.items()}
    if name in glob:
        return glob[name]
    _, layer, kind = name.split(".", 2)
    return f"{fam.hf_layer_prefix}{layer}.{names[kind]}"


def _hf_act(spec: SynthSpec) -> str:
    """config.json's activation: HF's "gelu" is the erf form (the engine's "gelu_erf"), the
    engine's (and llama.cpp's) "gelu" the tanh one; ProSparse's FATReLU is "fatrelu" with its
    threshold in hidden_act_param."""
    if spec.relu_threshold:
        return "fatrelu"
    return {"gelu": "gelu_pytorch_tanh", "gelu_erf": "gelu"}.get(spec.activation, spec.activation)


def _hf_rope(spec: SynthSpec) -> dict[str, Any] | None:
    if spec.rope_scaling == "linear":
        return {"rope_type": "linear", "factor": spec.rope_factor}
    if spec.rope_scaling == "llama3":
        return {
            "rope_type": "llama3",
            "factor": spec.rope_factor,
            "low_freq_factor": spec.rope_low_freq_factor,
            "high_freq_factor": spec.rope_high_freq_factor,
            "original_max_position_embeddings": spec.rope_original_context,
        }
    if spec.rope_scaling == "yarn":
        return {
            "rope_type": "yarn",
            "factor": spec.rope_factor,
            "original_max_position_embeddings": spec.rope_original_context,
        }
    if spec.rope_scaling == "longrope":  # Phi-3 128k's (the original context at the top)
        short, long = spec.longrope_factors()
        return {"type": "longrope", "short_factor": short, "long_factor": long}
    return None


def _hf_config(spec: SynthSpec, torch_dtype: str) -> dict[str, Any]:
    """config.json as transformers' config class of the family saves it (4.57: every
    attribute its ``__init__`` stores, the PretrainedConfig ones only where they differ from
    both defaults), with the model's values; nothing of ours."""
    f, s = spec.family, spec
    out: dict[str, Any] = {"architectures": [f.hf_archs[0]], "model_type": f.hf_types[0]}
    out.update(
        vocab_size=s.vocab,
        hidden_size=s.dim,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        max_position_embeddings=s.max_context,
        initializer_range=0.02,
        attention_dropout=0.0,
        use_cache=True,
        torch_dtype=torch_dtype,
        transformers_version="4.57.1",
    )
    if f.name not in ("opt", "falcon"):
        out.update(intermediate_size=s.ffn, num_key_value_heads=s.kv_heads)
        out.update(rms_norm_eps=s.rms_eps, rope_theta=s.rope_theta)
        out["hidden_activation" if f.post_norms else "hidden_act"] = _hf_act(s)
        if f.name not in ("gemma2", "mistral", "mixtral") or s.rope_scaling != "none":
            out["rope_scaling"] = _hf_rope(s)
    # PretrainedConfig's fields: tie_word_embeddings (default True) and the token ids (None).
    if not s.tie or f.name in ("llama", "mistral", "bamboo", "qwen2", "qwen3", "phi3"):
        out["tie_word_embeddings"] = s.tie
    if f.name not in ("qwen2", "qwen3", "qwen2moe", "qwen3moe"):
        out.update(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    if s.relu_threshold:
        out["hidden_act_param"] = s.relu_threshold
    if f.name in ("llama", "bamboo"):
        out.update(head_dim=s.head_dim, attention_bias=False, mlp_bias=False, pretraining_tp=1)
    elif f.name == "mistral":
        out.update(head_dim=None, sliding_window=s.window or None)
    elif f.name in ("qwen2", "qwen3"):
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=s.layers)
        out["layer_types"] = ["full_attention"] * s.layers
        if f.name == "qwen3":
            out.update(head_dim=s.head_dim, attention_bias=False)
    elif f.name == "phi3":
        out.update(sliding_window=s.window or None, partial_rotary_factor=s.partial_rotary)
        orig = s.rope_original_context if s.rope_scaling == "longrope" else 4096
        out.update(original_max_position_embeddings=orig, embd_pdrop=0.0, resid_pdrop=0.0)
        out["pad_token_id"] = 32000 if s.vocab > 32000 else None
    elif f.post_norms:  # Gemma 2/3
        p = f.swa_pattern
        out.update(head_dim=s.head_dim, query_pre_attn_scalar=s.head_dim, attention_bias=False)
        out.update(sliding_window=s.window or None, pad_token_id=0)
        caps = s.softcaps
        out.update(attn_logit_softcapping=caps[0] or None, final_logit_softcapping=caps[1] or None)
        out["layer_types"] = [
            "full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(s.layers)
        ]
        if f.name == "gemma3":
            out.update(rope_local_base_freq=f.rope_theta_local, _sliding_window_pattern=p)
            out["use_bidirectional_attention"] = False
    elif f.name == "opt":
        out.update(ffn_dim=s.ffn, do_layer_norm_before=True, word_embed_proj_dim=s.dim)
        out.update(enable_bias=True, activation_function=_hf_act(s), dropout=0.1)
        out.update(init_std=0.02, layerdrop=0.0, layer_norm_elementwise_affine=True)
        out.update(_remove_final_layer_norm=False, pad_token_id=1)
        del out["initializer_range"]
    elif f.name == "falcon":
        out.update(multi_query=s.kv_heads == 1, num_kv_heads=s.kv_heads, bias=False)
        out.update(new_decoder_architecture=False, parallel_attn=True, alibi=False)
        out.update(layer_norm_epsilon=s.rms_eps, activation=_hf_act(s), hidden_dropout=0.0)
        out.update(ffn_hidden_size=s.ffn, rope_theta=s.rope_theta, rope_scaling=None)
        out["num_ln_in_parallel_attn"] = None
    if f.moe:
        out.update(_hf_moe_config(s))
    if f.name == "glm4moe" or (s.partial_rotary != 1.0 and f.name != "phi3"):
        # Read by transformers' RoPE initialisation from any config (an extra attribute).
        out["partial_rotary_factor"] = s.partial_rotary
    if s.rope_scaling == "llama3":
        # llama.cpp's converter reads the original context from the top level of config.json
        # (8192 when absent: Llama 3.1's value); set there too, it stores the same factors.
        out["original_max_position_embeddings"] = s.rope_original_context
    return out


def _hf_moe_config(s: SynthSpec) -> dict[str, Any]:
    """The expert keys of a mixture-of-experts config.json, as the family's class saves
    them (transformers 4.57): Qwen3-MoE renormalises (its released checkpoints do, and
    llama.cpp always does), Qwen2-MoE and OLMoE do not."""
    if s.arch == "glm4moe":
        return _hf_glm4moe_config(s)
    out: dict[str, Any] = {"num_experts_per_tok": s.experts_used, "output_router_logits": False}
    out["router_aux_loss_coef"] = 0.001 if s.arch != "mixtral" else 0.02
    if s.arch == "mixtral":
        out.update(num_local_experts=s.experts, head_dim=None, sliding_window=s.window or None)
        out["router_jitter_noise"] = 0.0
        return out
    out.update(num_experts=s.experts, norm_topk_prob=s.arch == "qwen3moe")
    if s.arch == "olmoe":
        out.update(attention_bias=False, clip_qkv=None)
        return out
    out.update(use_sliding_window=False, sliding_window=None, decoder_sparse_step=1)
    out.update(mlp_only_layers=[], moe_intermediate_size=s.eff)
    if s.arch == "qwen3moe":
        out["attention_bias"] = False
    else:
        out.update(shared_expert_intermediate_size=s.shared_width, qkv_bias=True)
        out["max_window_layers"] = s.layers
    return out


def _hf_glm4moe_config(s: SynthSpec) -> dict[str, Any]:
    """Glm4MoeConfig's keys (4.57; ``num_nextn_predict_layers`` as the released checkpoints
    carry it, where the model has NextN layers)."""
    out: dict[str, Any] = {"n_routed_experts": s.experts, "num_experts_per_tok": s.experts_used}
    out.update(moe_intermediate_size=s.eff, n_shared_experts=s.shared_experts)
    out.update(routed_scaling_factor=s.expert_scale, first_k_dense_replace=s.dense_lead)
    out.update(n_group=s.expert_groups or 1, topk_group=s.expert_groups_used or 1)
    out.update(norm_topk_prob=True, use_qk_norm=s.use_qk_norm, attention_bias=True)
    if s.nextn:
        out["num_nextn_predict_layers"] = s.nextn
    return out


def _hf_entries(gen: SynthWeights, name: str, st: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The HF parameters of canonical tensor ``name``: one, or for merged experts one per
    expert (``model.layers.N.mlp.experts.E.gate_proj.weight``)."""
    s, fam = gen.spec, gen.spec.family
    shape = dict(s.tensor_shapes(fused=True))[name]
    if len(shape) != 3:
        # GLM's correction bias is float32 in its checkpoints, whatever the weights' dtype.
        dt = "F32" if name.endswith("exp_probs_b.bias") else st
        return [(hf_name(name, fam), dt, shape)]
    assert fam.hf_experts is not None
    path, projs = fam.hf_experts
    layer, kind = name.split(".")[1:]
    proj = {v: k for k, v in projs.items()}[kind[len("ffn_") : -len("_exps")]]
    prefix = f"{fam.hf_layer_prefix}{layer}.{path}"
    return [(f"{prefix}{e}.{proj}.weight", st, shape[1:]) for e in range(shape[0])]


def _per_expert(x: np.ndarray, merged: bool) -> list[np.ndarray]:
    """``x`` as the arrays its HF parameters hold: one per expert of a merged tensor."""
    return list(x) if merged else [x]


def _encode_hf(x: np.ndarray, st_dtype: str) -> np.ndarray:
    if st_dtype == "BF16":
        return f32_to_bf16_bits(x)
    return x.astype(np.float16 if st_dtype == "F16" else np.float32, copy=False)


def _hf_tensor(gen: SynthWeights, name: str) -> np.ndarray:
    """Tensor ``name`` as the family's HF checkpoint stores it (Gemma's norms as ``w - 1``;
    Falcon's fused q/k/v head by head when every query head has its own K/V head)."""
    x = gen.file_tensor(name)
    s = gen.spec
    if s.arch == "falcon" and name.endswith("attn_qkv") and 1 < s.kv_heads == s.heads:
        x = x.reshape(3, s.heads, s.head_dim, s.dim).transpose(1, 0, 2, 3).reshape(x.shape)
        return np.ascontiguousarray(x)
    off = gen.spec.family.hf_norm_offset
    return x - np.float32(off) if off and name.endswith("_norm") else x


def write_safetensors(
    path: Path, entries: list[tuple[str, str, tuple[int, ...]]], arrays: Iterator[np.ndarray]
) -> int:
    """Write a safetensors file from ``(name, dtype, shape)`` entries and matching arrays
    (streamed, in order). The header is padded with spaces to a multiple of 8. Returns the
    number of data bytes."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1}
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
    out_dir: str | os.PathLike[str], *, dtype: str = "bf16", shards: int = 1, **shape: Any
) -> Path:
    """Write a synthetic HF directory (config.json, safetensors, tokenizer files) of the
    model ``SynthSpec(**shape)``: ``dim, ffn, layers, heads, kv_heads, vocab`` and optionally
    ``activation, max_context, seed, active, tie, gate_rank, gate_noise, arch, sliding_window``,
    and RoPE's ``rope_theta, rope_scaling`` ("linear" / "llama3" as ``rope_scaling`` in
    config.json, with ``rope_factor`` and llama3's ``rope_low_freq_factor,
    rope_high_freq_factor, rope_original_context``) and ``partial_rotary``
    (``partial_rotary_factor``).

    ``shards=2`` splits the weights over two files with a ``model.safetensors.index.json``.
    """
    if dtype not in HF_DTYPES:
        raise UnsupportedError(f"dtype {dtype!r} (choose from {', '.join(HF_DTYPES)})")
    if shards not in (1, 2):
        raise ShapeError("shards must be 1 or 2")
    spec = SynthSpec(**shape)
    if spec.family.moe and spec.family.hf_experts is None:
        raise UnsupportedError(f"{spec.arch}: its HF checkpoints need its own code; GGUF only")
    gen = SynthWeights(spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    st = HF_DTYPES[dtype]
    torch_dtype = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    config = _hf_config(spec, torch_dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, indent=2)
    )
    build_tokenizer(spec.vocab).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": SPECIAL_TOKENS[BOS_ID],
                "eos_token": SPECIAL_TOKENS[EOS_ID],
                "add_bos_token": False,
                "chat_template": chat_template(spec.arch),
                "model_max_length": spec.max_context,
            },
            indent=2,
        )
    )

    names = [n for n, _ in spec.tensor_shapes(fused=True)]
    shapes = dict(spec.tensor_shapes(fused=True))
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
        entries = [e for n in group for e in _hf_entries(gen, n, st)]
        # Merged experts go out one expert at a time.
        arrays = (
            _encode_hf(a, "F32" if n.endswith("exp_probs_b.bias") else st)
            for n in group
            for a in _per_expert(_hf_tensor(gen, n), len(shapes[n]) == 3)
        )
        total += write_safetensors(out / fname, entries, arrays)
        weight_map.update({e[0]: fname for e in entries})
    if shards > 1:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return out


# --------------------------------------------------------------------------- GGUF writer
def add_llama_metadata(
    w: Any, spec: SynthSpec, name: str, file_type: int, *, tokenizer_pre: str = "gpt-2"
) -> None:
    """Write ``spec``'s llama hyper-parameters and byte-level BPE tokenizer to the GGUF writer
    ``w`` as PowerInfer's converter does (its ReluLLaMA, Bamboo and OPT files;
    ``tokenizer_pre`` "gpt-2" is llama.cpp's name for the GPT-2 split, PowerInfer's converter
    writes "gpt2")."""
    w.add_name(name)
    _add_llama_hparams(w, spec, file_type)
    add_tokenizer(w, spec, tokenizer_pre)


def _add_sizes(w: Any, s: SynthSpec) -> None:
    """The size keys every converter writes (GLM's block count with its NextN layers)."""
    w.add_block_count(s.layers + s.nextn)
    w.add_context_length(s.max_context)
    w.add_embedding_length(s.dim)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)


def _add_llama_hparams(w: Any, s: SynthSpec, file_type: int) -> None:
    _add_sizes(w, s)
    w.add_rope_dimension_count(s.rope_dims)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_file_type(file_type)


def add_converter_metadata(w: Any, spec: SynthSpec, name: str, file_type: int) -> None:
    """Write the keys llama.cpp's ``convert_hf_to_gguf.py`` writes for ``spec``'s family
    (llama.cpp's conversion/*.py; nothing else), then the tokenizer.

    ``TextModel.set_gguf_parameters`` (llama, mistral, qwen2, qwen3, gemma3): block count,
    context, embedding and FFN sizes, head counts, linear RoPE scaling, the RoPE base (and the
    sliding layers' base), the RMS epsilon, ``key_length``/``value_length`` where the config
    class has a ``head_dim`` (Llama, Qwen3, Gemma 3; not Mistral's null or Qwen2), the file
    type; llama adds ``vocab_size`` and ``rope.dimension_count``; Gemma 3 rewrites its own and
    adds the window and a final soft-cap when set. Phi-3, Gemma 2 and Falcon write their own
    lists (below). ``rope.dimension_count`` below the head size, which no converter writes for
    these families but qwen2/qwen3/gemma/falcon files may carry, marks partial RoPE; and
    Phi-3's linear scaling, which its converter never writes, is llama.cpp's
    ``rope.scaling.*`` keys (its phi3 graph reads them). Both are llama.cpp's keys for models
    the converters do not make, tested against llama.cpp itself.
    """
    import gguf

    f, s = spec.family, spec
    w.add_name(name)
    w.add_type("model")
    w.add_quantization_version(2)
    arch = f.gguf_arch
    if arch in ("bamboo", "opt"):  # PowerInfer's own converter
        _add_llama_hparams(w, spec, file_type)
        if f.layer_norm:
            w.add_layer_norm_eps(spec.rms_eps)
        add_tokenizer(w, spec, "gpt-2")
        return
    _add_sizes(w, s)
    partial = s.rope_dims != s.head_dim
    if arch == "phi3":  # conversion/phi.py Phi3MiniModel
        longrope = s.rope_scaling == "longrope"
        # Phi3Config's original_max_position_embeddings (4096 unless the config says).
        w.add_rope_scaling_orig_ctx_len(s.rope_original_context if longrope else 4096)
        w.add_layer_norm_rms_eps(s.rms_eps)
        w.add_rope_dimension_count(s.rope_dims)
        w.add_rope_freq_base(s.rope_theta)
        w.add_sliding_window(s.window)
        if s.rope_scaling == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(s.rope_factor)
        if longrope:  # Phi3MiniModel.generate_extra_tensors: the factor tensors, and this
            orig = s.rope_original_context
            w.add_rope_scaling_attn_factors(longrope_attn_factor(s.max_context / orig, orig))
    elif arch == "gemma2":  # conversion/gemma.py Gemma2Model
        w.add_layer_norm_rms_eps(s.rms_eps)
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
        w.add_attn_logit_softcapping(s.softcaps[0])
        w.add_final_logit_softcapping(s.softcaps[1])
        w.add_sliding_window(s.window)
    elif arch == "falcon":  # conversion/falcon.py
        w.add_string("falcon.tensor_data_layout", "jploski")
        w.add_layer_norm_eps(s.rms_eps)
    else:  # conversion/base.py TextModel (+ llama.py, qwen.py, gemma.py Gemma3Model)
        if s.rope_scaling == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(s.rope_factor)
        elif s.rope_scaling == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(s.rope_factor)
            w.add_rope_scaling_orig_ctx_len(s.rope_original_context)
        w.add_rope_freq_base(s.rope_theta)
        if f.rope_theta_local:
            w.add_rope_freq_base_swa(f.rope_theta_local)  # Gemma3TextConfig's rope_local_base_freq
        w.add_layer_norm_rms_eps(s.rms_eps)
        if s.hf_head_dim is not None:
            w.add_key_length(s.head_dim)
            w.add_value_length(s.head_dim)
        if arch == "llama":
            w.add_vocab_size(s.vocab)
            w.add_rope_dimension_count(s.rope_dims)
        elif partial or arch == "glm4moe":  # Glm4MoeModel writes it always
            w.add_rope_dimension_count(s.rope_dims)
        if arch == "gemma3":
            if s.window:
                w.add_sliding_window(s.window)
            if s.softcaps[1]:
                w.add_final_logit_softcapping(s.softcaps[1])
    if f.moe:
        _add_experts(w, spec)
    w.add_file_type(file_type)
    add_tokenizer(w, spec, "gpt-2")


def _add_experts(w: Any, s: SynthSpec) -> None:
    """The expert keys llama.cpp's converter writes: ``expert_count`` and
    ``expert_used_count`` (TextModel, from num_experts / num_local_experts and
    num_experts_per_tok); Qwen2/3-MoE's ``expert_feed_forward_length`` (moe_intermediate_size)
    and Qwen2-MoE's ``expert_shared_feed_forward_length``. OLMoE's and Mixtral's experts are
    ``feed_forward_length`` wide."""
    if s.arch == "glm4moe":  # conversion's Glm4MoeModel (TextModel: expert_used_count)
        _add_glm4moe_experts(w, s)
        return
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.experts_used)
    if s.arch in ("qwen2moe", "qwen3moe", "smallthinker"):
        w.add_expert_feed_forward_length(s.eff)
    if s.arch == "smallthinker":  # conversion/smallthinker.py
        import gguf

        softmax = s.expert_gating == "softmax"
        kind = gguf.ExpertGatingFuncType.SOFTMAX if softmax else gguf.ExpertGatingFuncType.SIGMOID
        w.add_expert_gating_func(kind)
        if s.sliding_window:
            w.add_sliding_window(s.sliding_window)
    if s.shared_width:
        w.add_expert_shared_feed_forward_length(s.shared_width)


def _add_glm4moe_experts(w: Any, s: SynthSpec) -> None:
    """Glm4MoeModel.set_gguf_parameters' expert keys, in its order (TextModel has written
    ``expert_used_count``; ``nextn_predict_layers`` only where config.json has the key)."""
    import gguf

    w.add_expert_used_count(s.experts_used)
    w.add_expert_count(s.experts)
    w.add_expert_feed_forward_length(s.eff)
    w.add_expert_shared_count(s.shared_experts)
    w.add_leading_dense_block_count(s.dense_lead)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(s.expert_scale)
    w.add_expert_weights_norm(True)
    if s.nextn:
        w.add_nextn_predict_layers(s.nextn)


def add_tokenizer(w: Any, spec: SynthSpec, tokenizer_pre: str) -> None:
    """The byte-level BPE tokenizer's keys, as the converters write a GPT-2 style one."""
    tokens, merges = byte_level_vocab(spec.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if i < len(SPECIAL_TOKENS) else 1 for i in range(spec.vocab)])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)


def _rope_tensors(spec: SynthSpec) -> dict[str, np.ndarray]:
    """The RoPE factor tensors llama.cpp's converter writes for ``spec``: llama3's
    ``rope_freqs``; Phi-3's LongRoPE ``rope_factors_long`` and ``rope_factors_short``."""
    if spec.rope_scaling == "llama3":
        return {"rope_freqs": np.asarray(spec.llama3_factors(), dtype=np.float32)}
    if spec.rope_scaling == "longrope":
        short, long = spec.longrope_factors()
        return {
            "rope_factors_long": np.asarray(long, dtype=np.float32),
            "rope_factors_short": np.asarray(short, dtype=np.float32),
        }
    return {}


def write_gguf_model(
    out_path: str | os.PathLike[str],
    *,
    dtype: str = "F16",
    split_max_tensors: int = 0,
    split_max_size: int = 0,
    **shape: Any,
) -> Path:
    """Write the same synthetic model as :func:`write_hf_model` (same ``shape`` keywords) as a
    GGUF file of its family, with llama.cpp's architecture, keys and tensor names.

    2-D weights are stored in ``dtype`` (norms and biases always F32; K-quants, mixes and
    their fallbacks as :mod:`.synth_types` says); for llama, q/k rows are permuted as llama.cpp's
    converter does (with partial RoPE only the rotated rows of each head). The keys are the
    converter's for the family (:func:`add_converter_metadata`); an activation other than the
    family's own (llama.cpp's graphs: SiLU, GELU for Gemma and Falcon) is recorded as
    ``powerinfer_rs.activation``, which llama.cpp ignores.
    RoPE as llama.cpp's converter writes it: ``rope.dimension_count`` = the rotated dims,
    linear scaling as ``rope.scaling.type``/``factor``, llama3 scaling as an F32
    ``rope_freqs.weight`` of the per-pair factors. Returns ``out_path``.

    ``split_max_tensors`` / ``split_max_size`` (bytes) split the file as
    ``convert_hf_to_gguf.py --split-max-tensors / --split-max-size`` does (gguf-py's own
    writer): shards ``<stem>-00001-of-0000N.gguf``, ... beside ``out_path``, and the first
    shard's path is returned (``out_path`` itself when one shard suffices).
    """
    import gguf

    dtype = dtype.upper()
    if dtype not in GGUF_DTYPES:
        raise UnsupportedError(f"dtype {dtype!r} (choose from {', '.join(GGUF_DTYPES)})")
    spec = SynthSpec(**shape)
    gen = SynthWeights(spec)
    if dtype.startswith("Q") and (spec.dim % 32 or spec.ffn % 32):
        raise ShapeError(f"{dtype} needs dim and ffn to be multiples of 32")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Shards are written into a directory of their own, then moved beside ``out``.
    work = out.with_name(out.name + ".part.d")
    work.mkdir(exist_ok=True)
    tmp = work / out.name

    w = gguf.GGUFWriter(
        str(tmp),
        spec.family.gguf_arch,
        split_max_tensors=split_max_tensors,
        split_max_size=split_max_size,
    )
    # general.name leaves the family out: llama.cpp looks special tokens of Phi-3's vocabulary
    # up by name ("</s>", "<s>") when the model name contains "phi3", which ours has not.
    name = f"synthetic-{spec.activation}-d{spec.dim}-f{spec.ffn}-l{spec.layers}"
    add_converter_metadata(w, spec, name, GGUF_FILE_TYPE[dtype])
    # Keys of ours only for what llama.cpp cannot express: an activation other than the
    # family's (a ReLU llama, the exact GELU, ...) and FATReLU's threshold.
    if spec.activation != (spec.family.activation or "silu"):
        w.add_string(ACTIVATION_KEY, spec.activation)
    if spec.relu_threshold:
        w.add_float32(RELU_THRESHOLD_KEY, spec.relu_threshold)
    w.add_chat_template(chat_template(spec.arch))

    order = spec.tensor_shapes(fused=True)
    # The router stays F32 (llama.cpp's converter and quantizer never change it).
    types = {
        n: "F32" if n.endswith(".ffn_gate_inp") else tensor_dtype(dtype, n, s[-1], spec.layers)
        for n, s in order
        if len(s) >= 2
    }
    # Llama 3.1's RoPE factors (Phi-3's LongRoPE ones): F32 vectors of rope_dims / 2, first, as
    # llama.cpp's converter yields them.
    rope_tensors = _rope_tensors(spec)
    for rname, v in rope_tensors.items():
        w.add_tensor_info(f"{rname}.weight", v.shape, np.dtype(np.float32), v.nbytes)
    for name, shape in order:
        full = gguf_name(name, spec.family)
        if len(shape) == 1:
            w.add_tensor_info(full, shape, np.dtype(np.float32), shape[0] * 4)
            continue
        rows, cols = math.prod(shape[:-1]), shape[-1]  # merged experts are 3-D
        tdt = types[name]
        qtype = gguf.GGMLQuantizationType[tdt]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = rows * cols // block * size
        np_dt = {"F32": np.float32, "F16": np.float16}.get(tdt, np.uint8)
        raw_shape = shape if tdt in ("F32", "F16") else (*shape[:-1], cols // block * size)
        w.add_tensor_info(
            full,
            raw_shape,
            np.dtype(np_dt),
            nbytes,
            raw_dtype=None if tdt in ("F32", "F16") else qtype,
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for v in rope_tensors.values():
        w.write_tensor_data(v)
    for name, shape in order:
        x = gen.gguf_tensor(name)
        if len(shape) == 1:
            w.write_tensor_data(x)
            continue
        data = encode(x.reshape(-1, shape[-1]), types[name])
        w.write_tensor_data(data.reshape(*shape[:-1], -1))
    w.close()
    return _move_shards(w.format_shard_names(tmp), out, work)


def gguf_name(name: str, family: Family) -> str:
    """The GGUF tensor name of canonical tensor ``name`` (``.weight`` added, biases as they
    are; GLM's FFN norm is ``post_attention_norm``)."""
    if name.startswith("blk.") and family.gguf_layer_names:
        _, layer, kind = name.split(".", 2)
        back = {v: k for k, v in family.gguf_layer_names.items()}
        name = f"blk.{layer}.{back.get(kind, kind)}"
    return name if name.endswith(".bias") else f"{name}.weight"


def _move_shards(written: list[Path], out: Path, work: Path) -> Path:
    """Move the files a writer made in ``work`` beside ``out`` (``out`` itself for one file);
    returns the first."""
    if len(written) == 1:
        os.replace(written[0], out)
        work.rmdir()
        return out
    final = [out.with_name(p.name) for p in written]
    for src, dst in zip(written, final):
        os.replace(src, dst)
    work.rmdir()
    return final[0]


# --------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m powerinfer_rs.synth``, its options in groups by concern."""
    ap = argparse.ArgumentParser(
        prog="python -m powerinfer_rs.synth",
        description="Write a synthetic model of any supported family (random weights, planted "
        "power-law FFN activation frequencies) as an HF directory or a GGUF file.",
    )
    _add_shape_args(ap)
    _add_family_args(ap)
    _add_rope_args(ap)
    _add_format_args(ap)
    _add_gate_args(ap)
    _add_moe_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory (hf) or .gguf path")
    return ap


def _add_shape_args(ap: argparse.ArgumentParser) -> None:
    """The transformer's sizes."""
    ap.add_argument("--dim", type=positive_int, default=256, help="hidden size")
    ap.add_argument("--ffn", type=positive_int, default=704, help="FFN (intermediate) size")
    ap.add_argument("--layers", type=positive_int, default=4)
    ap.add_argument("--heads", type=positive_int, default=8)
    ap.add_argument(
        "--kv-heads", type=positive_int, default=None, help="KV heads (default: --heads)"
    )
    ap.add_argument("--vocab", type=positive_int, default=1024)


def _add_family_args(ap: argparse.ArgumentParser) -> None:
    """The family, its activation (and the planted share active) and its attention window."""
    ap.add_argument(
        "--active",
        type=float_in(0.0, 1.0, low_open=True),
        default=0.1,
        help="mean fraction of FFN neurons active per token (planted)",
    )
    ap.add_argument(
        "--activation",
        choices=["relu", "silu", "gelu", "gelu_erf"],
        default="relu",
        help="FFN activation (gelu: the tanh form; gelu_erf: the exact one). GGUF files carry "
        "powerinfer_rs.activation only when it is not the family's own",
    )
    ap.add_argument(
        "--arch", choices=[f.name for f in FAMILIES], default="llama", help="model family"
    )
    ap.add_argument(
        "--sliding-window",
        type=nonneg_int,
        default=0,
        help="attention window (llama/mistral/phi3; 0 = none)",
    )
    ap.add_argument("--max-context", type=positive_int, default=512)


def _add_rope_args(ap: argparse.ArgumentParser) -> None:
    """RoPE: its base, its scaling and the share of each head that rotates."""
    ap.add_argument("--rope-theta", type=positive_float, default=10000.0, help="RoPE base")
    ap.add_argument(
        "--rope-scaling",
        choices=["none", "linear", "llama3", "yarn", "longrope"],
        default="none",
        help="RoPE scaling: linear (positions / --rope-factor), Llama 3.1's llama3 factors "
        "(GGUF: a rope_freqs tensor; HF: rope_scaling), yarn (--rope-factor over "
        "--rope-original-context), or Phi-3's longrope (phi3 only: short and long factors)",
    )
    ap.add_argument(
        "--rope-factor", type=positive_float, default=8.0, help="linear / llama3 scaling factor"
    )
    for band, factor in (("low", 1.0), ("high", 4.0)):  # llama3's factors of its two bands
        ap.add_argument(
            f"--rope-{band}-freq-factor", type=positive_float, default=factor, help="llama3"
        )
    ap.add_argument(
        "--rope-original-context",
        type=positive_int,
        default=8192,
        help="llama3, yarn and longrope: original_max_position_embeddings",
    )
    ap.add_argument(
        "--partial-rotary-factor",
        type=share,
        default=1.0,
        help="partial RoPE: the first int(head_dim * factor) values of each head rotate "
        "(GGUF: rope.dimension_count; HF: partial_rotary_factor)",
    )


def _add_format_args(ap: argparse.ArgumentParser) -> None:
    """The file format, its dtype and shards, and a tied output head."""
    ap.add_argument(
        "--format",
        default="hf",
        choices=["hf", *(f"gguf-{d.lower()}" for d in GGUF_DTYPES)],
        help="hf, or gguf-<dtype>: one format for every 2-D weight, or the mix gguf-q4_k_m",
    )
    ap.add_argument("--dtype", choices=list(HF_DTYPES), default="bf16", help="for --format hf")
    ap.add_argument("--shards", type=int, choices=[1, 2], default=1, help="for --format hf")
    ap.add_argument("--tie", action="store_true", help="tie the output head to the embeddings")


def _add_gate_args(ap: argparse.ArgumentParser) -> None:
    """The planted low-rank gate structure that makes activity predictable."""
    ap.add_argument(
        "--gate-rank",
        type=nonneg_int,
        default=64,
        help="rank of the planted low-rank gate structure that makes activity predictable "
        "(0 = full-rank random gate)",
    )
    ap.add_argument(
        "--gate-noise",
        type=float_in(0.0, 1.0),
        default=0.0,
        help="share of each gate row's variance from a full-rank random part added to the "
        "planted low-rank one (0 = exactly low rank; a low-rank predictor is then inexact)",
    )


def _add_moe_args(ap: argparse.ArgumentParser) -> None:
    """A mixture of experts' experts (MoE families)."""
    ap.add_argument(
        "--experts", type=nonneg_int, default=0, help="experts per layer (MoE families)"
    )
    ap.add_argument("--experts-used", type=nonneg_int, default=0, help="experts per token")
    ap.add_argument(
        "--expert-ffn",
        type=nonneg_int,
        default=0,
        help="each expert's width (qwen2moe/qwen3moe; 0 = --ffn)",
    )
    ap.add_argument(
        "--shared-ffn", type=nonneg_int, default=0, help="qwen2moe's shared expert (0 = --ffn)"
    )
    ap.add_argument(
        "--dense-lead", type=nonneg_int, default=0, help="glm4moe: leading dense layers"
    )
    ap.add_argument("--shared-experts", type=nonneg_int, default=1, help="glm4moe: shared experts")
    ap.add_argument(
        "--expert-scale", type=positive_float, default=1.0, help="glm4moe: routed_scaling_factor"
    )
    ap.add_argument("--nextn", type=nonneg_int, default=0, help="glm4moe: NextN/MTP blocks")


def main(argv: list[str] | None = None) -> int:
    """``python -m powerinfer_rs.synth``: write a synthetic model."""
    a = build_parser().parse_args(argv)
    keys = ("dim", "ffn", "layers", "heads", "vocab", "activation", "max_context", "seed")
    extra = ("active", "tie", "gate_rank", "gate_noise", "arch", "sliding_window")
    extra += ("rope_theta", "rope_scaling")
    extra += ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor")
    extra += ("rope_original_context", "experts", "experts_used", "expert_ffn", "shared_ffn")
    extra += ("dense_lead", "shared_experts", "expert_scale", "nextn")
    common = {k: getattr(a, k) for k in (*keys, *extra)}
    common["partial_rotary"] = a.partial_rotary_factor
    common["kv_heads"] = a.kv_heads or a.heads
    t0 = time.perf_counter()

    def write() -> int:
        if a.format == "hf":
            path = write_hf_model(a.out, dtype=a.dtype, shards=a.shards, **common)
        else:
            path = write_gguf_model(a.out, dtype=a.format.split("-", 1)[1].upper(), **common)
        print(f"wrote synthetic model {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return 0

    return run_cli(write)
