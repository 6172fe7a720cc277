"""Synthetic gpt-oss models (llama.cpp's arch ``gpt-oss``, transformers' ``gpt_oss``), written
as llama.cpp's converter (conversion/gpt_oss.py GptOssModel on TextModel) writes a GGUF: its
keys, tensor names and dtypes, and nothing of ours.

Keys: TextModel's (block_count, context_length, embedding_length, feed_forward_length =
intermediate_size, head counts, YaRN's rope.scaling.{type, factor, original_context_length,
yarn_beta_fast, yarn_beta_slow} from rope_scaling, rope.freq_base, the RMS epsilon,
expert_count / expert_used_count, key_length / value_length from head_dim), then
GptOssModel's attention.sliding_window and expert_feed_forward_length; the GPT-2 style
tokenizer and ``tokenizer.chat_template`` where one is given.

Tensors per layer: ``attn_norm``, ``attn_{q,k,v,output}`` with their biases, ``attn_sinks``
(n_heads), ``post_attention_norm`` (the FFN norm), the router ``ffn_gate_inp`` with its bias,
the merged experts ``ffn_{gate,up,down}_exps`` ({cols, rows, n_expert}) with their 2-D biases
({width, n_expert}). Dtypes as the converter writes them: norms, biases, sinks and the router
F32 always; the experts MXFP4 from an MXFP4 checkpoint (``expert_dtype="MXFP4"``, the repacked
blocks: ggml's MXFP4 layout, encoded here by our own quantizer) or the output type where the
checkpoint stores them dequantised (``expert_dtype=None``); the other matrices in ``dtype`` (the
converter's ``--outtype``: "BF16" for the bf16 checkpoint's auto, "F16", or "F32" for the tight
numeric check).

Weights (``default_rng([seed, crc32(name)])`` per tensor): projections ~ N(0, 1/fan_in), the
experts' gate and up times ``expert_gain`` (3 by default, so that some gate and up values pass
the SwiGLU's clamp of 7), the output projections times ``1/sqrt(2 layers)``; biases ~
N(0, 0.3²); sinks ~ N(0, 1); norms ~ 1 + N(0, 0.05²); embeddings ~ N(0, 1). Everything a figure
measures on these models is "synthetic".
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..errors import ShapeError, UnsupportedError
from .synth import add_tokenizer
from .synth_model import f32_to_bf16_bits
from .synth_types import encode
from .synth_vocab import BOS_ID, EOS_ID

#: The dtypes the converter's --outtype gives the non-expert matrices of these files.
OUT_TYPES = ("F32", "F16", "BF16")
#: general.file_type of each (llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32).
FILE_TYPE = {"F32": 0, "F16": 1, "BF16": 32}


@dataclass
class GptOssSpec:
    """Shape of a synthetic gpt-oss model (the real 20b: dim 2880, 24 layers, 64 heads of 64,
    8 KV heads, 32 experts of 2880, top-4, window 128, YaRN 32 over 4096, base 150000)."""

    dim: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 320
    experts: int = 4
    experts_used: int = 2
    expert_ffn: int = 64
    sliding_window: int = 16
    rope_theta: float = 150000.0
    rope_factor: float = 4.0
    rope_original_context: int = 64
    rms_eps: float = 1e-5
    seed: int = 0
    expert_gain: float = 3.0

    @property
    def max_context(self) -> int:
        """max_position_embeddings: YaRN's reach (the real config's 131072 = 32 x 4096)."""
        return int(self.rope_factor * self.rope_original_context)

    def validate(self) -> None:
        if not 0 < self.experts_used <= self.experts:
            raise ShapeError("need 0 < experts_used <= experts")
        if self.dim % 32 or self.expert_ffn % 32:
            raise ShapeError("MXFP4 experts need dim and expert_ffn multiples of 32")
        if self.heads % self.kv_heads or self.head_dim % 2:
            raise ShapeError("heads must be a multiple of kv_heads, head_dim even")

    def draw(self, name: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
        """Tensor ``name``'s values (float32) of ``shape``: ``kind`` "proj" (N(0, 1/fan_in)),
        "bias", "sink", "norm" or "embd" (module docs)."""
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if kind == "proj":
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif kind == "bias":
            x = 0.3 * rng.standard_normal(shape)
        elif kind == "norm":
            x = 1.0 + 0.05 * rng.standard_normal(shape)
        else:  # sink, embd
            x = rng.standard_normal(shape)
        return x.astype(np.float32)

    def weights(self) -> dict[str, np.ndarray]:
        """Every tensor, GGUF names without ``.weight`` (biases keep ``.bias``), llama.cpp's
        shapes (experts ``(n_expert, rows, cols)``, their biases ``(n_expert, width)``)."""
        d, hd, e, ef = self.dim, self.head_dim, self.experts, self.expert_ffn
        q, kv = self.heads * hd, self.kv_heads * hd
        out_scale = 1.0 / np.sqrt(2 * self.layers)
        w: dict[str, np.ndarray] = {"token_embd": self.draw("token_embd", (self.vocab, d), "embd")}
        for i in range(self.layers):
            p = f"blk.{i}."
            w[p + "attn_norm"] = self.draw(p + "attn_norm", (d,), "norm")
            for x, rows in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"attn_{x}"] = self.draw(p + f"attn_{x}", (rows, d), "proj")
                w[p + f"attn_{x}.bias"] = self.draw(p + f"attn_{x}.bias", (rows,), "bias")
            w[p + "attn_output"] = out_scale * self.draw(p + "attn_output", (d, q), "proj")
            w[p + "attn_output.bias"] = self.draw(p + "attn_output.bias", (d,), "bias")
            w[p + "attn_sinks"] = self.draw(p + "attn_sinks", (self.heads,), "sink")
            w[p + "post_attention_norm"] = self.draw(p + "post_attention_norm", (d,), "norm")
            w[p + "ffn_gate_inp"] = self.draw(p + "ffn_gate_inp", (e, d), "proj")
            w[p + "ffn_gate_inp.bias"] = self.draw(p + "ffn_gate_inp.bias", (e,), "bias")
            for x, rows, cols, gain in (
                ("gate", ef, d, self.expert_gain),
                ("up", ef, d, self.expert_gain),
                ("down", d, ef, out_scale),
            ):
                n = p + f"ffn_{x}_exps"
                w[n] = gain * self.draw(n, (e, rows, cols), "proj")
                w[n + ".bias"] = self.draw(n + ".bias", (e, rows), "bias")
        w["output_norm"] = self.draw("output_norm", (d,), "norm")
        w["output"] = self.draw("output", (self.vocab, d), "proj")
        return w


def _add_keys(w, s: GptOssSpec, file_type: int, chat_template: str | None) -> None:
    """TextModel.set_gguf_parameters' keys for a gpt-oss config.json, then GptOssModel's."""
    import gguf

    w.add_name("synthetic gpt-oss")
    w.add_type("model")
    w.add_quantization_version(2)
    w.add_block_count(s.layers)
    w.add_context_length(s.max_context)
    w.add_embedding_length(s.dim)
    w.add_feed_forward_length(s.expert_ffn)  # intermediate_size
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(s.rope_factor)
    w.add_rope_scaling_orig_ctx_len(s.rope_original_context)
    w.add_rope_scaling_yarn_beta_fast(32.0)  # the real config's beta_fast / beta_slow
    w.add_rope_scaling_yarn_beta_slow(1.0)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_expert_count(s.experts)
    w.add_expert_used_count(s.experts_used)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_file_type(file_type)
    w.add_sliding_window(s.sliding_window)
    w.add_expert_feed_forward_length(s.expert_ffn)
    add_tokenizer(w, SimpleNamespace(vocab=s.vocab), "gpt-2")
    if chat_template is not None:
        w.add_chat_template(chat_template)


def _stored(name: str, x: np.ndarray, dtype: str, experts: str | None):
    """(array, raw dtype or None) of tensor ``name`` as the converter stores it."""
    import gguf

    if x.ndim == 1 or name.endswith(".bias") or name.endswith("_norm") or "ffn_gate_inp" in name:
        return np.ascontiguousarray(x, dtype=np.float32), None
    dt = experts if (experts and name.endswith("_exps")) else dtype
    if dt == "BF16":
        return f32_to_bf16_bits(x), gguf.GGMLQuantizationType.BF16
    if dt in ("F32", "F16"):
        return encode(x.reshape(-1, x.shape[-1]), dt).reshape(x.shape), None
    raw = encode(x.reshape(-1, x.shape[-1]), dt)
    return raw.reshape(*x.shape[:-1], -1), gguf.GGMLQuantizationType[dt]


def write_gptoss_gguf(
    out_path: str | os.PathLike[str],
    *,
    dtype: str = "BF16",
    expert_dtype: str | None = "MXFP4",
    chat_template: str | None = None,
    **shape,
) -> Path:
    """Write the synthetic gpt-oss model of ``shape`` (:class:`GptOssSpec` fields) as the
    converter would (module docs); returns ``out_path``."""
    import gguf

    if dtype not in OUT_TYPES or expert_dtype not in (None, "MXFP4"):
        raise UnsupportedError(f"gpt-oss files of {dtype} with {expert_dtype} experts")
    s = GptOssSpec(**shape)
    s.validate()
    out = Path(out_path)
    w = gguf.GGUFWriter(str(out), "gpt-oss")
    _add_keys(w, s, FILE_TYPE[dtype] if expert_dtype is None else 38, chat_template)
    for name, x in s.weights().items():
        arr, raw = _stored(name, x, dtype, expert_dtype)
        full = name if name.endswith(".bias") else name + ".weight"
        w.add_tensor(full, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# --------------------------------------------------------------------------- Hugging Face
def _hf_config(s: GptOssSpec, torch_dtype: str, mxfp4: bool) -> dict:
    """config.json with the keys openai/gpt-oss-20b's carries (its values scaled down)."""
    cfg = {
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": EOS_ID,
        "experts_per_token": s.experts_used,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "hidden_size": s.dim,
        "initial_context_length": s.rope_original_context,
        "initializer_range": 0.02,
        "intermediate_size": s.expert_ffn,
        "layer_types": [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(s.layers)
        ],
        "max_position_embeddings": s.max_context,
        "model_type": "gpt_oss",
        "num_attention_heads": s.heads,
        "num_experts_per_tok": s.experts_used,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": s.kv_heads,
        "num_local_experts": s.experts,
        "output_router_logits": False,
        "pad_token_id": BOS_ID,
        "rms_norm_eps": s.rms_eps,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": s.rope_factor,
            "original_max_position_embeddings": s.rope_original_context,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": s.rope_theta,
        "router_aux_loss_coef": 0.9,
        "sliding_window": s.sliding_window,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "transformers_version": "4.55.0.dev0",
        "use_cache": True,
        "vocab_size": s.vocab,
    }
    if mxfp4:
        keep = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens"]
        cfg["quantization_config"] = {
            "modules_to_not_convert": [*keep, "lm_head"],
            "quant_method": "mxfp4",
        }
    return cfg


