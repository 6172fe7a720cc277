"""GLM-4.5/4.6/4.7 (llama.cpp's ``glm4moe``) on synthetic files written with exactly the keys,
tensor names and dtypes llama.cpp's converter (Glm4MoeModel) and transformers (Glm4MoeConfig)
write: sigmoid routing whose top-k is chosen with the correction bias and weighted without it,
renormalised and scaled by routed_scaling_factor; one shared expert without a gate; the first
layer dense; q/k/v biases, optional q/k norms; NeoX RoPE over half of each head; a NextN block
after the decoder that is loaded and never run. Against the float64 reference (tests/reference.py
``moe_ffn``, ``selection_scores``), batched and one token at a time, F32, F16 and K-quants;
against llama.cpp itself (llama-cpp-python) on the same files. The sparse modes, profiling and
the neuron store, over each layer's own neuron space: test_glm4moe_sparse.py; plans and the
hybrid: test_glm4moe_hybrid.py."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from llamacpp_check import compare_with_llama_cpp

from powerinfer_rs import Engine
from powerinfer_rs.errors import ShapeError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.gguf_file import GGUFFile
from powerinfer_rs.loading.gguf_loader import open_gguf

from _helpers import assert_batched_and_decoding_match, engine_greedy, llama_greedy, rel
from reference import exact_kv_engine, greedy_reference, reference_forward, reference_logits

#: A GLM-4.5-Air-like shape, scaled down: layer 0 dense (ffn 128), layers 1-2 with 8 experts
#: of 64 (top-2) and one shared expert of 64, routed_scaling_factor 2.5, half of each head
#: rotating, one NextN block (block_count 4).
GLM_ARGS = dict(
    arch="glm4moe",
    activation="silu",
    layers=3,
    experts=8,
    experts_used=2,
    expert_ffn=64,
    dense_lead=1,
    expert_scale=2.5,
    partial_rotary=0.5,
    nextn=1,
)
REF_RTOL = 1e-5
#: Glm4MoeModel.set_gguf_parameters' keys (TextModel's, then its own), nothing of ours.
GLM_KEYS = {
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "rope.freq_base",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "expert_used_count",
    "expert_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "leading_dense_block_count",
    "expert_gating_func",
    "expert_weights_scale",
    "expert_weights_norm",
    "nextn_predict_layers",
}


def ids_for(model, n: int = 12, seed: int = 5) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.config.vocab_size, n)]


def test_gguf_is_read_as_llama_cpp_reads_it(synth_gguf):
    path = synth_gguf(**GLM_ARGS)
    meta = open_gguf(path).metadata
    assert {k[len("glm4moe.") :] for k in meta if k.startswith("glm4moe.")} == GLM_KEYS
    assert not [k for k in meta if k.startswith("powerinfer_rs.")]
    names = {t.name for t in GGUFFile(path).tensors}
    assert "blk.0.post_attention_norm.weight" in names and "blk.3.nextn.eh_proj.weight" in names
    assert "blk.1.exp_probs_b.bias" in names and "blk.0.ffn_gate.weight" in names
    m = load_model(path)
    c = m.config
    assert (c.n_layers, c.dense_lead_layers, c.n_expert, c.n_expert_used) == (3, 1, 8, 2)
    assert (c.ffn_dim, c.expert_ffn_dim, c.shared_ffn_dim) == (128, 64, 64)
    assert (c.expert_gating, c.expert_score_bias, c.expert_norm_weights) == ("sigmoid", True, True)
    assert c.expert_weights_scale == pytest.approx(2.5)
    assert (c.qkv_bias, c.qk_norm, c.rotary_dims, c.head_dim) == (True, False, 8, 16)
    assert c.rope_style == "neox" and not c.shared_expert_gate
    # The NextN block is left out; the FFN norm is the canonical ffn_norm.
    assert not [n for n in m.tensors if n.startswith("blk.3.")]
    assert "blk.0.ffn_norm" in m.tensors and "blk.0.ffn_gate_inp" not in m.tensors
    assert m.tensors["blk.1.exp_probs_b.bias"].cols == 8


@pytest.mark.parametrize("qk_norm", [False, True])
def test_matches_the_reference_batched_and_decoding(synth_gguf, qk_norm):
    m = load_model(synth_gguf(**GLM_ARGS, use_qk_norm=qk_norm))
    assert m.config.qk_norm == qk_norm
    ids = ids_for(m)
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    assert engine_greedy(eng, ids[:6], 8) == greedy_reference(m, ids[:6], 8)


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_K_M", "Q6_K"])
def test_stored_formats_match_the_reference(synth_gguf, dtype):
    """F16 within 1e-3 of the float64 reference; quantized files against the reference of
    the same dequantised weights (the router and the correction bias stay F32)."""
    m = load_model(synth_gguf(dtype=dtype, **{**GLM_ARGS, "dim": 256, "expert_ffn": 256}))
    assert m.tensors["blk.1.ffn_gate_inp"].dtype == "F32"
    assert m.tensors["blk.1.exp_probs_b.bias"].dtype == "F32"
    ids = ids_for(m, n=8)
    ref = reference_logits(m, ids)
    got = Engine(m, threads=2).logits(ids)
    assert np.abs(got - ref).max() <= 1e-3 * max(1.0, np.abs(ref).max())


def _without(m, feature: str):
    """``m`` with one of GLM's features switched off (its tensors dropped where it has any)."""
    if feature == "expert_score_bias":
        m.config.expert_score_bias = False
        m.tensors = {k: v for k, v in m.tensors.items() if "exp_probs_b" not in k}
    elif feature == "expert_weights_scale":
        m.config.expert_weights_scale = 0.0
    elif feature == "shared_ffn_dim":
        m.config.shared_ffn_dim = 0
        m.tensors = {k: v for k, v in m.tensors.items() if "_shexp" not in k}
    m.fingerprint += f"-without-{feature}"
    return m


