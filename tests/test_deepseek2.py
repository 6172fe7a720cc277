"""DeepSeek-V2/V3 (llama.cpp's ``deepseek2``) on synthetic files written as llama.cpp's
converter (DeepseekV2Model) and transformers (DeepseekV2/V3Config) write them
(powerinfer_rs.testing.synth_deepseek2): multi-head latent attention run in the latent space
with a cache of one ``kv_lora_rank + rope`` row per position and layer, V3's sigmoid routing
with the correction bias and expert groups, V2's softmax, shared experts, a dense first layer.
Against the float64 reference (tests/reference.py ``mla_attention``: the textbook, not absorbed,
form), batched and one token at a time (bit for bit), and against llama.cpp on the same file;
what the model does not run (the sparse modes, the GPU, the neuron store, plans, quantized KV
caches) is refused with a typed error."""

from __future__ import annotations

import json

import numpy as np
import pytest
from llamacpp_check import compare_with_llama_cpp, distance
from refusals import attempt_unsupported

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.gguf_file import GGUFFile
from powerinfer_rs.loading.gguf_loader import open_gguf
from powerinfer_rs.planning.accounting import cpu_kv_bytes, kv_position_bytes
from powerinfer_rs.planning.model_shape import ModelShape
from powerinfer_rs.testing.synth_deepseek2 import (
    DeepseekSpec,
    write_deepseek_gguf,
    write_deepseek_hf,
)

from _helpers import engine_greedy, llama_greedy, rel
from reference import exact_kv_engine, greedy_reference, reference_logits

REF_RTOL = 1e-5
#: DeepseekV2Model.set_gguf_parameters' keys (TextModel's, then its own) for V3's config.
V3_KEYS = {
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "rope.freq_base",
    "attention.layer_norm_rms_epsilon",
    "expert_count",
    "expert_used_count",
    "expert_group_count",
    "expert_group_used_count",
    "expert_gating_func",
    "leading_dense_block_count",
    "vocab_size",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "attention.key_length",
    "attention.value_length",
    "attention.key_length_mla",
    "attention.value_length_mla",
    "expert_feed_forward_length",
    "expert_shared_count",
    "expert_weights_scale",
    "expert_weights_norm",
    "rope.dimension_count",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths of the synthetic files, written once: ``("gguf", v3)``, ``("q8_0", v3)``,
    ``("hf", v3, q_lora)``."""
    made: dict = {}

    def get(kind: str, v3: bool = True, q_lora: bool = True):
        key = (kind, v3, q_lora)
        if key not in made:
            spec = DeepseekSpec(v3=v3, q_lora_rank=64 if q_lora else 0, seed=3 if v3 else 4)
            d = tmp_path_factory.mktemp(f"ds_{kind}_{int(v3)}_{int(q_lora)}")
            if kind == "hf":
                made[key] = write_deepseek_hf(d / "hf", spec)
            elif kind == "gguf":
                made[key] = write_deepseek_gguf(d / "f32.gguf", spec)
            else:
                made[key] = quantized(get("gguf", v3), d / f"{kind}.gguf", kind)
        return made[key]

    return get


def quantized(src, out, kind: str):
    """``src`` quantized by llama.cpp's own quantizer (llama_model_quantize)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}[kind]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    assert rc == 0
    return out


def ids_for(model, n: int = 12, seed: int = 5) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.config.vocab_size, n)]


def test_gguf_is_read_as_llama_cpp_reads_it(files):
    path = files("gguf")
    meta = open_gguf(path).metadata
    assert {k[len("deepseek2.") :] for k in meta if k.startswith("deepseek2.")} == V3_KEYS
    assert not [k for k in meta if k.startswith("powerinfer_rs.")]
    names = {t.name for t in GGUFFile(path).tensors}
    assert {"blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight", "blk.1.exp_probs_b.bias"} <= names
    assert not [n for n in names if "attn_kv_b" in n], "the converter no longer writes it"
    m = load_model(path)
    c = m.config
    assert (c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.rotary_dims) == (3, 4, 1, 48, 16)
    assert (c.mla_kv_lora_rank, c.mla_q_lora_rank, c.mla_qk_nope, c.mla_v_head_dim) == (
        32,
        64,
        32,
        32,
    )
    assert (c.dense_lead_layers, c.n_expert, c.n_expert_used, c.expert_ffn_dim) == (1, 8, 2, 32)
    assert (c.shared_ffn_dim, c.expert_groups, c.expert_groups_used) == (32, 4, 2)
    assert (c.expert_gating, c.expert_score_bias, c.expert_norm_weights) == ("sigmoid", True, True)
    assert c.expert_weights_scale == pytest.approx(2.5)
    assert c.rope_style == "norm"
    assert (m.tensors["blk.0.attn_k_b"].rows, m.tensors["blk.0.attn_k_b"].cols) == (4 * 32, 32)
    assert (m.tensors["blk.0.attn_v_b"].rows, m.tensors["blk.0.attn_v_b"].cols) == (4 * 32, 32)


