"""The model families the engine runs, as data: what each changes in the llama layer, how its
GGUF (llama.cpp's keys and tensor names) and its Hugging Face checkpoint name the tensors, and
which fused tensors are split at load.

Adding a family is an entry in :data:`FAMILIES` (plus, where it needs a new operation, one
feature in the config and its step in the forward pass). The engine's canonical tensor names
are llama.cpp's without ``.weight`` (``blk.N.attn_q``); biases keep ``.bias``
(``blk.N.attn_q.bias``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ShapeError, UnsupportedError
from .types import ModelConfig, TensorData


@dataclass(frozen=True)
class Family:
    """One model family.

    ``config`` holds the engine config values the family fixes (:class:`.types.ModelConfig`
    field names; the engine declares them, crates/py/src/config.rs): what it changes in the
    llama layer (``qkv_bias``, ``qk_norm``, ``post_norms``, ``swa_pattern``,
    ``rope_theta_local``, ``up_act``, OPT's and Falcon's ``layer_norm``, ``learned_pos``,
    ``pos_offset``, ``no_gate``, ``ffn_bias``, ``out_bias``, ``parallel``) and its
    ``activation`` where its files do not name one. Reading ``family.<field>`` gives the value
    there, else the config's default. The loaders build a config as
    ``ModelConfig(**family.config, <what the file says>)`` (:func:`family_config`).

    ``gguf_arch`` is llama.cpp's ``general.architecture``; ``rope_style`` its RoPE pairing in
    GGUF files ("norm" where llama.cpp's converter permutes q/k rows, "neox" where it does not;
    Hugging Face checkpoints are always "neox"). ``hf_types`` are the ``model_type`` values and
    ``hf_archs`` the ``architectures`` of its checkpoints; ``hf_layer_names`` adds to or
    overrides the llama parameter names. ``fused_qkv`` / ``fused_gate_up``: the file stores q,k,v
    (gate,up) as one matrix, split at load. ``window``: honour a sliding window set in the file.
    Gemma: ``hf_norm_offset`` (HF stores ``w - 1``; llama.cpp's converter adds the 1),
    ``scale_embeddings`` (embeddings times sqrt(dim)). ``hf_globals`` / ``hf_layer_prefix`` /
    ``hf_own_names``: the checkpoint's names when they are not llama's (``hf_layer_names`` then
    replaces llama's).

    Defaults taken from the family rather than the file (see the table's comments for the
    source of each). GGUF, as llama.cpp's graph for the arch (``src/models/<arch>.cpp``):
    ``config["activation"]`` (SiLU when absent), ``gguf_window`` (the window when the file
    names none, Gemma 2's 4096), ``gguf_softcaps`` (attention, final: ``None`` where llama.cpp
    never reads the key, else its value when absent), ``gguf_rope_base_swa`` (the sliding
    layers' RoPE base may come from ``rope.freq_base_swa``), ``gguf_tied`` (the head is always
    the embeddings; ``output.weight`` is never read). Hugging Face, as transformers' config
    class (4.57): ``hf_defaults`` (``__init__`` defaults of the keys the loader reads, applied
    where config.json leaves a key out; a key set to null stays null), ``hf_act_key`` (the key
    the modeling code reads the activation from), ``hf_eps_key`` (the norm epsilon's key, empty
    where the class has none and ``hf_defaults`` gives the value under ``"rms_norm_eps"``).
    """

    name: str
    gguf_arch: str
    rope_style: str
    hf_types: tuple[str, ...]
    hf_archs: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    fused_qkv: bool = False
    fused_gate_up: bool = False
    window: bool = False
    hf_norm_offset: float = 0.0
    scale_embeddings: bool = False
    hf_layer_names: dict[str, str] = field(default_factory=dict)
    hf_globals: dict[str, str] = field(default_factory=lambda: dict(LLAMA_HF_GLOBALS))
    hf_layer_prefix: str = "model.layers."
    hf_own_names: bool = False
    gguf_window: int = 0
    gguf_softcaps: tuple[float | None, float | None] = (None, None)
    gguf_rope_base_swa: bool = False
    gguf_tied: bool = False
    hf_defaults: dict[str, object] = field(default_factory=dict)
    hf_act_key: str = "hidden_act"
    hf_eps_key: str = "rms_norm_eps"
    #: A mixture of experts.
    moe: bool = False
    #: Hugging Face checkpoints of a mixture of experts: the parameter path of the experts
    #: after the layer prefix (``mlp.experts.``, then the expert's index) and each expert
    #: projection's name -> "gate" / "up" / "down". None: the family has no HF checkpoints
    #: the loader reads (SmallThinker's need its repository's own code).
    hf_experts: tuple[str, dict[str, str]] | None = None
    #: A window in the file switches sliding layers on at this fixed width whatever the file
    #: says, and the global layers lose RoPE (llama.cpp's smallthinker.cpp: 4096, with
    #: n_no_rope_layer_step 4 on the dense-first pattern).
    gguf_fixed_window: int = 0
    #: GGUF layer tensor names (after ``blk.N.``) that are another canonical tensor in this
    #: family's files (GLM-4.5's FFN norm is ``post_attention_norm``).
    gguf_layer_names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.config) - set(CONFIG_DEFAULTS)
        if unknown:
            raise UnsupportedError(f"family {self.name}: no config fields {sorted(unknown)}")

    def __getattr__(self, name: str) -> Any:
        """A config field: the family's value, else the config's default."""
        if name in CONFIG_DEFAULTS:
            return self.config.get(name, CONFIG_DEFAULTS[name])
        raise AttributeError(f"'Family' object has no attribute {name!r}")

    def biases(self) -> tuple[str, ...]:
        """Canonical names of the bias vectors the family's models carry (a layer's without
        ``blk.N.``), from the engine's tensor list of its config."""
        sizes = {k: v for k, v in _REQUIRED.items() if k not in ("arch", "rope_style")}
        if self.moe:  # one expert, so that the experts' tensors are listed
            sizes.update(n_expert=1, n_expert_used=1)
        c = family_config(self, **{**sizes, "activation": self.activation})
        names = [t[0] for t in c.global_tensors() + c.layer_tensors()]
        return tuple(n for n in names if n.endswith(".bias"))


def family_config(f: Family, **values: Any) -> ModelConfig:
    """The config of a model of family ``f``: the family's own values (``f.config``, its
    name and RoPE pairing) with ``values`` (what the file says) over them; not yet validated."""
    return ModelConfig(**{**f.config, "arch": f.name, "rope_style": f.rope_style, **values})


#: Values for the config fields without a default (a placeholder config's): every size 1
#: but a head's (2: RoPE turns pairs), no name, SiLU.
_REQUIRED: dict[str, Any] = {
    **dict.fromkeys(("n_layers", "dim", "ffn_dim", "n_heads", "n_kv_heads"), 1),
    **dict.fromkeys(("vocab_size", "max_context"), 1),
    **dict.fromkeys(("rms_eps", "rope_theta"), 1.0),
    "head_dim": 2,
    "arch": "",
    "rope_style": "norm",
    "activation": "silu",
}
#: The config fields a family may fix, with their defaults as the engine declares them (the
#: activation's: SiLU).
CONFIG_DEFAULTS: dict[str, Any] = {
    k: v
    for k, v in ModelConfig(**_REQUIRED).to_dict().items()
    if k not in _REQUIRED or k == "activation"
}

#: Llama's HF names of the tensors outside the layers -> canonical names.
LLAMA_HF_GLOBALS: dict[str, str] = {
    "model.embed_tokens.weight": "token_embd",
    "lm_head.weight": "output",
    "model.norm.weight": "output_norm",
}

#: Llama's HF parameter names (after ``model.layers.N.``) -> canonical suffixes.
LLAMA_HF_LAYER_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_output",
    "mlp.gate_proj.weight": "ffn_gate",
    "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down",
}

