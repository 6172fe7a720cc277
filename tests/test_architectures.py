"""Every model family (Mistral, Qwen2, Qwen3, Phi-3, Gemma 2, Gemma 3 besides llama) against
the float64 numpy reference written from the HF modeling definitions (tests/reference.py): the
HF directory, its GGUF conversion (llama.cpp's keys and tensor names, fused tensors for Phi-3,
norms with Gemma's 1 folded in), dense and in the sparse modes against the masked reference."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs.errors import ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.archs import FAMILIES, split_fused
from powerinfer_rs.loading.hf_loader import config_from_hf

from _helpers import assert_batched_and_decoding_match, profile_counts, rel
from reference import _weights, exact_kv_engine, reference_forward, reference_logits

#: Families other than llama (tested everywhere else) and their extra synth arguments.
ARCHS = {
    "mistral": {"sliding_window": 5},
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
    # Soft-caps small enough to matter at these logits' scale; layer 1 global, layer 0 local.
    "gemma2": {"sliding_window": 4, "tie": True, "attn_softcap": 3.0, "final_softcap": 2.0},
    # Six layers: the sixth is global, with its own RoPE base.
    "gemma3": {"sliding_window": 4, "tie": True, "layers": 6, "rope_theta": 1e6},
    # Multi-query attention, as Falcon-7B.
    "falcon": {"kv_heads": 1},
}
#: The families whose activation is GELU (the rest run SiLU in these tests).
GELU = ("gemma2", "gemma3", "falcon")
#: engine vs float64 reference, relative (f32 weights).
REF_RTOL = 1e-5
#: a sparse mode against the masked float64 reference.
SPARSE_RTOL = 1e-3


def ids_for(model, n: int = 14, seed: int = 3) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.config.vocab_size, n)]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_hf_and_gguf_match_the_reference(synth_hf, synth_gguf, arch):
    act = "gelu" if arch in GELU else "silu"
    hf = load_model(synth_hf(dtype="f32", activation=act, arch=arch, **ARCHS[arch]))
    gg = load_model(synth_gguf(dtype="F32", activation=act, arch=arch, **ARCHS[arch]))
    assert hf.config.arch == arch
    ids = ids_for(hf)
    ref = reference_logits(hf, ids)
    hf_logits = exact_kv_engine(hf, threads=2).logits(ids)
    gg_logits = exact_kv_engine(gg, threads=2).logits(ids)
    assert rel(hf_logits, ref) <= REF_RTOL
    if arch == "mistral":
        # llama.cpp's converter writes no window for Mistral (its "llama" arch has none): the
        # GGUF is the windowless model, a function the window changes here.
        assert hf.config.sliding_window == 5 and gg.config.sliding_window == 0
        ref = reference_logits(gg, ids)
        assert rel(ref, hf_logits) > 100 * REF_RTOL
    assert rel(gg_logits, ref) <= REF_RTOL
    if arch != "mistral":
        assert rel(gg_logits, hf_logits) <= REF_RTOL
        # The reference of the GGUF (llama's permuted q/k rows) is the same function.
        assert rel(reference_logits(gg, ids), ref) <= 1e-9


#: Per family, config fields that each change the function when switched off.
FEATURES = {
    "mistral": ["sliding_window"],
    "qwen2": ["qkv_bias"],
    "qwen3": ["qk_norm"],
    "gemma2": ["sliding_window", "attn_softcap", "final_softcap", "embed_scale", "post_norms"],
    "gemma3": ["rope_theta_local", "qk_norm", "norm_offset", "attn_scale"],
    "falcon": ["layer_norm"],
    "opt": ["learned_pos", "out_bias", "ffn_bias"],
}
#: The tensors that go with a feature.
_TENSORS = {
    "qkv_bias": (".bias",),
    "qk_norm": ("q_norm", "k_norm"),
    "post_norms": ("post_attention_norm", "post_ffw_norm"),
    "layer_norm": ("norm.bias",),
    "learned_pos": ("position_embd",),
    "out_bias": ("attn_output.bias",),
    "ffn_bias": ("ffn_up.bias", "ffn_down.bias"),
}


@pytest.mark.parametrize(("arch", "feature"), [(a, f) for a, fs in FEATURES.items() for f in fs])
def test_each_family_feature_changes_the_function(synth_hf, arch, feature):
    """Each feature matters, so the tests above can fail: the same weights without it give
    other logits (the reference and the engine agree on that model too)."""
    kw = {**ARCHS, **RELU_FAMILIES}[arch]
    m = load_model(synth_hf(dtype="f32", **{"activation": "gelu", "arch": arch, **kw}))
    ids = ids_for(m, n=10)
    ref = reference_logits(m, ids)
    old = getattr(m.config, feature)
    assert old
    # Off, or for the query scale (whose default is the same number here) another value.
    setattr(m.config, feature, 2 * old if feature == "attn_scale" else type(old)(0))
    drop = _TENSORS.get(feature)
    if drop:
        m.tensors = {k: v for k, v in m.tensors.items() if not k.endswith(drop)}
    m.fingerprint += f"-without-{feature}"
    other = reference_logits(m, ids)
    assert rel(other, ref) > 100 * REF_RTOL
    assert rel(exact_kv_engine(m, threads=2).logits(ids), other) <= REF_RTOL


def test_sliding_window_per_layer_pattern(synth_hf):
    """swa_pattern 2 (Gemma 2's alternation): layer 0 slides, layer 1 sees everything."""
    m = load_model(synth_hf(dtype="f32", activation="silu", arch="mistral", sliding_window=4))
    ids = ids_for(m, n=12)
    m.config.swa_pattern = 2
    m.fingerprint += "-swa2"
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_one_token_decoding_matches_the_reference(synth_gguf, arch):
    m = load_model(synth_gguf(dtype="F32", activation="silu", arch=arch, **ARCHS[arch]))
    ids = ids_for(m)
    eng = exact_kv_engine(m, threads=2)
    rows = np.stack([eng.prefill([t]) for t in ids])
    assert rel(rows, reference_logits(m, ids)) <= REF_RTOL


@pytest.mark.parametrize("arch", list(ARCHS))
def test_threshold_mode_matches_the_masked_reference(synth_hf, arch):
    act = "gelu" if arch in GELU else "silu"
    m = load_model(synth_hf(dtype="f32", activation=act, arch=arch, ffn=256, **ARCHS[arch]))
    ids = ids_for(m, n=16)
    w = _weights(m)
    vals: list[np.ndarray] = []

    def up(i, h):
        return 1.0 if m.config.no_gate else h @ w[f"blk.{i}.ffn_up"].T

    reference_forward(m, ids, ffn_mask=lambda i, h, x, a: vals.append(np.abs(a * up(i, h))) or True)
    t = [float(np.median(v)) for v in vals]

    def mask(i, h, x, a):
        keep = np.abs(a * up(i, h)) >= t[i]
        keep[0] = True  # the first token stays dense
        return keep

    ref, _ = reference_forward(m, ids, ffn_mask=mask)
    eng = exact_kv_engine(m, threads=2, sparsity="threshold", thresholds=t)
    assert rel(eng.logits(ids), ref) <= SPARSE_RTOL
    eng.reset()
    assert rel(np.stack([eng.prefill([x]) for x in ids]), ref) <= SPARSE_RTOL
    assert rel(ref, reference_logits(m, ids)) > 3 * SPARSE_RTOL  # the mask matters


@pytest.mark.parametrize("arch", list(ARCHS))
def test_relu_modes_match_the_reference(synth_gguf, arch):
    """The families' layers with a ReLU FFN: exact-relu is the dense function, one token at a
    time too (the sparse decode kernels)."""
    m = load_model(synth_gguf(dtype="F32", activation="relu", arch=arch, ffn=256, **ARCHS[arch]))
    ids = ids_for(m)
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2, sparsity="exact-relu")
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)