#: Canonical layer names -> the checkpoint's (after ``model.layers.N.``), experts apart.
_HF_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "post_attention_norm": "post_attention_layernorm.weight",
    "attn_sinks": "self_attn.sinks",
    "ffn_gate_inp": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
    **{f"attn_{x}": f"self_attn.{x}_proj.weight" for x in "qkv"},
    **{f"attn_{x}.bias": f"self_attn.{x}_proj.bias" for x in "qkv"},
    "attn_output": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
}


def _interleave(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    """``a`` at the even and ``b`` at the odd indices of ``axis``."""
    out = np.stack([a, b], axis=axis + 1)
    shape = list(a.shape)
    shape[axis] *= 2
    return out.reshape(shape)


def _hf_experts(w: dict[str, np.ndarray], i: int, mxfp4: bool) -> dict[str, np.ndarray]:
    """Layer ``i``'s ``mlp.experts.*`` as the checkpoint stores them (module docs of
    loading/hf_gptoss.py): MXFP4 blocks and scales (uint8), or float arrays."""
    from ..loading.hf_gptoss import hf_mxfp4

    p, q = f"blk.{i}.", f"model.layers.{i}.mlp.experts."
    gate, up, down = (w[p + f"ffn_{x}_exps"] for x in ("gate", "up", "down"))
    out = {
        q + "gate_up_proj_bias": _interleave(
            w[p + "ffn_gate_exps.bias"], w[p + "ffn_up_exps.bias"], 1
        ),
        q + "down_proj_bias": w[p + "ffn_down_exps.bias"],
    }
    if not mxfp4:
        out[q + "gate_up_proj"] = _interleave(gate, up, 1).transpose(0, 2, 1)
        out[q + "down_proj"] = down.transpose(0, 2, 1)
        return out

    def blocks(x: np.ndarray) -> np.ndarray:
        raw = encode(x.reshape(-1, x.shape[-1]), "MXFP4")
        return raw.reshape(*x.shape[:-1], x.shape[-1] // 32, 17)

    gu, dn = hf_mxfp4(_interleave(blocks(gate), blocks(up), 1)), hf_mxfp4(blocks(down))
    out[q + "gate_up_proj_blocks"], out[q + "gate_up_proj_scales"] = gu
    out[q + "down_proj_blocks"], out[q + "down_proj_scales"] = dn
    return out


def write_gptoss_hf(
    out_dir: str | os.PathLike[str],
    *,
    dtype: str = "bf16",
    expert_dtype: str | None = "mxfp4",
    chat_template: str | None = None,
    **shape,
) -> Path:
    """Write the synthetic gpt-oss model of ``shape`` as a Hugging Face directory as
    openai/gpt-oss-20b ships (its config.json keys; the experts fused, MXFP4 blocks and
    scales with ``expert_dtype="mxfp4"``, else ``dtype`` floats; everything else ``dtype``:
    "bf16" or "f32"), the same values as :func:`write_gptoss_gguf` writes (the MXFP4 codes
    identical)."""
    import json

    from .synth import write_safetensors
    from .synth_vocab import SPECIAL_TOKENS, build_tokenizer

    if dtype not in ("bf16", "f32") or expert_dtype not in (None, "mxfp4"):
        raise UnsupportedError(f"gpt-oss checkpoints of {dtype} with {expert_dtype} experts")
    s = GptOssSpec(**shape)
    s.validate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch_dtype = {"bf16": "bfloat16", "f32": "float32"}[dtype]
    config = _hf_config(s, torch_dtype, expert_dtype is not None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(s.vocab).save(str(out / "tokenizer.json"))
    tok = {"bos_token": SPECIAL_TOKENS[BOS_ID], "eos_token": SPECIAL_TOKENS[EOS_ID]}
    tok.update(add_bos_token=False, model_max_length=s.max_context)
    if chat_template is not None:
        tok["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    w = s.weights()
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": w["token_embd"]}
    for i in range(s.layers):
        p = f"blk.{i}."
        tensors.update({f"model.layers.{i}.{v}": w[p + k] for k, v in _HF_NAMES.items()})
        tensors.update(_hf_experts(w, i, expert_dtype is not None))
    tensors["model.norm.weight"] = w["output_norm"]
    tensors["lm_head.weight"] = w["output"]
    st = "BF16" if dtype == "bf16" else "F32"

    def stored(a: np.ndarray) -> tuple[str, np.ndarray]:
        if a.dtype == np.uint8:
            return "U8", a
        return (st, f32_to_bf16_bits(a)) if st == "BF16" else (st, a.astype(np.float32))

    pairs = {n: stored(a) for n, a in tensors.items()}
    entries = [(n, dt, tuple(a.shape)) for n, (dt, a) in pairs.items()]
    write_safetensors(out / "model.safetensors", entries, (a for _, a in pairs.values()))
    return out