#: Gemma's HF norm names (after ``model.layers.N.``) -> llama.cpp's.
_GEMMA_NAMES: dict[str, str] = {
    "post_attention_layernorm.weight": "post_attention_norm",
    "pre_feedforward_layernorm.weight": "ffn_norm",
    "post_feedforward_layernorm.weight": "post_ffw_norm",
}
_GEMMA: dict[str, Any] = dict(window=True, hf_norm_offset=1.0, scale_embeddings=True)
_OPT_NAMES: dict[str, str] = {
    "self_attn_layer_norm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.out_proj.weight": "attn_output",
    "final_layer_norm.weight": "ffn_norm",
    "fc1.weight": "ffn_up",
    "fc2.weight": "ffn_down",
}
_FALCON_NAMES: dict[str, str] = {
    "input_layernorm.weight": "attn_norm",
    "self_attention.query_key_value.weight": "attn_qkv",
    "self_attention.dense.weight": "attn_output",
    "mlp.dense_h_to_4h.weight": "ffn_up",
    "mlp.dense_4h_to_h.weight": "ffn_down",
}

# transformers 4.57's config-class defaults (models/<family>/configuration_<family>.py, __init__)
# of the keys the HF loader reads; a saved config.json carries them all, so they matter only for
# hand-written files. Token ids included: the generation config falls back to them.
_LLAMA_HF: dict[str, object] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "head_dim": None,  # hidden_size // num_attention_heads
    "num_key_value_heads": None,  # num_attention_heads
    "tie_word_embeddings": False,
    "max_position_embeddings": 2048,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# MistralConfig: 8 KV heads, a 4096 window and 131072 positions by default.