def test_fused_tensors_are_split_into_views(synth_gguf):
    m = load_model(synth_gguf(dtype="F32", activation="silu", arch="phi3"))
    c = m.config
    assert "blk.0.attn_qkv" not in m.tensors
    q, k, v = (m.tensors[f"blk.0.attn_{x}"] for x in "qkv")
    assert (q.rows, k.rows, v.rows) == (c.n_heads * c.head_dim, *(2 * [c.n_kv_heads * c.head_dim]))
    # Views into the one memory-mapped fused tensor, no copies.
    assert q.data.base is not None and k.data.ctypes.data == q.data.ctypes.data + q.nbytes
    fam = next(f for f in FAMILIES if f.name == "phi3")
    bad = {"blk.0.attn_qkv": m.tensors["blk.0.attn_q"]}
    with pytest.raises(ShapeError):
        split_fused(fam, bad, q.rows, k.rows, c.ffn_dim)


def test_unsupported_hf_settings_are_refused():
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "intermediate_size": 128,
        "vocab_size": 300,
    }
    with pytest.raises(UnsupportedError):
        config_from_hf({**base, "model_type": "gpt_bigcode"})
    with pytest.raises(UnsupportedError):
        config_from_hf({**base, "model_type": "qwen2", "use_sliding_window": True})
    # LongRoPE (test_rope_yarn_longrope.py): one factor per rotated pair, else a ShapeError.
    longrope = {"type": "longrope", "long_factor": [2.0] * 4, "short_factor": [1.0] * 4}
    with pytest.raises(ShapeError, match="short_factor"):
        config_from_hf({**base, "model_type": "phi3", "rope_scaling": longrope})
    lr = {**base, "model_type": "phi3", "rope_scaling": longrope, "partial_rotary_factor": 0.5}
    assert config_from_hf(lr).rope_long_factors == [2.0] * 4
    p = config_from_hf({**base, "model_type": "phi3", "partial_rotary_factor": 0.5})
    assert (p.rope_dims, p.rotary_dims) == (8, 8)
    with pytest.raises(UnsupportedError):
        config_from_hf({**base, "model_type": "opt", "do_layer_norm_before": False})
    with pytest.raises(UnsupportedError):
        config_from_hf({**base, "model_type": "falcon", "new_decoder_architecture": True})
    f = config_from_hf({**base, "model_type": "falcon", "multi_query": True})
    assert (f.n_kv_heads, f.ffn_dim, f.parallel, f.no_gate) == (1, 128, True, True)
    c = config_from_hf({**base, "model_type": "qwen3"})
    assert (c.arch, c.qk_norm, c.rope_style) == ("qwen3", True, "neox")