@pytest.mark.parametrize("feature", ["expert_score_bias", "expert_weights_scale", "shared_ffn_dim"])
def test_each_feature_changes_the_function(synth_gguf, feature):
    """The correction bias (which experts), the scale and the shared expert each change the
    logits, and the engine follows the reference without them too."""
    m = load_model(synth_gguf(**GLM_ARGS))
    ids = ids_for(m, n=8)
    ref = reference_logits(m, ids)
    off = _without(m, feature)
    ref_off = reference_logits(off, ids)
    assert rel(ref_off, ref) > 100 * REF_RTOL
    assert rel(exact_kv_engine(off, threads=2).logits(ids), ref_off) <= REF_RTOL


def test_the_bias_moves_tokens_to_other_experts(synth_gguf):
    """The correction bias changes which experts some tokens take (the reference's routes of
    the first routed layer, with the bias and without)."""

    def routes(m, ids):
        trace: list = []
        reference_forward(m, ids, moe_trace=trace)
        return [e for layer, _, e, _ in trace if layer == 1]

    ids = ids_for(load_model(synth_gguf(**GLM_ARGS)), n=12)
    biased = routes(load_model(synth_gguf(**GLM_ARGS)), ids)
    plain = routes(_without(load_model(synth_gguf(**GLM_ARGS)), "expert_score_bias"), ids)
    assert len(biased) == len(plain) == 2 * len(ids)
    assert biased != plain


def test_hf_checkpoint_is_the_gguf_model(synth_hf, synth_gguf):
    """The Hugging Face directory (one tensor per expert, the bias float32, the NextN layer
    as model.layers.3) is the model of its GGUF conversion."""
    d = synth_hf(dtype="f32", **GLM_ARGS)
    hf, gg = load_model(d), load_model(synth_gguf(**GLM_ARGS))
    for k in ("n_layers", "n_expert", "n_expert_used", "expert_ffn_dim", "shared_ffn_dim"):
        assert getattr(hf.config, k) == getattr(gg.config, k), k
    for k in ("dense_lead_layers", "expert_score_bias", "expert_norm_weights", "rotary_dims"):
        assert getattr(hf.config, k) == getattr(gg.config, k), k
    assert hf.config.expert_weights_scale == pytest.approx(gg.config.expert_weights_scale)
    assert (hf.config.qkv_bias, hf.config.qk_norm) == (True, False)
    assert not [n for n in hf.tensors if n.startswith("blk.3.")]
    ids = ids_for(hf)
    ref = reference_logits(gg, ids)
    assert rel(reference_logits(hf, ids), ref) <= 1e-9
    assert rel(exact_kv_engine(hf, threads=2).logits(ids), ref) <= REF_RTOL