@pytest.mark.parametrize("v3", [True, False])
def test_matches_the_reference_and_batched_rows_are_steps_bit_for_bit(files, v3):
    """V3 (sigmoid, bias, groups) and V2 (softmax) routing over the latent attention: within
    1e-5 of the float64 textbook MLA; a prompt's multi-token pass equals its one-token steps
    bit for bit; greedy text equal to the reference's."""
    m = load_model(files("gguf", v3))
    assert m.config.expert_gating == ("sigmoid" if v3 else "softmax")
    ids = ids_for(m)
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2)
    assert rel(eng.logits(ids), ref) <= REF_RTOL
    batched = eng.new_session().decode(ids)
    s = eng.new_session()
    stepped = np.concatenate([s.feed([t]) for t in ids])
    np.testing.assert_array_equal(batched, stepped)
    assert rel(stepped, ref) <= REF_RTOL
    assert engine_greedy(eng, ids[:6], 8) == greedy_reference(m, ids[:6], 8)


def test_the_kv_cache_holds_the_latent_rows_alone(files):
    """Per position and layer the cache holds kv_lora_rank + rope values (32 + 16) at the
    cache's element size, no value rows: the session's snapshot size, its allocation and
    the planner's count agree."""
    m = load_model(files("gguf"))
    c = m.config
    latent = c.mla_kv_lora_rank + c.rotary_dims
    shape = ModelShape.coerce(m)
    for kv, size in (("f16", 2), ("f32", 4)):
        eng = Engine(m, threads=2, kv_cache=kv)
        s = eng.new_session()
        assert s.kv_snapshot_bytes_per_position == c.n_layers * latent * size
        assert kv_position_bytes(shape, kv) == c.n_layers * latent * size
        s.feed(ids_for(m, n=4))
        # The CPU holds its f16/f32 rows as f32, grown 256 positions at a time.
        assert s.kv_cache_bytes == c.n_layers * cpu_kv_bytes(shape, 256, kv)
        assert s.kv_cache_bytes == c.n_layers * 256 * latent * 4
    # An ordinary attention of the same heads would cache keys and values of every head.
    mha = c.n_layers * 2 * c.n_heads * (c.mla_qk_nope + c.rotary_dims) * 2
    assert Engine(m, threads=2).new_session().kv_snapshot_bytes_per_position * 5 < mha


def test_a_kv_snapshot_round_trip(files):
    """A prefix snapshot of the latent cache restores into a fresh session, which then
    continues exactly as the original does."""
    m = load_model(files("gguf"))
    eng = Engine(m, threads=2)
    ids = ids_for(m, n=10)
    a = eng.new_session()
    a.feed(ids[:7])
    snap = a.kv_snapshot(7)
    assert len(snap) == 7 * a.kv_snapshot_bytes_per_position
    b = eng.new_session()
    b.kv_restore(snap, 7)
    np.testing.assert_array_equal(b.feed(ids[7:]), a.feed(ids[7:]))


def test_decode_slots_over_latent_caches_equal_each_session_alone(files):
    """Several sessions' decode steps in one pass (the server's slots), each over its own
    latent cache: every row equals that session's own step bit for bit."""
    from powerinfer_rs import _core

    m = load_model(files("gguf"))
    eng = Engine(m, threads=2)
    prompts = [ids_for(m, n=k, seed=k) for k in (3, 6, 9)]

    def sessions(shared: bool):
        out = []
        for p in prompts:
            s = _core.Session(eng._model, 2, 64, threads_of=eng.core_session if shared else None)
            s.feed(p)
            out.append(s)
        return out

    slots, alone = sessions(True), sessions(False)
    for toks in ([[42], [7, 99, 5], [100]], [[3], [4], [5, 6]]):
        got = _core.decode_slots(slots, toks)
        for r, t, g in zip(alone, toks, got):
            want = r.decode(t) if len(t) > 1 else r.feed(t)
            np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("kv", ["q8_0", "q4_0", "q8_0/f16", "f32/f16"])