#: PowerInfer's ReLU families: Bamboo (ReLU on gate and up) and ProSparse (llama with FATReLU).
RELU_FAMILIES = {
    "bamboo": {"arch": "bamboo"},
    "prosparse": {"arch": "llama", "relu_threshold": 0.05},
    "opt": {"arch": "opt", "tie": True, "kv_heads": 4},
}


@pytest.mark.parametrize("family", list(RELU_FAMILIES))
def test_relu_families_hf_gguf_and_sparse_modes_match_the_reference(synth_hf, synth_gguf, family):
    """HF directory, GGUF, dense, exact-relu and predictor mode, one token at a time too,
    against the float64 reference (masked by the same predictor for predictor mode)."""
    from test_sparsity import random_predictors

    kw = {"activation": "relu", "ffn": 256, **RELU_FAMILIES[family]}
    hf = load_model(synth_hf(dtype="f32", **kw))
    gg = load_model(synth_gguf(dtype="F32", **kw))
    assert hf.config.up_act == gg.config.up_act == (family == "bamboo")
    assert hf.config.learned_pos == gg.config.learned_pos == (family == "opt")
    assert hf.config.relu_threshold == pytest.approx(gg.config.relu_threshold)
    ids = ids_for(hf, n=16)
    ref = reference_logits(hf, ids)
    for m in (hf, gg):
        for mode in ("dense", "exact-relu"):
            eng = exact_kv_engine(m, threads=2, sparsity=mode)
            assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    preds = random_predictors(gg, threshold=0.1)
    eng = exact_kv_engine(gg, threads=2, sparsity="predictor", predictors=preds)

    def mask(i, h, x, a):
        p = preds.layers[i]
        return (np.maximum(h @ p.fc1.T.astype(np.float64), 0) @ p.fc2.T) >= p.threshold

    masked, _ = reference_forward(gg, ids, ffn_mask=mask)
    assert rel(masked, ref) > 10 * SPARSE_RTOL
    assert rel(eng.logits(ids), masked) <= SPARSE_RTOL
    eng.reset()
    assert rel(np.stack([eng.prefill([t]) for t in ids]), masked) <= SPARSE_RTOL


@pytest.mark.parametrize(
    ("family", "feature"), [("bamboo", "up_act"), ("prosparse", "relu_threshold")]
)
def test_relu_family_features_change_the_function(synth_gguf, family, feature):
    m = load_model(synth_gguf(dtype="F32", activation="relu", ffn=256, **RELU_FAMILIES[family]))
    ids = ids_for(m, n=10)
    ref = reference_logits(m, ids)
    setattr(m.config, feature, type(getattr(m.config, feature))(0))
    m.fingerprint += f"-without-{feature}"
    other = reference_logits(m, ids)
    assert rel(other, ref) > 100 * REF_RTOL
    assert rel(exact_kv_engine(m, threads=2).logits(ids), other) <= REF_RTOL