def test_expert_groups_as_deepseek_v3_chooses_them(synth_hf, tmp_path):
    """n_group / topk_group (DeepSeek-V3's rule, which GLM's config carries at 1/1): only the
    best groups' experts are candidates; the engine follows the reference, and the groups
    change the function."""
    src = synth_hf(dtype="f32", **GLM_ARGS)
    d = tmp_path / "grouped"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(n_group=4, topk_group=1)
    (d / "config.json").write_text(json.dumps(cfg))
    grouped, plain = load_model(d), load_model(src)
    assert (grouped.config.expert_groups, grouped.config.expert_groups_used) == (4, 1)
    ids = ids_for(grouped, n=10)
    ref = reference_logits(grouped, ids)
    assert rel(ref, reference_logits(plain, ids)) > 100 * REF_RTOL
    eng = exact_kv_engine(grouped, threads=2)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    with pytest.raises(ShapeError, match="groups"):
        load_model_with(d, cfg, n_group=3)


def load_model_with(d, cfg: dict, **changes):
    (d / "config.json").write_text(json.dumps({**cfg, **changes}))
    return load_model(d)


@pytest.mark.parametrize("dtype", ["F32", "Q4_K_M"])
def test_logits_within_llama_cpps_distance_and_64_greedy_tokens(synth_gguf, dtype):
    """llama.cpp runs the same file: both sides' logits against the float64 reference (of the
    file's dequantised weights), largest relative error per position and mean KL, ours no
    further than llama.cpp's own distance (floored at f32 rounding); F32: 64 greedy tokens
    identical."""
    args = {**GLM_ARGS, "dim": 256, "expert_ffn": 256} if dtype != "F32" else GLM_ARGS
    path = synth_gguf(dtype=dtype, seed=11, **args)
    m = load_model(path)
    prompt = ids_for(m, n=12, seed=2)
    run = compare_with_llama_cpp(m, path, prompt, f"glm4moe {dtype}", n_ctx=96)
    run.assert_within_llama_cpp()
    if dtype == "F32":
        assert engine_greedy(run.eng, prompt, 64) == llama_greedy(run.llm, prompt, 64)


def test_chat_renders_through_glms_template_in_the_file(synth_hf, synth_gguf):
    """GLM's template (its [gMASK]<sop> prefix and turn markers, an assistant turn's
    <think></think> block, enable_thinking=false as /nothink) stored in the GGUF and in
    tokenizer_config.json is the one a chat renders through."""
    from powerinfer_rs.testing.synth import chat_template

    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "the rain"},
        {"role": "assistant", "content": "in spain"},
        {"role": "user", "content": "falls"},
    ]
    for m in (load_model(synth_hf(dtype="f32", **GLM_ARGS)), load_model(synth_gguf(**GLM_ARGS))):
        assert m.chat_template == chat_template("glm4moe")
        eng = exact_kv_engine(m, threads=2)
        assert eng.format_chat(msgs) == (
            "[gMASK]<sop><|system|>\nbe brief<|user|>\nthe rain"
            "<|assistant|>\n<think></think>\nin spain<|user|>\nfalls<|assistant|>"
        )
        off = eng.format_chat(msgs[1:2], template_kwargs={"enable_thinking": False})
        assert off == "[gMASK]<sop><|user|>\nthe rain/nothink<|assistant|>\n<think></think>"
        assert isinstance(eng.chat(msgs, max_new_tokens=3), str)