_MISTRAL_HF = {**_LLAMA_HF, "num_key_value_heads": 8, "sliding_window": 4096}
_MISTRAL_HF["max_position_embeddings"] = 4096 * 32
# Qwen2Config / Qwen3Config: 32 KV heads, 32768 positions, no token ids; Qwen3 head_dim 128.
_QWEN_HF = {**_LLAMA_HF, "num_key_value_heads": 32, "max_position_embeddings": 32768}
_QWEN_HF.update(bos_token_id=None, eos_token_id=None)
del _QWEN_HF["head_dim"]  # Qwen2Config has none (the modeling code's hidden // heads)
# Phi3Config: eps 1e-5, 4096 positions, eos 32000, no window.
_PHI3_HF = {**_LLAMA_HF, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}
_PHI3_HF.update(eos_token_id=32000, sliding_window=None, partial_rotary_factor=1.0)
del _PHI3_HF["head_dim"]
# Gemma2Config / Gemma3TextConfig: the activation is read from hidden_activation only (their
# modeling code never looks at hidden_act), head_dim 256, 4 KV heads, tied head, window 4096,
# query_pre_attn_scalar 256, bos 2 / eos 1; Gemma 2 soft-caps 50 / 30 and 8192 positions,
# Gemma 3 none, 131072 positions, RoPE base 1e6 (10000 on sliding layers), every 6th layer
# global (its sliding_window_pattern kwarg).
_GEMMA_HF: dict[str, object] = {
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "head_dim": 256,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
    "sliding_window": 4096,
    "query_pre_attn_scalar": 256,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
_GEMMA2_HF = {**_GEMMA_HF, "max_position_embeddings": 8192}
_GEMMA2_HF.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
_GEMMA3_HF = {**_GEMMA_HF, "max_position_embeddings": 131072, "rope_theta": 1e6}
_GEMMA3_HF.update(rope_local_base_freq=10000.0, sliding_window_pattern=6)
_GEMMA3_HF.update(attn_logit_softcapping=None, final_logit_softcapping=None)
# OPTConfig: ReLU in activation_function, ffn_dim 3072, biases, pre-norm, tied head, 2048
# positions, bos = eos = 2; no key for the norm's eps (nn.LayerNorm's 1e-5, LAYER_NORM_EPS).
_OPT_HF: dict[str, object] = {
    "activation_function": "relu",
    "ffn_dim": 3072,
    "enable_bias": True,
    "do_layer_norm_before": True,
    "word_embed_proj_dim": None,  # hidden_size
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
    "bos_token_id": 2,
    "eos_token_id": 2,
}
# FalconConfig: exact (erf) GELU in activation, eps 1e-5 in layer_norm_epsilon, multi-query,
# parallel attention, no biases or alibi, ffn_hidden_size None (4 x hidden), RoPE 10000, tied
# head (PretrainedConfig's default), 2048 positions, bos = eos = 11.
_FALCON_HF: dict[str, object] = {
    "activation": "gelu",
    "layer_norm_epsilon": 1e-5,
    "rope_theta": 10000.0,
    "multi_query": True,
    "num_kv_heads": None,
    "new_decoder_architecture": False,
    "parallel_attn": True,
    "alibi": False,
    "bias": False,
    "ffn_hidden_size": None,
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
    "bos_token_id": 11,
    "eos_token_id": 11,
}
#: nn.LayerNorm's epsilon, which OPT's checkpoints keep (their config has no key for it).
LAYER_NORM_EPS = 1e-5

FAMILIES: tuple[Family, ...] = (
    # Mistral converts to llama.cpp's "llama" arch; its window comes from config.json, or in
    # GGUF from a llama.attention.sliding_window key (which llama.cpp itself ignores).
    Family(
        "llama",
        "llama",
        "norm",
        ("llama",),
        ("LlamaForCausalLM",),
        window=True,
        hf_defaults=_LLAMA_HF,
    ),
    Family(
        "mistral",
        "llama",
        "norm",
        ("mistral",),
        ("MistralForCausalLM",),
        window=True,
        hf_defaults=_MISTRAL_HF,
    ),
    # PowerInfer's Bamboo: Mistral's layer with ReLU on both gate and up (its GGUF arch and
    # config.json model_type are "bamboo"; converted like llama, q/k rows permuted).
    Family(
        "bamboo",
        "bamboo",
        "norm",
        ("bamboo",),
        ("BambooForCausalLM",),
        window=True,
        config=dict(activation="relu", up_act=True),
        # Not in transformers (its repository's own code): llama's keys, ReLU.
        hf_defaults={**_LLAMA_HF, "hidden_act": "relu"},
    ),
    Family(
        "qwen2",
        "qwen2",
        "neox",
        ("qwen2",),
        ("Qwen2ForCausalLM",),
        config=dict(qkv_bias=True),
        hf_layer_names={f"self_attn.{x}_proj.bias": f"attn_{x}.bias" for x in ("q", "k", "v")},
        hf_defaults=_QWEN_HF,
    ),
    Family(
        "qwen3",
        "qwen3",
        "neox",
        ("qwen3",),
        ("Qwen3ForCausalLM",),
        config=dict(qk_norm=True),
        hf_layer_names={
            "self_attn.q_norm.weight": "attn_q_norm",
            "self_attn.k_norm.weight": "attn_k_norm",
        },
        hf_defaults={**_QWEN_HF, "head_dim": 128},
    ),
    Family(
        "phi3",
        "phi3",
        "neox",
        ("phi3",),
        ("Phi3ForCausalLM",),
        # HF's Phi-3 attends through its sliding_window (2047 for mini-4k); llama.cpp turns
        # the window off for phi3, so the two differ past it. We follow HF's definition.
        window=True,
        fused_qkv=True,
        fused_gate_up=True,
        hf_layer_names={
            "self_attn.qkv_proj.weight": "attn_qkv",
            "mlp.gate_up_proj.weight": "ffn_up",
        },
        hf_defaults=_PHI3_HF,
    ),
    Family(
        "gemma2",
        "gemma2",
        "neox",
        ("gemma2",),
        ("Gemma2ForCausalLM",),
        config=dict(swa_pattern=2, activation="gelu", post_norms=True),
        hf_layer_names=_GEMMA_NAMES,
        # llama.cpp models/gemma2.cpp: GeGLU with tanh GELU, a 4096 window unless the file
        # says, both soft-caps always on (50 and 30 unless the file says), the sliding layers'
        # base from rope.freq_base_swa (else the global one), the head always token_embd.
        gguf_window=4096,
        gguf_softcaps=(50.0, 30.0),
        gguf_rope_base_swa=True,
        gguf_tied=True,
        hf_defaults=_GEMMA2_HF,
        hf_act_key="hidden_activation",
        **_GEMMA,
    ),
    Family(
        "gemma3",
        "gemma3",
        "neox",
        ("gemma3_text",),
        ("Gemma3ForCausalLM",),
        config=dict(
            qk_norm=True,
            swa_pattern=6,
            rope_theta_local=10000.0,
            activation="gelu",
            post_norms=True,
        ),
        hf_layer_names={
            **_GEMMA_NAMES,
            "self_attn.q_norm.weight": "attn_q_norm",
            "self_attn.k_norm.weight": "attn_k_norm",
        },
        # llama.cpp models/gemma3.cpp: GeGLU with tanh GELU, a window only when the file has
        # one, no attention soft-cap, a final one only when the file has it, the sliding
        # layers' base from rope.freq_base_swa, else 10000.
        gguf_softcaps=(None, 0.0),
        gguf_rope_base_swa=True,
        hf_defaults=_GEMMA3_HF,
        hf_act_key="hidden_activation",
        **_GEMMA,
    ),
    # OPT as PowerInfer serves it (its GGUF arch "opt": learned positions read at pos + 2, the
    # output head tied to the embeddings, ReLU fc1/fc2 with biases, LayerNorm).
    Family(
        "opt",
        "opt",
        "neox",
        ("opt",),
        ("OPTForCausalLM",),
        config=dict(
            qkv_bias=True,
            activation="relu",
            layer_norm=True,
            learned_pos=True,
            pos_offset=2,
            no_gate=True,
            ffn_bias=True,
            out_bias=True,
        ),
        hf_layer_names=_OPT_NAMES,
        hf_globals={
            "model.decoder.embed_tokens.weight": "token_embd",
            "model.decoder.embed_positions.weight": "position_embd",
            "model.decoder.final_layer_norm.weight": "output_norm",
            "lm_head.weight": "output",
        },
        hf_layer_prefix="model.decoder.layers.",
        hf_own_names=True,
        hf_defaults=_OPT_HF,
        hf_act_key="activation_function",
        hf_eps_key="",
    ),
    # Falcon (7B's layout: one norm for the parallel attention and MLP, multi-query attention,
    # fused q/k/v stored [q; k; v]); llama.cpp's "falcon" arch (models/falcon.cpp: ungated
    # tanh GELU; HF's FalconMLP uses the exact erf GELU, so the two differ by design).
    Family(
        "falcon",
        "falcon",
        "neox",
        ("falcon",),
        ("FalconForCausalLM",),
        fused_qkv=True,
        config=dict(activation="gelu", layer_norm=True, no_gate=True, parallel=True),
        hf_layer_names=_FALCON_NAMES,
        hf_globals={
            "transformer.word_embeddings.weight": "token_embd",
            "transformer.ln_f.weight": "output_norm",
            "lm_head.weight": "output",
        },
        hf_layer_prefix="transformer.h.",
        hf_own_names=True,
        hf_defaults=_FALCON_HF,
        hf_act_key="activation",
        hf_eps_key="layer_norm_epsilon",
    ),
)

# transformers 4.57's MoE config classes (their __init__ defaults of the keys the loader reads).
_MOE_QWEN_KEYS = dict(decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False)
_QWEN3MOE_HF = {**_QWEN_HF, "num_key_value_heads": 4, **_MOE_QWEN_KEYS}
_QWEN3MOE_HF.update(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
_QWEN2MOE_HF = {**_QWEN_HF, "num_key_value_heads": 16, **_MOE_QWEN_KEYS}
_QWEN2MOE_HF.update(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408)
_QWEN2MOE_HF["shared_expert_intermediate_size"] = 5632
_OLMOE_HF = {**_LLAMA_HF, "rms_norm_eps": 1e-5, "num_key_value_heads": None}
_OLMOE_HF.update(max_position_embeddings=4096, bos_token_id=None, eos_token_id=50279)
_OLMOE_HF.update(num_experts=64, num_experts_per_tok=8, norm_topk_prob=False, clip_qkv=None)
del _OLMOE_HF["head_dim"]  # OlmoeConfig has none (hidden // heads)
_MIXTRAL_HF = {**_LLAMA_HF, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "num_key_value_heads": 8}
_MIXTRAL_HF.update(max_position_embeddings=4096 * 32, sliding_window=None)
_MIXTRAL_HF.update(num_local_experts=8, num_experts_per_tok=2)
# Glm4MoeConfig: GLM-4.5-Air's sizes; sigmoid routing with a correction bias, renormalised,
# one shared expert, the first layer dense, half of each head rotating, no q/k/v bias.
_GLM4MOE_HF = {**_LLAMA_HF, "rms_norm_eps": 1e-5, "num_key_value_heads": 8}
_GLM4MOE_HF.update(max_position_embeddings=131072, partial_rotary_factor=0.5)
_GLM4MOE_HF.update(bos_token_id=None, eos_token_id=None, attention_bias=False)
_GLM4MOE_HF.update(n_routed_experts=128, num_experts_per_tok=8, moe_intermediate_size=1408)
_GLM4MOE_HF.update(n_shared_experts=1, routed_scaling_factor=1.0, n_group=1, topk_group=1)
_GLM4MOE_HF.update(first_k_dense_replace=1, norm_topk_prob=True, use_qk_norm=False)
del _GLM4MOE_HF["head_dim"]  # Glm4MoeConfig has none (the modeling code's hidden // heads)
#: Qwen's and OLMoE's expert parameters (Mixtral's are w1, w3, w2).
_EXPERTS = ("mlp.experts.", {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"})
_QK_NORMS = {"self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm"}
#: The router's parameter in Qwen's and OLMoE's checkpoints.
_ROUTER = {"mlp.gate.weight": "ffn_gate_inp"}
#: What the Qwen and OLMoE mixtures of experts share: the experts' parameters (:data:`_EXPERTS`).
_QWEN_STYLE_MOE: dict[str, Any] = dict(moe=True, hf_experts=_EXPERTS)
#: Qwen3-MoE's and OLMoE's checkpoints: those and the router and q/k norms' parameters.
_QK_NORM_MOE: dict[str, Any] = dict(hf_layer_names={**_ROUTER, **_QK_NORMS}, **_QWEN_STYLE_MOE)

# Mixture-of-experts families (llama.cpp's graphs, src/models/<arch>.cpp; its build_moe_ffn):
# softmax routers, SiLU experts. Qwen3-MoE and Mixtral renormalise the top-k weights, Qwen2-MoE
# and OLMoE do not; Qwen2-MoE adds a shared expert scaled by a sigmoid gate and q/k/v biases;
# OLMoE RMS-norms q and k whole (weights of q_dim / kv_dim). Mixtral is llama's arch with
# experts (its file has expert_count); the GGUF loader reads it as the "llama" family and takes
# the expert settings of the "mixtral" entry.
#: transformers' GptOssConfig defaults (4.55) of the keys the loader reads.
_GPTOSS_HF: dict[str, object] = {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "rope_theta": 150000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "attention_bias": True,
    "num_experts_per_tok": 4,
}
MOE_FAMILIES: tuple[Family, ...] = (
    Family(
        "qwen3moe",
        "qwen3moe",
        "neox",
        ("qwen3_moe",),
        ("Qwen3MoeForCausalLM",),
        config=dict(qk_norm=True, expert_norm_weights=True),
        hf_defaults=_QWEN3MOE_HF,
        **_QK_NORM_MOE,
    ),
    Family(
        "qwen2moe",
        "qwen2moe",
        "neox",
        ("qwen2_moe",),
        ("Qwen2MoeForCausalLM",),
        config=dict(qkv_bias=True, shared_expert_gate=True),
        hf_layer_names={
            **_ROUTER,
            "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp",
            "mlp.shared_expert.up_proj.weight": "ffn_up_shexp",
            "mlp.shared_expert.down_proj.weight": "ffn_down_shexp",
            "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp",
            **{f"self_attn.{x}_proj.bias": f"attn_{x}.bias" for x in ("q", "k", "v")},
        },
        hf_defaults=_QWEN2MOE_HF,
        **_QWEN_STYLE_MOE,
    ),
    Family(
        "olmoe",
        "olmoe",
        "neox",
        ("olmoe",),
        ("OlmoeForCausalLM",),
        config=dict(qk_norm=True, qk_norm_full=True),
        hf_defaults=_OLMOE_HF,
        **_QK_NORM_MOE,
    ),
    # PowerInfer's SmallThinker (llama.cpp's smallthinker.cpp): ReGLU experts, renormalised,
    # the router on the layer input before attention, softmax or sigmoid as the file says
    # (expert_gating_func); with a window in the file every fourth layer from layer 0 is global
    # and without RoPE, the others slide over 4096 positions.
    Family(
        "smallthinker",
        "smallthinker",
        "neox",
        ("smallthinker",),
        ("SmallThinkerForCausalLM",),
        config=dict(
            activation="relu",
            expert_norm_weights=True,
            router_on_residual=True,
            swa_pattern=4,
            swa_dense_first=True,
        ),
        window=True,
        gguf_fixed_window=4096,
        hf_defaults=_LLAMA_HF,
        moe=True,
    ),
    # GLM-4.5/4.6/4.7 (llama.cpp's glm4-moe.cpp): sigmoid routing whose top-k is chosen with
    # a correction bias (exp_probs_b) and weighted without it, renormalised and scaled as the
    # file says, shared experts without a gate, the first leading_dense_block_count layers
    # dense, q/k/v biases, q/k norms where the file has them, NeoX RoPE over
    # rope.dimension_count values, and NextN layers past the decoder (loaded, never run).
    Family(
        "glm4moe",
        "glm4moe",
        "neox",
        ("glm4_moe",),
        ("Glm4MoeForCausalLM",),
        config=dict(qkv_bias=True, expert_gating="sigmoid", expert_score_bias=True),
        hf_layer_names={
            **_ROUTER,
            **_QK_NORMS,
            "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
            "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp",
            "mlp.shared_experts.up_proj.weight": "ffn_up_shexp",
            "mlp.shared_experts.down_proj.weight": "ffn_down_shexp",
            **{f"self_attn.{x}_proj.bias": f"attn_{x}.bias" for x in ("q", "k", "v")},
            # A NextN/MTP layer's own parameters (that layer is left out at load).
            "eh_proj.weight": "nextn.eh_proj",
            "enorm.weight": "nextn.enorm",
            "hnorm.weight": "nextn.hnorm",
            "shared_head.norm.weight": "nextn.shared_head_norm",
        },
        hf_defaults=_GLM4MOE_HF,
        gguf_layer_names={"post_attention_norm": "ffn_norm"},
        **_QWEN_STYLE_MOE,
    ),
    # gpt-oss (llama.cpp's openai-moe.cpp, arch "gpt-oss"): q/k/v and output biases, a sink
    # logit per head (attn_sinks) in every softmax, even layers sliding (load_swa_pattern's
    # default 2: layer i slides where i % 2 == 0) over attention.sliding_window, the
    # post-attention norm as the FFN norm, the router's top-k of its biased logits weighted by
    # the softmax over the k (SOFTMAX_WEIGHT), biased experts with the clamped SwiGLU
    # (swiglu_oai: alpha 1.702, limit 7.0, both fixed in llama.cpp's graph), NeoX RoPE with
    # YaRN from the rope.scaling keys.
    Family(
        "gpt-oss",
        "gpt-oss",
        "neox",
        ("gpt_oss",),
        ("GptOssForCausalLM",),
        config=dict(
            qkv_bias=True,
            out_bias=True,
            attn_sinks=True,
            swa_pattern=2,
            expert_gating="softmax_weight",
            expert_bias=True,
            swiglu_limit=7.0,
        ),
        window=True,
        gguf_layer_names={"post_attention_norm": "ffn_norm"},
        hf_layer_names={
            "self_attn.sinks": "attn_sinks",
            "mlp.router.weight": "ffn_gate_inp",
        },
        hf_defaults=_GPTOSS_HF,
        moe=True,
        # The experts are fused tensors, not one per expert: loading/hf_gptoss.py reads them.
        hf_experts=("mlp.experts.", {}),
    ),
    # DeepSeek-V2/V3 (llama.cpp's deepseek2.cpp): multi-head latent attention (the converter
    # splits kv_b_proj into attn_k_b, transposed, and attn_v_b, and writes key_length as the
    # latent row kv_lora_rank + rope dims with one KV head), adjacent-pair RoPE over the rope
    # dims, softmax (V2) or sigmoid with the correction bias (V3) routing, renormalised and
    # scaled as the file says, expert groups, shared experts without a gate, the first
    # leading_dense_block_count layers dense.
    Family(
        "deepseek2",
        "deepseek2",
        "norm",
        ("deepseek_v2", "deepseek_v3"),
        ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
        # V3's correction bias; the loaders turn it off where the file has none (V2).
        config=dict(expert_score_bias=True),
        hf_layer_names={
            **_ROUTER,
            "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
            "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp",
            "mlp.shared_experts.up_proj.weight": "ffn_up_shexp",
            "mlp.shared_experts.down_proj.weight": "ffn_down_shexp",
            "self_attn.q_proj.weight": "attn_q",
            "self_attn.q_a_proj.weight": "attn_q_a",
            "self_attn.q_a_layernorm.weight": "attn_q_a_norm",
            "self_attn.q_b_proj.weight": "attn_q_b",
            "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa",
            "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm",
            "self_attn.kv_b_proj.weight": "attn_kv_b",
        },
        **_QWEN_STYLE_MOE,
    ),
    Family(
        "mixtral",
        "llama",
        "norm",
        ("mixtral",),
        ("MixtralForCausalLM",),
        config=dict(expert_norm_weights=True),
        window=True,
        hf_layer_names={"block_sparse_moe.gate.weight": "ffn_gate_inp"},
        hf_defaults=_MIXTRAL_HF,
        moe=True,
        hf_experts=("block_sparse_moe.experts.", {"w1": "gate", "w3": "up", "w2": "down"}),
    ),
)
FAMILIES = FAMILIES + MOE_FAMILIES

#: ``general.architecture`` values the GGUF loader reads (the first family of each wins).
GGUF_FAMILIES: dict[str, Family] = {}
for _f in FAMILIES:
    GGUF_FAMILIES.setdefault(_f.gguf_arch, _f)


def family_named(name: str) -> Family:
    """The family called ``name``; :class:`UnsupportedError` for an unknown one."""
    for f in FAMILIES:
        if f.name == name:
            return f
    raise UnsupportedError(
        f"model family {name!r} (supported: {', '.join(f.name for f in FAMILIES)})"
    )


def hf_family(model_type: object, archs: list[object]) -> Family | None:
    """The family of a ``config.json`` (its ``model_type`` or ``architectures``), or None."""
    for f in FAMILIES:
        if model_type in f.hf_types or any(a in f.hf_archs for a in archs):
            return f
    return None


def hf_layer_names(f: Family) -> dict[str, str]:
    """HF parameter names after the layer prefix -> canonical suffixes for family ``f``."""
    if f.hf_own_names:
        return dict(f.hf_layer_names)
    return {**LLAMA_HF_LAYER_NAMES, **f.hf_layer_names}


def nextn_layer(name: str, cfg: ModelConfig) -> bool:
    """Whether tensor ``name`` belongs to a block past the decoder's ``cfg.n_layers`` (GLM's
    NextN/MTP layers, which llama.cpp loads and skips): the loaders leave those out."""
    if not name.startswith("blk."):
        return False
    layer = name.split(".", 2)[1]
    return layer.isdigit() and int(layer) >= cfg.n_layers


def _rows(t: TensorData, name: str, start: int, stop: int) -> TensorData:
    """Rows ``start..stop`` of ``t`` as a zero-copy view named ``name``."""
    rb = t.row_bytes
    return TensorData(name, t.dtype, stop - start, t.cols, t.data[start * rb : stop * rb])


def split_fused(
    f: Family, tensors: dict[str, TensorData], q_dim: int, kv_dim: int, ffn: int
) -> None:
    """Split family ``f``'s fused tensors in place into the canonical ones (row views, no
    copies): ``attn_qkv`` -> ``attn_q``, ``attn_k``, ``attn_v``; a fused ``ffn_up`` of
    ``2 * ffn`` rows -> ``ffn_gate`` (first half) and ``ffn_up`` (second half), as Phi-3's
    ``gate_up_proj`` and llama.cpp's SwiGLU split take them."""
    if not (f.fused_qkv or f.fused_gate_up):
        return
    # Over the tensors the file has, not over its block count, which is checked against the
    # tensors only after this split.
    for name in [n for n in tensors if n.startswith("blk.")]:
        p = name[: name.rindex(".") + 1]
        if f.fused_qkv and name.endswith(".attn_qkv"):
            t = tensors.pop(name)
            if t.rows != q_dim + 2 * kv_dim:
                raise ShapeError(
                    f"tensor {name} has {t.rows} rows, the config implies {q_dim + 2 * kv_dim}"
                )
            tensors[p + "attn_q"] = _rows(t, p + "attn_q", 0, q_dim)
            tensors[p + "attn_k"] = _rows(t, p + "attn_k", q_dim, q_dim + kv_dim)
            tensors[p + "attn_v"] = _rows(t, p + "attn_v", q_dim + kv_dim, t.rows)
        elif f.fused_gate_up and name.endswith(".ffn_up") and p + "ffn_gate" not in tensors:
            up = tensors[name]
            if up.rows != 2 * ffn:
                raise ShapeError(
                    f"tensor {name} (gate and up fused) has {up.rows} rows, the config "
                    f"implies {2 * ffn}"
                )
            tensors[p + "ffn_gate"] = _rows(up, p + "ffn_gate", 0, ffn)
            tensors[p + "ffn_up"] = _rows(up, p + "ffn_up", ffn, 2 * ffn)