def test_quantized_or_mixed_kv_caches_are_refused(files, kv):
    m = load_model(files("gguf"))
    with pytest.raises(UnsupportedError, match="latent attention"):
        Engine(m, threads=2, kv_cache=kv).logits(ids_for(m, n=3))


@pytest.mark.parametrize("what", ["threshold", "profiling", "neuron store", "plan"])
def test_what_it_does_not_run_is_a_typed_error(files, tmp_path, what):
    """The sparse modes, profiling, the neuron store and a GPU plan (the hybrid executor,
    which runs only from one, refuses too) have no latent attention: refused, typed, and the
    engine still runs dense."""
    m = load_model(files("gguf"))
    eng = Engine(m, threads=2)
    with pytest.raises(UnsupportedError, match="latent attention"):
        attempt_unsupported(eng, m, what, tmp_path)
    ids = ids_for(m, n=4)
    assert rel(eng.logits(ids), reference_logits(m, ids)) <= 1e-3


def test_an_old_file_and_a_missing_rank_are_refused(files, tmp_path):
    """A file converted before MLA (no key_length_mla: it carries attn_kv_b) is refused as
    unsupported; a non-lite file without q_lora_rank as llama.cpp refuses it."""
    from powerinfer_rs.loading.gguf_loader import config_from_metadata

    meta = dict(open_gguf(files("gguf")).metadata)
    old = {k: v for k, v in meta.items() if not k.endswith("key_length_mla")}
    with pytest.raises(UnsupportedError, match="key_length_mla"):
        config_from_metadata(old, None)
    no_q = {k: v for k, v in meta.items() if not k.endswith("q_lora_rank")}
    with pytest.raises(ModelFileError, match="q_lora_rank"):
        config_from_metadata(no_q, None)


@pytest.mark.parametrize("q_lora", [True, False])
def test_hf_checkpoint_is_the_gguf_model(files, q_lora):
    """The Hugging Face directory (kv_b_proj fused, split at load; per-expert tensors) is the
    model of its GGUF conversion; without q_lora_rank (DeepSeek-V2-Lite's q_proj) the engine
    follows the reference too."""
    hf = load_model(files("hf", True, q_lora))
    c = hf.config
    assert (c.mla_kv_lora_rank, c.mla_q_lora_rank, c.n_kv_heads, c.head_dim) == (
        32,
        64 if q_lora else 0,
        1,
        48,
    )
    ids = ids_for(hf)
    ref = reference_logits(hf, ids)
    if q_lora:
        gg = load_model(files("gguf", True))
        for k in ("expert_groups", "expert_groups_used", "expert_score_bias", "shared_ffn_dim"):
            assert getattr(hf.config, k) == getattr(gg.config, k), k
        assert rel(ref, reference_logits(gg, ids)) <= 1e-9
    assert rel(exact_kv_engine(hf, threads=2).logits(ids), ref) <= REF_RTOL


def test_hf_config_keys_as_the_real_configs_carry(files):
    cfg = json.loads((files("hf", True) / "config.json").read_text())
    for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"):
        assert k in cfg
    for k in ("v_head_dim", "n_group", "topk_group", "first_k_dense_replace", "scoring_func"):
        assert k in cfg


@pytest.mark.parametrize("kind", ["gguf", "q8_0"])
def test_logits_within_llama_cpps_distance_and_64_greedy_tokens(files, kind):
    """llama.cpp runs the same file: both sides' logits against the float64 reference (of the
    file's dequantised weights), largest relative error per position and mean KL, ours no
    further than llama.cpp's own distance (floored at f32 rounding); F32: 64 greedy tokens
    identical (on Q8_0 llama.cpp's own rounding, activations quantized too, is 2000 times
    ours against the reference, and its text departs from the reference's)."""
    path = files(kind)
    m = load_model(path)
    if kind == "q8_0":
        assert m.tensors["blk.1.attn_k_b"].dtype == "Q8_0"
        assert m.tensors["blk.1.attn_kv_a_mqa"].dtype == "Q8_0"
    prompt = ids_for(m, n=12, seed=2)
    run = compare_with_llama_cpp(m, path, prompt, f"deepseek2 {kind}", n_ctx=96)
    run.assert_within_llama_cpp()
    if kind == "gguf":
        assert engine_greedy(run.eng, prompt, 64) == llama_greedy(run.llm, prompt, 64)


