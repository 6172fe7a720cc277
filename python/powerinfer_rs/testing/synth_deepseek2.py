"""Synthetic DeepSeek-V2/V3 models (llama.cpp's ``deepseek2``): one set of random weights in
Hugging Face's layout (``DeepseekV2/V3ForCausalLM``'s parameter names and shapes, ``kv_b_proj``
fused) written as a checkpoint directory (config.json with the keys the real configs carry,
model.safetensors) and as the GGUF llama.cpp's converter (conversion/deepseek.py
``DeepseekV2Model``) makes of it: its keys in its order, ``num_key_value_heads`` written as 1,
``key_length`` / ``value_length`` as the latent row (``kv_lora_rank + qk_rope_head_dim`` /
``kv_lora_rank``), ``kv_b_proj`` split into ``attn_k_b`` (per head transposed) and ``attn_v_b``
(no ``attn_kv_b``), the experts merged, every tensor F32 (``--outtype f32``); quantized files
come from llama.cpp's own quantizer (tests).

Shapes are tiny (dims 64-128) so tests take seconds. ``v3=True``: sigmoid routing with the
correction bias (``e_score_correction_bias``), renormalised, ``routed_scaling_factor``, expert
groups; ``v3=False``: DeepSeek-V2's softmax router without renormalisation. ``q_lora_rank``
0: one ``q_proj`` (DeepSeek-V2-Lite; llama.cpp reads such GGUFs only at its "lite" layer
counts, so tests run that form from the HF directory).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .synth import add_tokenizer
from .synth_vocab import BOS_ID, EOS_ID, chat_template


@dataclass(frozen=True)
class DeepseekSpec:
    """The shape of a synthetic DeepSeek model (HF config names in the comments)."""

    dim: int = 64  # hidden_size
    layers: int = 3  # num_hidden_layers
    heads: int = 4  # num_attention_heads
    vocab: int = 300
    q_lora_rank: int = 64  # 0: None (DeepSeek-V2-Lite's q_proj)
    kv_lora_rank: int = 32
    qk_nope: int = 32  # qk_nope_head_dim
    qk_rope: int = 16  # qk_rope_head_dim
    v_head_dim: int = 32
    ffn: int = 96  # intermediate_size (the leading dense layers)
    expert_ffn: int = 32  # moe_intermediate_size
    experts: int = 8  # n_routed_experts
    experts_used: int = 2  # num_experts_per_tok
    shared_experts: int = 1  # n_shared_experts
    dense_lead: int = 1  # first_k_dense_replace
    v3: bool = True
    groups: int = 4  # n_group (V3)
    groups_used: int = 2  # topk_group (V3)
    scale: float = 2.5  # routed_scaling_factor (V3)
    max_context: int = 256  # max_position_embeddings
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    #: YaRN (rope_scaling type "yarn": factor over original_max_position_embeddings, with
    #: mscale = mscale_all_dim, as the published configs); 0: none.
    yarn_factor: float = 0.0
    yarn_original: int = 64
    mscale_all_dim: float = 0.707
    seed: int = 0

    def rope_scaling(self) -> dict | None:
        """config.json's rope_scaling (DeepSeek-V2-Lite's keys), None without YaRN."""
        if not self.yarn_factor:
            return None
        return {
            "type": "yarn",
            "factor": self.yarn_factor,
            "original_max_position_embeddings": self.yarn_original,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": self.mscale_all_dim,
            "mscale_all_dim": self.mscale_all_dim,
        }

    def hf_config(self, torch_dtype: str = "float32") -> dict:
        """config.json as DeepseekV2Config / DeepseekV3Config writes it (the keys the real
        DeepSeek-V2-Lite and V3 configs carry; no rope_scaling)."""
        v3 = self.v3
        cfg = {
            "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v3" if v3 else "deepseek_v2",
            "vocab_size": self.vocab,
            "hidden_size": self.dim,
            "intermediate_size": self.ffn,
            "moe_intermediate_size": self.expert_ffn,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "n_shared_experts": self.shared_experts,
            "n_routed_experts": self.experts,
            "routed_scaling_factor": self.scale if v3 else 1.0,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank or None,
            "qk_rope_head_dim": self.qk_rope,
            "v_head_dim": self.v_head_dim,
            "qk_nope_head_dim": self.qk_nope,
            "topk_method": "noaux_tc" if v3 else "greedy",
            "n_group": self.groups if v3 else 1,
            "topk_group": self.groups_used if v3 else 1,
            "num_experts_per_tok": self.experts_used,
            "moe_layer_freq": 1,
            "first_k_dense_replace": self.dense_lead,
            "norm_topk_prob": v3,
            "scoring_func": "sigmoid" if v3 else "softmax",
            "aux_loss_alpha": 0.001,
            "seq_aux": True,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_context,
            "initializer_range": 0.02,
            "rms_norm_eps": self.rms_eps,
            "use_cache": True,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "tie_word_embeddings": False,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling(),
            "attention_bias": False,
            "attention_dropout": 0.0,
            "torch_dtype": torch_dtype,
        }
        if v3:
            cfg["num_nextn_predict_layers"] = 0
        return cfg


def hf_weights(s: DeepseekSpec) -> dict[str, np.ndarray]:
    """The checkpoint's parameters (float32, HF names and shapes), random but scaled so that
    every layer moves the residual and the logits spread."""
    rng = np.random.default_rng(s.seed)

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    d, h, qh = s.dim, s.heads, s.qk_nope + s.qk_rope
    out = {"model.embed_tokens.weight": mat(s.vocab, d, np.sqrt(d))}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(d)
        if s.q_lora_rank:
            out[p + "self_attn.q_a_proj.weight"] = mat(s.q_lora_rank, d)
            out[p + "self_attn.q_a_layernorm.weight"] = norm(s.q_lora_rank)
            out[p + "self_attn.q_b_proj.weight"] = mat(h * qh, s.q_lora_rank, 2.0)
        else:
            out[p + "self_attn.q_proj.weight"] = mat(h * qh, d, 2.0)
        out[p + "self_attn.kv_a_proj_with_mqa.weight"] = mat(s.kv_lora_rank + s.qk_rope, d, 2.0)
        out[p + "self_attn.kv_a_layernorm.weight"] = norm(s.kv_lora_rank)
        kv_b = mat(h * (s.qk_nope + s.v_head_dim), s.kv_lora_rank, 1.5)
        out[p + "self_attn.kv_b_proj.weight"] = kv_b
        out[p + "self_attn.o_proj.weight"] = mat(d, h * s.v_head_dim, 0.5)
        out[p + "post_attention_layernorm.weight"] = norm(d)
        if i < s.dense_lead:
            for n, (r, c) in (("gate", (s.ffn, d)), ("up", (s.ffn, d)), ("down", (d, s.ffn))):
                out[p + f"mlp.{n}_proj.weight"] = mat(r, c)
            continue
        out[p + "mlp.gate.weight"] = mat(s.experts, d, 3.0)
        if s.v3:
            out[p + "mlp.gate.e_score_correction_bias"] = (
                0.2 * rng.standard_normal(s.experts)
            ).astype(np.float32)
        for e in range(s.experts):
            q = p + f"mlp.experts.{e}."
            out[q + "gate_proj.weight"] = mat(s.expert_ffn, d)
            out[q + "up_proj.weight"] = mat(s.expert_ffn, d)
            out[q + "down_proj.weight"] = mat(d, s.expert_ffn)
        sw = s.expert_ffn * s.shared_experts
        out[p + "mlp.shared_experts.gate_proj.weight"] = mat(sw, d)
        out[p + "mlp.shared_experts.up_proj.weight"] = mat(sw, d)
        out[p + "mlp.shared_experts.down_proj.weight"] = mat(d, sw)
    out["model.norm.weight"] = norm(d)
    out["lm_head.weight"] = mat(s.vocab, d, 4.0)
    return out


def write_deepseek_hf(out_dir: str | os.PathLike[str], s: DeepseekSpec) -> Path:
    """The checkpoint directory: config.json, model.safetensors (float32), the tokenizer."""
    from safetensors.numpy import save_file

    from .synth_vocab import build_tokenizer

    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(s.hf_config(), indent=2))
    save_file(hf_weights(s), str(d / "model.safetensors"))
    build_tokenizer(s.vocab).save(str(d / "tokenizer.json"))
    tok_cfg = {"chat_template": chat_template("deepseek2"), "add_bos_token": False}
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return d


def _gguf_layer(s: DeepseekSpec, i: int, hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Layer ``i``'s tensors as DeepseekV2Model.modify_tensors writes them."""
    p, b = f"model.layers.{i}.", f"blk.{i}."
    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_a_proj.weight": "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight": "attn_q_b.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "mlp.gate.weight": "ffn_gate_inp.weight",
        "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    }
    out = {b + g: hf[p + k] for k, g in names.items() if p + k in hf}
    # kv_b_proj: per head qk_nope rows of k then v_head_dim rows of v; k_b transposed.
    kv_b = hf[p + "self_attn.kv_b_proj.weight"].reshape(
        s.heads, s.qk_nope + s.v_head_dim, s.kv_lora_rank
    )
    out[b + "attn_k_b.weight"] = np.ascontiguousarray(kv_b[:, : s.qk_nope].transpose(0, 2, 1))
    out[b + "attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, s.qk_nope :])
    if i >= s.dense_lead:
        for n in ("gate", "up", "down"):
            experts = [hf[p + f"mlp.experts.{e}.{n}_proj.weight"] for e in range(s.experts)]
            out[b + f"ffn_{n}_exps.weight"] = np.stack(experts)
    return out


def _add_keys(w, s: DeepseekSpec) -> None:
    """DeepseekV2Model.set_gguf_parameters' keys in its order (TextModel's first)."""
    import gguf

    c = s.hf_config()
    w.add_block_count(s.layers)
    w.add_context_length(s.max_context)
    w.add_embedding_length(s.dim)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(1)  # MLA as MQA
    if s.yarn_factor:  # TextModel: rope_scaling's type, factor, original context, betas
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.yarn_factor)
        w.add_rope_scaling_orig_ctx_len(s.yarn_original)
        w.add_rope_scaling_yarn_beta_fast(32)
        w.add_rope_scaling_yarn_beta_slow(1)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.experts_used)
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    sig = gguf.ExpertGatingFuncType.SIGMOID
    w.add_expert_gating_func(sig if s.v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(0)  # ALL_F32
    w.add_leading_dense_block_count(s.dense_lead)
    w.add_vocab_size(s.vocab)
    if s.q_lora_rank:
        w.add_q_lora_rank(s.q_lora_rank)
    w.add_kv_lora_rank(s.kv_lora_rank)
    w.add_key_length(s.kv_lora_rank + s.qk_rope)
    w.add_value_length(s.kv_lora_rank)
    w.add_key_length_mla(s.qk_nope + s.qk_rope)
    w.add_value_length_mla(s.v_head_dim)
    w.add_expert_feed_forward_length(s.expert_ffn)
    w.add_expert_shared_count(s.shared_experts)
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(s.qk_rope)
    if s.yarn_factor:  # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: 0.1 x mscale_all_dim
        w.add_rope_scaling_yarn_log_mul(0.1 * s.mscale_all_dim)


def write_deepseek_gguf(path: str | os.PathLike[str], s: DeepseekSpec) -> Path:
    """The all-F32 GGUF llama.cpp's converter writes from :func:`write_deepseek_hf`'s
    checkpoint (the same weights)."""
    import gguf

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    hf = hf_weights(s)
    w = gguf.GGUFWriter(str(out), "deepseek2")
    w.add_name(f"synthetic-deepseek2-d{s.dim}-l{s.layers}")
    w.add_type("model")
    w.add_quantization_version(2)
    _add_keys(w, s)
    add_tokenizer(w, SimpleNamespace(vocab=s.vocab), "gpt-2")
    w.add_chat_template(chat_template("deepseek2"))
    tensors = {"token_embd.weight": hf["model.embed_tokens.weight"]}
    for i in range(s.layers):
        tensors.update(_gguf_layer(s, i, hf))
    tensors["output_norm.weight"] = hf["model.norm.weight"]
    tensors["output.weight"] = hf["lm_head.weight"]
    for name, x in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
