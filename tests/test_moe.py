"""Mixture-of-experts families (Qwen3-MoE, Qwen2-MoE with its shared expert, OLMoE, Mixtral) on
synthetic GGUF files written with exactly the keys llama.cpp's converter writes for each (no key
of ours): against the float64 reference (tests/reference.py ``moe_ffn``), batched and one token
at a time, F32, F16 and quantized; the routing semantics each family fixes (renormalisation,
shared expert gate, whole-vector q/k norms) each change the function; only routed experts are
computed; what is not supported yet is refused with a typed error. llama.cpp itself checks the
same files in test_architectures_llamacpp.py (``MOE_ARCHS``)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from test_sparsity import random_predictors

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, PlanError, UnsupportedError
from powerinfer_rs.loading import TensorData, load_model
from powerinfer_rs.loading.archs import family_named
from powerinfer_rs.loading.gguf_loader import config_from_metadata, open_gguf
from powerinfer_rs.testing.synth import write_gguf_model, write_hf_model

from _helpers import assert_batched_and_decoding_match, rel
from reference import exact_kv_engine, greedy_reference, reference_forward, reference_logits

#: Each MoE family's synth arguments: 8 experts, top-2 (top-3 for Qwen3-MoE), experts narrower
#: than the dense width where the family's files say so.
MOE_ARCHS = {
    "qwen3moe": {"experts": 8, "experts_used": 3, "expert_ffn": 64},
    "qwen2moe": {"experts": 8, "experts_used": 2, "expert_ffn": 64, "shared_ffn": 96},
    "olmoe": {"experts": 8, "experts_used": 2, "kv_heads": 4},
    "mixtral": {"experts": 8, "experts_used": 2},
    # A window in the file: layer 0 global without RoPE, layer 1 sliding; sigmoid routing.
    "smallthinker": {
        "experts": 8,
        "experts_used": 2,
        "sliding_window": 64,
        "expert_gating": "sigmoid",
    },
}


def act_of(arch: str) -> str:
    """The family's own activation (ReLU for SmallThinker's ReGLU experts, else SiLU)."""
    return family_named(arch).activation


REF_RTOL = 1e-5


def ids_for(model, n: int = 12, seed: int = 5) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, model.config.vocab_size, n)]


@pytest.mark.parametrize("arch", list(MOE_ARCHS))
def test_families_match_the_reference_batched_and_decoding(synth_gguf, arch):
    path = synth_gguf(dtype="F32", activation=act_of(arch), arch=arch, **MOE_ARCHS[arch])
    meta = open_gguf(path).metadata
    assert not [k for k in meta if k.startswith("powerinfer_rs.")]
    m = load_model(path)
    c = m.config
    assert c.arch == arch and c.n_expert == 8 and c.n_expert_used == MOE_ARCHS[arch]["experts_used"]
    ids = ids_for(m)
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    # Greedy tokens identical to the reference's.
    eng.reset()
    logits = eng.prefill(ids[:6])
    toks = []
    for _ in range(8):
        toks.append(int(np.argmax(logits)))
        logits = eng.prefill([toks[-1]])
    assert toks == greedy_reference(m, ids[:6], 8)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_K_M"])
def test_stored_formats_match_the_reference(synth_gguf, arch, dtype):
    """F16 files within 1e-3 of the float64 reference (the issue's bound); quantized files
    against the reference of the same dequantised weights (the router stays F32)."""
    kw = {**MOE_ARCHS[arch], "dim": 256, "expert_ffn": 256}
    m = load_model(synth_gguf(dtype=dtype, activation="silu", arch=arch, **kw))
    assert m.tensors["blk.0.ffn_gate_inp"].dtype == "F32"
    assert m.tensors["blk.1.ffn_up_exps"].dtype == (dtype if dtype != "Q4_K_M" else "Q4_K")
    ids = ids_for(m, n=8)
    ref = reference_logits(m, ids)
    got = Engine(m, threads=2).logits(ids)
    assert np.abs(got - ref).max() <= 1e-3 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("arch,dtype", [("qwen2moe", "Q4_K_M"), ("qwen3moe", "Q4_0")])
def test_dense_decode_reads_interleaved_experts(synth_gguf, arch, dtype):
    """A dense CPU engine with room for a copy decodes from interleaved experts (and the
    shared expert's): the same function as the rows a mapped engine reads, within the
    kernels' roundings, each within the quantized reference's distance; batched prompts
    still read the rows (the same bits either way)."""
    kw = {**MOE_ARCHS[arch], "dim": 256, "expert_ffn": 256}
    m = load_model(synth_gguf(dtype=dtype, activation="silu", arch=arch, **kw))
    packed, mapped = Engine(m, threads=2, mmap=False), Engine(m, threads=2, mmap=True)
    for name in ("blk.1.ffn_gate_exps", "blk.1.ffn_up_exps"):
        assert packed.tensor_layout(name) == "rows+interleaved"
        assert mapped.tensor_layout(name) == "rows"
    ids = ids_for(m, n=8)
    ref = reference_logits(m, ids)
    scale = max(1.0, np.abs(ref).max())
    assert np.array_equal(packed.logits(ids), mapped.logits(ids))
    steps = {}
    for name, eng in (("packed", packed), ("mapped", mapped)):
        eng.reset()
        steps[name] = np.stack([eng.prefill([t]) for t in ids])
        assert np.abs(steps[name] - ref).max() <= 1e-3 * scale, name
    # The interleaved kernels round differently (a dense llama's interleaved FFN against its
    # rows: 7e-5 on this shape).
    assert rel(steps["packed"], steps["mapped"]) <= 5e-4
    assert not np.array_equal(steps["packed"], steps["mapped"])  # the copy was read


#: Per family, a config field that changes the function when switched off.
FEATURES = [
    ("smallthinker", "router_on_residual"),
    ("smallthinker", "no_rope_step"),
    ("qwen3moe", "expert_norm_weights"),
    ("mixtral", "expert_norm_weights"),
    ("qwen2moe", "shared_expert_gate"),
    ("olmoe", "qk_norm_full"),
]


@pytest.mark.parametrize(("arch", "feature"), FEATURES)
def test_each_routing_feature_changes_the_function(synth_gguf, arch, feature):
    m = load_model(synth_gguf(dtype="F32", activation=act_of(arch), arch=arch, **MOE_ARCHS[arch]))
    ids = ids_for(m, n=8)
    ref = reference_logits(m, ids)
    old = getattr(m.config, feature)
    assert old
    setattr(m.config, feature, type(old)(0))
    if feature == "shared_expert_gate":
        m.tensors = {k: v for k, v in m.tensors.items() if "gate_inp_shexp" not in k}
    if feature == "qk_norm_full":  # per head then: the head-wide norms of the first head_dim
        hd = m.config.head_dim
        for k in [k for k in m.tensors if k.endswith(("attn_q_norm", "attn_k_norm"))]:
            t = m.tensors[k]
            m.tensors[k] = TensorData(k, t.dtype, 1, hd, t.data[: 4 * hd])
    m.fingerprint += f"-without-{feature}"
    other = reference_logits(m, ids)
    assert rel(other, ref) > 100 * REF_RTOL
    assert rel(exact_kv_engine(m, threads=2).logits(ids), other) <= REF_RTOL


def test_smallthinker_dense_first_windows(synth_gguf):
    """SmallThinker's window pattern counts its global layers from 0 (llama.cpp's
    dense_first): with a window narrower than the sequence, layers 0 and 4 see everything and
    apply no RoPE, layers 1-3 slide; engine and reference agree, batched and token by token."""
    kw = {**MOE_ARCHS["smallthinker"], "layers": 5}
    m = load_model(synth_gguf(dtype="F32", activation="relu", arch="smallthinker", **kw))
    c = m.config
    assert (c.sliding_window, c.swa_pattern, c.swa_dense_first, c.no_rope_step) == (
        4096,
        4,
        True,
        4,
    )
    ids = ids_for(m, n=12)
    c.sliding_window = 5
    m.fingerprint += "-window5"
    ref = reference_logits(m, ids)
    eng = exact_kv_engine(m, threads=2)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    c.swa_dense_first = False  # the other counting is another function
    m.fingerprint += "-dense-last"
    assert rel(reference_logits(m, ids), ref) > 100 * REF_RTOL


@pytest.mark.parametrize("dtype", ["F32", "Q4_K_M"])
def test_exact_relu_inside_experts_is_the_dense_function(synth_gguf, dtype):
    """ReGLU experts with a planted sparsity: exact-relu decoding (the up and down_t rows of
    the neurons that fire in each routed expert) gives the dense logits (up to down_t's
    re-encoding for quantized files), batched scoring the same function, and the experts'
    transposed down projections it reads are built."""
    kw = {**MOE_ARCHS["smallthinker"], "dim": 256, "ffn": 256, "active": 0.2}
    m = load_model(synth_gguf(dtype=dtype, activation="relu", arch="smallthinker", **kw))
    ids = ids_for(m, n=10)
    dense = Engine(m, threads=2)
    want = np.stack([dense.prefill([t]) for t in ids])
    sparse = Engine(m, threads=2, sparsity="exact-relu")
    assert dense.core_model.down_t_bytes == 0 and sparse.core_model.down_t_bytes > 0
    got = np.stack([sparse.prefill([t]) for t in ids])
    # Quantized experts' down_t is re-encoded in its format: close, not equal (as for dense
    # models, test_sparsity.py); float ones are the same numbers.
    assert rel(got, want) <= (REF_RTOL if dtype == "F32" else 0.05)
    assert rel(sparse.logits(ids), Engine(m, threads=2).logits(ids)) <= REF_RTOL


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_threshold_inside_experts_matches_the_masked_reference(synth_gguf, arch):
    """Threshold mode inside SiLU experts: each routed expert drops the neurons with
    |act(gate)·up| < t (the context's first token stays dense), batched and decoding, as the
    float64 reference masks them; at t = 0 the dense function. Decoding reads the down rows
    of the neurons that pass only (the experts' transposed down projections are built)."""
    path = synth_gguf(dtype="F32", activation="silu", arch=arch, **MOE_ARCHS[arch])
    m = load_model(path)
    ids = ids_for(m, n=12)
    trace: list = []
    dense_ref, _ = reference_forward(m, ids, moe_trace=trace)
    vals = [[] for _ in range(m.config.n_layers)]
    for layer, tok, _e, hv in trace:
        if tok:
            vals[layer].append(np.abs(hv))
    t = [float(np.median(np.concatenate(v))) for v in vals]  # half the routed neurons drop

    def mask(layer, tok, hv, **_):
        return hv if tok == 0 else np.where(np.abs(hv) >= t[layer], hv, 0.0)

    ref, _ = reference_forward(m, ids, moe_mask=mask)
    assert rel(ref, dense_ref) > 10 * REF_RTOL  # the thresholds really dropped neurons
    eng = Engine(m, threads=2, kv_cache="f32", sparsity="threshold", thresholds=t)
    assert_batched_and_decoding_match(eng, ids, ref, REF_RTOL)
    assert eng.core_model.down_t_bytes > 0
    zero = Engine(m, threads=2, kv_cache="f32", sparsity="threshold", thresholds=[0.0] * 2)
    assert rel(np.stack([zero.prefill([x]) for x in ids]), dense_ref) <= REF_RTOL


def test_calibrate_thresholds_inside_experts(synth_gguf, tmp_path):
    """The calibrate stage on a mixture of experts: thresholds are quantiles of |act(gate)·up|
    over the routed experts' neurons (captured per token, its experts in route order), and the
    engine in threshold mode then drops about that share of them (the profiler's count)."""
    from powerinfer_rs.stages.calibrate import calibrate_thresholds

    path = synth_gguf(dtype="F32", activation="silu", arch="qwen3moe", **MOE_ARCHS["qwen3moe"])
    m = load_model(path)
    c = m.config
    eng = Engine(m, threads=2)
    ids = ids_for(m, n=200, seed=3)
    eng.start_profiling(capture=True)
    eng.prefill(ids[:16])
    caps = eng.take_captured()
    eng.stop_profiling()
    assert len(caps) == c.n_layers
    x, act, routes = caps[0]
    assert x.shape == (16, c.dim) and act.shape == (16, c.n_expert_used * c.expert_ffn_dim)
    # Each token's routed experts, in route order: the reference's top-k.
    trace: list = []
    reference_forward(m, ids[:16], moe_trace=trace)
    want = [[ex for i, t, ex, _ in trace if i == 0 and t == tok] for tok in range(16)]
    assert routes.shape == (16, c.n_expert_used) and routes.tolist() == want
    assert (np.abs(act).reshape(16, c.n_expert_used, -1).sum(axis=2) > 0).all()
    thresholds, below = calibrate_thresholds(eng, ids, 0.4, window=64, progress=False)
    assert all(t > 0 for t in thresholds) and all(abs(b - 0.4) < 0.02 for b in below)
    eng.set_sparsity("threshold", thresholds=thresholds)
    eng.reset()
    eng.start_profiling()
    eng.prefill(ids[64:128])
    counts, tokens = eng.profile_counts()
    routed = eng.profile_expert_counts()
    eng.stop_profiling()
    active = counts.sum() / (routed.sum() * c.expert_ffn_dim)
    assert 0.45 < active < 0.75, active  # ~60% kept on other tokens of the same text


def test_profile_counts_routing_and_neurons_inside_experts(synth_gguf, tmp_path):
    """The profiler counts, per layer, the tokens routed to each expert and, in the
    flattened neuron space (expert e's neuron j at e * expert_ffn + j), the tokens in which
    each neuron fired: as the float64 reference routes and activates them. The profile stage
    writes both and plots the routing."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.stages import profile as stage

    from reference import reference_forward

    kw = {**MOE_ARCHS["smallthinker"], "dim": 128, "ffn": 64, "active": 0.2}
    path = synth_gguf(dtype="F32", activation="relu", arch="smallthinker", **kw)
    m = load_model(path)
    c, ef = m.config, m.config.expert_ffn_dim
    ids = ids_for(m, n=24)
    eng = Engine(m, threads=2, kv_cache="f32")
    eng.start_profiling()
    eng.prefill(ids)
    counts, tokens = eng.profile_counts()
    routed = eng.profile_expert_counts()
    eng.stop_profiling()
    assert tokens == 24 and counts.shape == (c.n_layers, c.n_expert * ef)
    trace: list = []
    reference_forward(m, ids, moe_trace=trace)
    want_routed = np.zeros((c.n_layers, c.n_expert), np.int64)
    want = np.zeros_like(counts)
    for layer, _t, e, hv in trace:
        want_routed[layer, e] += 1
        want[layer, e * ef : (e + 1) * ef] += hv != 0
    assert np.array_equal(routed, want_routed)
    assert (routed.sum(axis=1) == 24 * c.n_expert_used).all()
    assert np.abs(counts - want).sum() <= 2  # a gate within rounding of 0 may flip
    assert 0.05 < counts.sum() / (24 * c.n_expert_used * ef * c.n_layers) < 0.5
    # The stage: the profile file holds both, the routing plot is written.
    out = tmp_path / "prof"
    text = tmp_path / "text.txt"
    words = "the river ran past old stone mills where bakers sold warm bread at dawn".split()
    rng = np.random.default_rng(9)
    text.write_text(" ".join(rng.choice(words, 300)), encoding="utf-8")
    argv = ["--model", str(path), "--corpus", str(text), "--out", str(out), "--tokens", "64"]
    assert stage.main([*argv, "--quiet"]) == 0
    prof = read_profile(out)
    assert prof.n_expert == c.n_expert and prof.ffn_dim == c.n_expert * ef
    assert (np.asarray(prof.expert_counts).sum(axis=1) == prof.tokens * c.n_expert_used).all()
    assert (out / stage.EXPERTS_PNG_NAME).stat().st_size > 0


def _route(model, layer_input: np.ndarray, layer: int) -> set[int]:
    """The experts the reference routes one token to in ``layer`` (softmax, top-k)."""
    from reference import _weights

    w = _weights(model)[f"blk.{layer}.ffn_gate_inp"]
    logits = w @ layer_input
    return set(np.argsort(-logits, kind="stable")[: model.config.n_expert_used].tolist())


def test_only_routed_experts_are_computed(synth_gguf):
    """A one-layer model and one token: rewriting every expert the token is not routed to
    changes nothing, bit for bit; rewriting a routed one changes the logits."""
    from reference import _weights, rms_norm

    kw = {**MOE_ARCHS["qwen3moe"], "layers": 1}
    m = load_model(synth_gguf(dtype="F32", activation="silu", arch="qwen3moe", **kw))
    tok = 17
    w = _weights(m)
    # The first token's FFN input: attention over itself returns v; the reference's own pieces.
    x = w["token_embd"][tok]
    h = rms_norm(x, w["blk.0.attn_norm"], m.config.rms_eps)
    v = h @ w["blk.0.attn_v"].T
    group = m.config.n_heads // m.config.n_kv_heads
    att = np.repeat(v.reshape(m.config.n_kv_heads, -1), group, axis=0).reshape(-1)
    x = x + att @ w["blk.0.attn_output"].T
    routed = _route(m, rms_norm(x, w["blk.0.ffn_norm"], m.config.rms_eps), 0)
    assert len(routed) == 3
    base = Engine(m, threads=2).logits([tok])

    def rewritten(experts: set[int]):
        t = m.tensors["blk.0.ffn_up_exps"]
        data = np.array(t.data)  # a private copy
        per = len(data) // m.config.n_expert
        rng = np.random.default_rng(0)
        for e in experts:
            vals = rng.standard_normal(per // 4).astype(np.float32)
            data[e * per : (e + 1) * per] = vals.view(np.uint8)
        tensors = {**m.tensors, t.name: TensorData(t.name, t.dtype, t.rows, t.cols, data)}
        return dataclasses.replace(m, tensors=tensors, fingerprint=m.fingerprint + "x")

    others = set(range(m.config.n_expert)) - routed
    assert np.array_equal(Engine(rewritten(others), threads=2).logits([tok]), base)
    changed = Engine(rewritten({min(routed)}), threads=2).logits([tok])
    assert rel(changed, base) > 1e-3


def test_what_is_not_supported_yet_is_refused(synth_gguf, tmp_path):
    path = synth_gguf(dtype="F32", activation="silu", arch="qwen3moe", **MOE_ARCHS["qwen3moe"])
    m = load_model(path)
    with pytest.raises(PlanError, match="takes predictors per expert"):
        Engine(m, threads=1, sparsity="predictor", predictors=random_predictors(m))
    sites = [[0.1, 0.1, 0.1, 0.1]] * m.config.n_layers
    with pytest.raises(UnsupportedError, match="input mode inside experts"):
        Engine(m, threads=1).ctx.session.set_sparsity("input", input_thresholds=sites)
    shape = dict(dim=64, ffn=64, layers=1, heads=4, kv_heads=2, vocab=300)
    with pytest.raises(UnsupportedError, match="GGUF only"):
        write_hf_model(tmp_path / "hf", arch="smallthinker", activation="relu", **shape)


def test_expert_keys_as_llama_cpp_reads_them(synth_gguf):
    """expert_count and expert_used_count are required; without expert_feed_forward_length a
    Qwen expert is feed_forward_length / expert_used_count wide (llama.cpp's qwen3moe.cpp)."""
    path = synth_gguf(dtype="F32", activation="silu", arch="qwen3moe", **MOE_ARCHS["qwen3moe"])
    meta = dict(open_gguf(path).metadata)
    c = config_from_metadata(meta, None)
    assert (c.n_expert, c.n_expert_used, c.expert_ffn_dim, c.ffn_dim) == (8, 3, 64, 128)
    del meta["qwen3moe.expert_feed_forward_length"]
    assert config_from_metadata(meta, None).expert_ffn_dim == 128 // 3
    for key in ("qwen3moe.expert_count", "qwen3moe.expert_used_count"):
        broken = {k: v for k, v in meta.items() if k != key}
        with pytest.raises(ModelFileError, match="expert_count"):
            config_from_metadata(broken, None)
    # Mixtral is llama's arch with experts.
    mix = open_gguf(
        synth_gguf(dtype="F32", activation="silu", arch="mixtral", **MOE_ARCHS["mixtral"])
    ).metadata
    assert mix["general.architecture"] == "llama"
    c = config_from_metadata(dict(mix), None)
    assert (c.arch, c.expert_norm_weights, c.expert_ffn_dim) == ("mixtral", True, c.ffn_dim)


def test_malformed_expert_files_are_typed_errors(tmp_path, monkeypatch):
    """An expert count that the merged tensors do not hold, or more experts per token than
    there are: typed errors naming what is wrong, never a crash."""
    import gguf

    from powerinfer_rs.errors import ShapeError

    shape = dict(arch="qwen3moe", activation="silu", dim=64, ffn=64, layers=1, heads=4)
    shape.update(kv_heads=2, vocab=300, experts=4, experts_used=2)
    cases = [(6, ShapeError, "ffn_gate_inp.*4x64.*6x64"), (1, ShapeError, "n_expert_used")]
    for count, err, what in cases:
        orig = gguf.GGUFWriter.add_expert_count
        with monkeypatch.context() as mp:
            fake = lambda w, n, c=count, add=orig: add(w, c)  # noqa: E731
            mp.setattr(gguf.GGUFWriter, "add_expert_count", fake)
            path = write_gguf_model(tmp_path / f"bad{count}.gguf", dtype="F32", **shape)
        with pytest.raises(err, match=what):
            load_model(path)


def test_info_describes_the_experts(synth_gguf, capsys):
    from powerinfer_rs.info import report

    kw = MOE_ARCHS["qwen2moe"]
    m = load_model(synth_gguf(dtype="F32", activation="silu", arch="qwen2moe", **kw))
    text = report(m, 1 << 30, None, 512)
    assert "experts      8 per layer of FFN 64, 2 per token (softmax)" in text
    assert "shared expert of FFN 96" in text
    # The modes' lines follow the engine's table: threshold runs inside experts (the CPU and
    # the GPU side), the input mode does not (the engine's own refusal).
    assert re.search(r"threshold\s+yes, with per-layer thresholds.*inside each routed expert", text)
    assert "input mode inside experts is not implemented yet" in text
    assert "not yet for mixtures of experts" not in text
    assert "a mixture of experts is planned from its profile" in text
    assert "not supported yet" not in text


HF_MOE = [a for a in MOE_ARCHS if a != "smallthinker"]


@pytest.mark.parametrize("arch", HF_MOE)
@pytest.mark.parametrize("shards", [1, 2])
def test_hf_checkpoints_are_the_gguf_model(synth_hf, synth_gguf, arch, shards):
    """Each family's Hugging Face directory (one tensor per expert, as transformers saves
    them; the loader merges them into the 3-D layout) is the model of its GGUF conversion."""
    kw = MOE_ARCHS[arch]
    hf = load_model(synth_hf(dtype="f32", shards=shards, activation="silu", arch=arch, **kw))
    gg = load_model(synth_gguf(dtype="F32", activation="silu", arch=arch, **kw))
    assert hf.config.arch == arch
    for k in ("n_expert", "n_expert_used", "expert_ffn_dim", "shared_ffn_dim"):
        assert getattr(hf.config, k) == getattr(gg.config, k), k
    assert hf.config.expert_norm_weights == gg.config.expert_norm_weights
    assert hf.tensors["blk.1.ffn_down_exps"].rows == gg.tensors["blk.1.ffn_down_exps"].rows
    ids = ids_for(hf)
    ref = reference_logits(gg, ids)
    assert rel(reference_logits(hf, ids), ref) <= 1e-9
    assert rel(exact_kv_engine(hf, threads=2).logits(ids), ref) <= REF_RTOL


def test_hf_configs_name_their_routing(synth_hf, tmp_path):
    """HF checkpoints route as their config.json says (Qwen3-MoE's norm_topk_prob); dense
    layers in a Qwen MoE, and a checkpoint missing an expert, are refused."""
    import json
    import shutil

    from powerinfer_rs.loading.hf_loader import config_from_hf

    src = synth_hf(dtype="f32", activation="silu", arch="qwen3moe", **MOE_ARCHS["qwen3moe"])
    d = tmp_path / "hf"
    shutil.copytree(src, d)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["norm_topk_prob"] is True
    on = load_model(d)
    ids = ids_for(on, n=8)
    ref_on = reference_logits(on, ids)
    cfg["norm_topk_prob"] = False
    (d / "config.json").write_text(json.dumps(cfg))
    off = load_model(d)
    assert not off.config.expert_norm_weights
    ref_off = reference_logits(off, ids)
    assert rel(ref_off, ref_on) > 100 * REF_RTOL
    assert rel(exact_kv_engine(off, threads=2).logits(ids), ref_off) <= REF_RTOL
    with pytest.raises(UnsupportedError, match="dense layers"):
        config_from_hf({**cfg, "mlp_only_layers": [0]})
    # A missing expert: typed error naming the tensor.
    from safetensors.numpy import load_file, save_file

    st = d / "model.safetensors"
    t = load_file(str(st))
    del t["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(t, str(st), {"format": "pt"})
    with pytest.raises(ModelFileError, match="blk.1.ffn_up_exps.*missing \\[5\\]"):
        load_model(d)