def test_yarn_as_llama_cpp_scales_deepseek(tmp_path):
    """DeepSeek-V2-Lite's YaRN (factor over the original context, mscale_all_dim 0.707): the
    frequencies ramp, the rotation keeps magnitude 1 and the scores take mscale² (llama.cpp's
    yarn_log_multiplier fix); our logits and 64 greedy tokens against llama.cpp's, on a prompt
    past the original context of 64, and the reference; without the multiplier: refused."""
    from powerinfer_rs.loading.gguf_loader import config_from_metadata

    spec = DeepseekSpec(v3=False, yarn_factor=8.0, yarn_original=64, seed=7)
    path = write_deepseek_gguf(tmp_path / "yarn.gguf", spec)
    m = load_model(path)
    c = m.config
    mscale = 1.0 + 0.1 * 0.707 * np.log(8.0)
    assert c.attn_scale == pytest.approx(mscale**2 / np.sqrt(48), rel=1e-5)
    assert c.rope_attn_factor == 0.0 and len(c.rope_freq_factors) == 8
    prompt = ids_for(m, n=80, seed=9)
    run = compare_with_llama_cpp(m, path, prompt, "deepseek2 YaRN", n_ctx=160)
    assert distance(run.ours, run.theirs)[0] <= 1e-4
    run.assert_within_llama_cpp(kl=False)
    assert engine_greedy(run.eng, prompt[:8], 64) == llama_greedy(run.llm, prompt[:8], 64)
    meta = dict(open_gguf(path).metadata)
    del meta["deepseek2.rope.scaling.yarn_log_multiplier"]
    with pytest.raises(UnsupportedError, match="yarn_log_multiplier"):
        config_from_metadata(meta, None)


def test_v2_lite_gguf_has_one_attn_q(tmp_path):
    """DeepSeek-V2-Lite's form (no q_lora_rank: one attn_q), which llama.cpp reads only at its
    "lite" layer counts (27 here): our logits against llama.cpp's and the reference, greedy
    text equal."""
    spec = DeepseekSpec(v3=False, layers=27, q_lora_rank=0, experts=4, seed=8)
    path = write_deepseek_gguf(tmp_path / "lite.gguf", spec)
    m = load_model(path)
    assert m.config.mla_q_lora_rank == 0 and "blk.0.attn_q" in m.tensors
    assert "deepseek2.attention.q_lora_rank" not in open_gguf(path).metadata
    prompt = ids_for(m, n=8, seed=3)
    run = compare_with_llama_cpp(m, path, prompt, "deepseek2 V2-Lite form", n_ctx=64)
    run.assert_within_llama_cpp(kl=False)
    assert engine_greedy(run.eng, prompt, 16) == llama_greedy(run.llm, prompt, 16)


def test_hf_yarn_is_the_gguf_conversions(tmp_path):
    """The same YaRN from config.json's rope_scaling (transformers' semantics): the scores'
    scale and the rotation's magnitude as its GGUF conversion's (which llama.cpp checks, above),
    the frequencies within transformers' rounding of the ramp's corners (truncate), the engine
    on the reference."""
    spec = DeepseekSpec(v3=False, yarn_factor=8.0, yarn_original=64, seed=7)
    hf = load_model(write_deepseek_hf(tmp_path / "hf", spec))
    gg = load_model(write_deepseek_gguf(tmp_path / "yarn.gguf", spec))
    assert hf.config.attn_scale == pytest.approx(gg.config.attn_scale, rel=1e-6)
    assert hf.config.rope_attn_factor == gg.config.rope_attn_factor == 0.0
    assert (hf.config.rotary_dims, hf.config.max_context) == (16, gg.config.max_context)
    f_hf, f_gg = np.asarray(hf.config.rope_freq_factors), np.asarray(gg.config.rope_freq_factors)
    assert f_hf.shape == f_gg.shape == (8,) and f_hf[0] == f_gg[0] == 1.0
    assert f_hf[-1] == pytest.approx(8.0) and f_gg[-1] == pytest.approx(8.0)
    ids = ids_for(hf, n=80, seed=9)
    assert rel(exact_kv_engine(hf, threads=2).logits(ids), reference_logits(hf, ids)) <= REF_RTOL
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="YaRN only"):
        load_model(tmp_path / "hf")