def test_profiler_counts_fatrelu_activity(synth_gguf):
    """The profiler counts a neuron active where FATReLU passes it (gate > t), as the
    reference does."""
    m = load_model(
        synth_gguf(dtype="F32", activation="relu", ffn=256, **RELU_FAMILIES["prosparse"])
    )
    ids = ids_for(m, n=12)
    eng = exact_kv_engine(m, threads=2)
    counts, tokens = profile_counts(eng, ids)
    _, gates = reference_forward(m, ids)
    t = m.config.relu_threshold
    assert tokens == len(ids)
    assert np.array_equal(counts, np.stack([(g > t).sum(axis=0) for g in gates]))
    assert counts.sum() < np.stack([(g > 0).sum(axis=0) for g in gates]).sum()


@pytest.mark.parametrize(
    ("arch", "marker"),
    [("gemma2", "<start_of_turn>model\n"), ("phi3", "<|assistant|>\n"), ("qwen2", "<|im_start|>")],
)
def test_chat_renders_through_the_template_in_the_file(synth_hf, synth_gguf, arch, marker):
    """The family's template stored in the GGUF and in tokenizer_config.json is the one a chat
    renders through."""
    from powerinfer_rs.testing.synth import chat_template

    kw = {"activation": "gelu" if arch in GELU else "silu", "arch": arch, **ARCHS[arch]}
    msgs = [{"role": "user", "content": "the rain in spain"}]
    for m in (load_model(synth_hf(dtype="f32", **kw)), load_model(synth_gguf(**kw))):
        assert m.chat_template == chat_template(arch)
        eng = exact_kv_engine(m, threads=2)
        prompt = eng.format_chat(msgs)
        assert marker in prompt
        assert "the rain in spain" in prompt
        assert isinstance(eng.chat(msgs, max_new_tokens=3), str)


@pytest.mark.parametrize(
    ("arch", "extra"),
    [
        ("qwen3", []),
        ("phi3", []),
        ("gemma2", ["--tie", "--sliding-window", "8", "--activation", "gelu"]),
        ("opt", ["--tie", "--kv-heads", "4"]),
        ("falcon", ["--kv-heads", "1", "--activation", "gelu"]),
        ("bamboo", []),
    ],
)
def test_synth_cli_writes_every_family(tmp_path, arch, extra):
    from powerinfer_rs.testing import synth

    out = tmp_path / f"{arch}.gguf"
    argv = ["--dim", "64", "--ffn", "128", "--layers", "1", "--heads", "4", "--kv-heads", "2",
            "--vocab", "300", "--format", "gguf-f32", "--arch", arch, "--out", str(out),
            *extra]  # fmt: skip
    assert synth.main(argv) == 0
    m = load_model(out)
    assert m.config.arch == arch
    assert np.isfinite(exact_kv_engine(m, threads=1).logits([5, 6, 7])).all()


@pytest.mark.parametrize(
    ("field", "value"),
    [("attn_softcap", -1.0), ("final_softcap", float("nan")), ("relu_threshold", -0.5),
     ("embed_scale", float("inf")), ("attn_scale", -2.0)],
)  # fmt: skip
def test_bad_family_values_are_typed_errors(synth_gguf, field, value):
    """Family values a file could carry that make no sense are refused by the core with a
    ShapeError, not computed with."""
    from powerinfer_rs import _core
    from powerinfer_rs.errors import ShapeError, UnsupportedError
    from powerinfer_rs.runtime.engine import core_model_arguments

    m = load_model(synth_gguf(dtype="F32", activation="relu", arch="gemma2", tie=True))
    cfg, tensors = core_model_arguments(m)
    with pytest.raises(ShapeError, match=field):
        _core.Model(cfg.replace(**{field: value}), tensors)
    with pytest.raises(UnsupportedError, match="FATReLU"):  # FATReLU needs ReLU
        _core.Model(cfg.replace(activation="silu", relu_threshold=0.1), tensors)


def test_many_layer_falcon_passes_the_layer_count_check(synth_gguf):
    """A Falcon layer holds 8 tensors (fused q/k/v split in 3, no gate, no FFN norm): the
    loader's check that the file can hold its block count counts the family's own tensors,
    not llama's 9 (12 layers: 100 tensors in all, fewer than 12 x 9)."""
    m = load_model(synth_gguf(dtype="F32", activation="gelu", arch="falcon", kv_heads=1, layers=12))
    assert m.config.n_layers == 12 and len(m.tensors) < 12 * 9
