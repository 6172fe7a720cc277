"""RoPE scaling and partial RoPE (python/powerinfer_rs/loading/rope.py), end to end.

Synthetic models (dim 64, 4 heads of 16) with Llama 3.1's "llama3" frequency factors (GGUF:
the ``rope_freqs.weight`` tensor llama.cpp's converter writes; HF: ``rope_scaling``), linear
scaling, and partial RoPE (GGUF ``rope.dimension_count``, HF ``partial_rotary_factor``). A low
base (500) and a short original context (64) put the factors far from 1 over most pairs, so
over the 48-token prompts the scaling moves every logit (checked: without it the logits are
far from llama.cpp's and from the reference's).

* against llama.cpp (F32 weights and KV cache): logits within 1e-4 at every position and 32
  greedy tokens identical, for the variants llama.cpp runs: llama.cpp's llama (and qwen2)
  graphs refuse ``n_rot`` below the head size, so partial RoPE is checked there on Phi-3
  (NeoX pairs), the "norm" pairing of a llama GGUF against the float64 reference only;
  Gemma 3 with linear scaling (its sliding layers keep their own, unscaled base) under the
  GELU rule of test_architectures_llamacpp.py;
* the HF directory against the float64 reference (tests/reference.py, HF's rotary embedding)
  and against its GGUF conversion, and the loader's frequencies against HF's
  ``_compute_llama3_parameters`` / linear ``inv_freq`` transcribed here;
* malformed and unsupported input: each a typed error (ShapeError, ModelFileError,
  UnsupportedError naming the type), from the loaders and from the Rust core.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import gguf
import numpy as np
import pytest

from powerinfer_rs import _core
from powerinfer_rs.errors import ModelFileError, ShapeError, UnsupportedError
from powerinfer_rs.loading import LoadedModel, load_model
from powerinfer_rs.runtime.engine import core_model_arguments
from powerinfer_rs.testing import synth
from powerinfer_rs.testing.synth_model import SynthSpec

from _helpers import engine_greedy, llama_greedy, rel
from reference import exact_kv_engine, reference_logits, rope_inv_freq

#: Pair wavelengths 6.3, 13.6, 29, 65, ... against 64/8 and 64/1: two pairs between them.
LLAMA3 = dict(
    rope_theta=500.0,
    rope_scaling="llama3",
    rope_factor=8.0,
    rope_high_freq_factor=8.0,
    rope_original_context=64,
)
LINEAR = dict(rope_theta=500.0, rope_scaling="linear", rope_factor=4.0)
PARTIAL = dict(rope_theta=500.0, partial_rotary=0.5)
#: name -> (family, synth arguments)
VARIANTS: dict[str, tuple[str, dict]] = {
    "llama-llama3": ("llama", LLAMA3),
    "llama-linear": ("llama", LINEAR),
    "llama-partial": ("llama", PARTIAL),
    "llama-partial-llama3": ("llama", {**LLAMA3, "partial_rotary": 0.5}),
    "phi3-partial": ("phi3", PARTIAL),
    "phi3-partial-linear": ("phi3", {**PARTIAL, "rope_scaling": "linear", "rope_factor": 3.0}),
    "qwen2-linear": ("qwen2", LINEAR),
    # Layers 0-4 slide with Gemma 3's local base 10000, unscaled; layer 5 is global, scaled.
    "gemma3-linear": ("gemma3", {**LINEAR, "sliding_window": 4, "tie": True, "layers": 6}),
}
#: The variants llama.cpp runs (its llama graph refuses partial RoPE).
LLAMA_CPP = [v for v in VARIANTS if not v.startswith("llama-partial")]
GELU = ("gemma3",)
N_PROMPT = 48
REF_RTOL = 1e-5
LOGITS_ATOL = 1e-4


def synth_args(variant: str) -> dict:
    arch, kw = VARIANTS[variant]
    return {"arch": arch, "activation": "gelu" if arch in GELU else "silu", "seed": 11, **kw}


def prompt(model, n: int = N_PROMPT) -> list[int]:
    return [int(t) for t in np.random.default_rng(2).integers(3, model.config.vocab_size, n)]


def without_rope_scaling(m: LoadedModel) -> LoadedModel:
    """``m`` with plain RoPE over whole heads (the reference caches weights per fingerprint)."""
    cfg = m.config.replace(rope_dims=0, rope_linear_factor=0.0, rope_freq_factors=[])
    return dataclasses.replace(m, config=cfg, fingerprint=m.fingerprint + "-plain-rope")


def hf_inv_freq(cfg: dict) -> np.ndarray:
    """``inv_freq`` as transformers' modeling_rope_utils computes it from ``config.json``:
    the default over ``int(head_dim * partial_rotary_factor)`` dims, "linear" divides it by
    the factor, "llama3" as ``_compute_llama3_parameters``."""
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dim = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        llama = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, llama)
    assert kind is None
    return inv


# --------------------------------------------------------------------------- llama.cpp
@pytest.mark.parametrize("variant", LLAMA_CPP)
def test_gguf_matches_llama_cpp(synth_gguf, variant):
    pytest.importorskip("llama_cpp")
    from test_architectures_llamacpp import open_llama, reference_with_f16_gelu

    path = synth_gguf(dtype="F32", **synth_args(variant))
    model = load_model(path)
    c = model.config
    assert (c.rope_dims, c.rope_linear_factor, bool(c.rope_freq_factors)) != (0, 0.0, False)
    ids = prompt(model)
    llm = open_llama(path, 128)
    llm.eval(ids)
    want = np.asarray(llm.scores[: len(ids)])
    eng = exact_kv_engine(model, threads=2)
    got = eng.logits(ids)
    if VARIANTS[variant][0] in GELU:
        # ggml's f16 GELU table: the reference with that rounding matches llama.cpp.
        assert rel(reference_with_f16_gelu(model, ids), want) <= 2e-5
        assert rel(got, reference_logits(model, ids)) <= REF_RTOL
        assert rel(got, want) <= 1e-4
        plain = reference_with_f16_gelu(without_rope_scaling(model), ids)
        assert rel(plain, want) > 100 * 2e-5
    else:
        worst = np.abs(got - want).max(axis=1)
        assert worst.max() <= LOGITS_ATOL, f"per position: {worst}"
        # The scaling matters here: plain RoPE is far from llama.cpp at most positions.
        plain = reference_logits(without_rope_scaling(model), ids)
        far = np.abs(plain - want).max(axis=1)
        assert far.max() > 100 * LOGITS_ATOL and (far > 10 * LOGITS_ATOL).mean() > 0.8, far

    # 32 greedy tokens on both sides from the same prompt.
    assert engine_greedy(eng, ids, 32) == llama_greedy(llm, ids, 32)


def test_llama3_rope_freqs_are_the_converters(synth_gguf, synth_hf):
    """The GGUF's rope_freqs tensor holds llama.cpp's converter's factors for the config.json
    our HF writer makes (computed here as convert_hf_to_gguf.py does, in float32), and both
    loaders read the same ones."""
    kw = synth_args("llama-llama3")
    gg = load_model(synth_gguf(dtype="F32", **kw))
    d = synth_hf(dtype="f32", **kw)
    cfg = json.loads((d / "config.json").read_text())
    rs = cfg["rope_scaling"]
    f32 = np.float32
    freqs = f32(1) / (f32(cfg["rope_theta"]) ** (np.arange(0, 16, 2, dtype=f32) / f32(16)))
    old = cfg.get("original_max_position_embeddings", 8192)  # the converter reads it there
    lo, hi, factor = rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
    want = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < old / hi:
            want.append(1.0)
        elif wavelen > old / lo:
            want.append(factor)
        else:
            smooth = (f32(old) / wavelen - f32(lo)) / f32(hi - lo)
            want.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    want = np.asarray(want, dtype=np.float32)
    assert gg.config.rope_freq_factors == [float(x) for x in want]
    assert load_model(d).config.rope_freq_factors == gg.config.rope_freq_factors
    # Far from 1 and not all equal: every regime of the formula is present.
    assert want.min() == 1.0 and want.max() == factor and len(set(want.tolist())) >= 4


# --------------------------------------------------------------------------- HF and reference
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hf_dir_matches_the_reference_and_its_gguf(synth_hf, synth_gguf, variant):
    kw = synth_args(variant)
    d = synth_hf(dtype="f32", **kw)
    hf = load_model(d)
    gg = load_model(synth_gguf(dtype="F32", **kw))
    fields = ("rope_dims", "rope_linear_factor", "rope_freq_factors")
    assert [getattr(hf.config, f) for f in fields] == [getattr(gg.config, f) for f in fields]
    # The loader's frequencies are HF's.
    cfg = json.loads((d / "config.json").read_text())
    c = hf.config
    ours = rope_inv_freq(c.rope_theta, c.rotary_dims, c.rope_linear_factor, c.rope_freq_factors)
    np.testing.assert_allclose(ours, hf_inv_freq(cfg), rtol=1e-6)

    ids = prompt(hf, 40)
    ref = reference_logits(hf, ids)
    hf_logits = exact_kv_engine(hf, threads=2).logits(ids)
    gg_logits = exact_kv_engine(gg, threads=2).logits(ids)
    assert rel(hf_logits, ref) <= REF_RTOL
    assert np.abs(gg_logits - hf_logits).max() <= LOGITS_ATOL
    assert rel(reference_logits(gg, ids), ref) <= 1e-9
    # Without its scaling (or with whole heads rotating) the model is another function.
    assert rel(reference_logits(without_rope_scaling(hf), ids), ref) > 100 * REF_RTOL


@pytest.mark.parametrize("field", ["rope_dims", "rope_linear_factor", "rope_freq_factors"])
def test_each_rope_field_changes_the_function(synth_hf, field):
    """Each field matters, so the tests above fail when one is dropped, by the loaders or by
    the engine: the model without it gives other logits, and the engine follows the config."""
    variant = "llama-linear" if field == "rope_linear_factor" else "llama-partial-llama3"
    m = load_model(synth_hf(dtype="f32", **synth_args(variant)))
    ids = prompt(m, 32)
    ref = reference_logits(m, ids)
    assert getattr(m.config, field)
    off = {"rope_dims": 0, "rope_linear_factor": 0.0, "rope_freq_factors": []}[field]
    if field == "rope_dims":  # whole heads: the factors then cover twice the pairs
        m.config.rope_freq_factors = m.config.rope_freq_factors * 2
    setattr(m.config, field, off)
    m.fingerprint += f"-without-{field}"
    other = reference_logits(m, ids)
    assert rel(other, ref) > 100 * REF_RTOL
    assert rel(exact_kv_engine(m, threads=2).logits(ids), other) <= REF_RTOL


# --------------------------------------------------------------------------- synth CLI
def test_synth_cli_writes_rope_scaling(tmp_path):
    common = ["--dim", "64", "--ffn", "128", "--layers", "2", "--heads", "4", "--vocab", "300"]
    rope = ["--rope-theta", "500", "--rope-scaling", "llama3", "--rope-original-context", "64"]
    rope += ["--partial-rotary-factor", "0.5", "--activation", "silu"]
    assert (
        synth.main([*common, *rope, "--format", "gguf-f32", "--out", str(tmp_path / "m.gguf")]) == 0
    )
    assert (
        synth.main(
            [*common, *rope, "--format", "hf", "--dtype", "f32", "--out", str(tmp_path / "hf")]
        )
        == 0
    )
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.F32 and list(t.shape) == [4]
    assert reader.fields["llama.rope.dimension_count"].contents() == 8
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["partial_rotary_factor"] == 0.5
    assert cfg["rope_scaling"]["rope_type"] == "llama3"
    g, h = load_model(tmp_path / "m.gguf"), load_model(tmp_path / "hf")
    assert g.config.rope_dims == h.config.rope_dims == 8
    assert g.config.rope_freq_factors == h.config.rope_freq_factors
    ids = prompt(g, 24)
    assert (
        rel(exact_kv_engine(g, threads=2).logits(ids), exact_kv_engine(h, threads=2).logits(ids))
        <= 1e-5
    )
    with pytest.raises(SystemExit):
        synth.main([*common, "--rope-scaling", "dynamic", "--out", str(tmp_path / "x")])


# --------------------------------------------------------------------------- errors
SMALL = dict(dim=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=300, activation="silu")


def write_gguf(tmp_path, monkeypatch, name: str, *, factors=None, dims=None, meta=None, **kw):
    """A llama3 GGUF written by the synthetic writer with one thing broken: the rope_freqs
    values, the rope.dimension_count written, or extra metadata ``{key suffix: value}``."""
    with monkeypatch.context() as mp:
        if factors is not None:
            mp.setattr(SynthSpec, "llama3_factors", lambda self: list(factors))
        if dims is not None:
            orig = gguf.GGUFWriter.add_rope_dimension_count
            mp.setattr(gguf.GGUFWriter, "add_rope_dimension_count", lambda w, n: orig(w, dims))
        if meta:
            orig_ctx = gguf.GGUFWriter.add_context_length

            def add_meta(w, n):
                orig_ctx(w, n)
                for k, v in meta.items():
                    key = f"llama.{k}"
                    if isinstance(v, str):
                        w.add_string(key, v)
                    else:
                        w.add_float32(key, v)

            mp.setattr(gguf.GGUFWriter, "add_context_length", add_meta)
        args = {**SMALL, **LLAMA3, **kw}
        return synth.write_gguf_model(tmp_path / f"{name}.gguf", dtype="F32", **args)


def test_gguf_malformed_rope_is_a_typed_error(tmp_path, monkeypatch):
    good = [1.0, 1.0, 2.0, 8.0, 8.0, 8.0, 8.0, 8.0]
    assert (
        load_model(write_gguf(tmp_path, monkeypatch, "ok", factors=good)).config.rope_freq_factors
        == good
    )
    for n in (7, 9):
        p = write_gguf(tmp_path, monkeypatch, f"len{n}", factors=[1.0] * n)
        with pytest.raises(ShapeError, match=rf"rope_freqs.*\[{n}\].*expected \[8\]"):
            load_model(p)
    for i, bad in enumerate([0.0, -1.0, math.nan, math.inf]):
        p = write_gguf(tmp_path, monkeypatch, f"bad{i}", factors=good[:3] + [bad] + good[4:])
        with pytest.raises(ModelFileError, match="factor 3 is"):
            load_model(p)
    for n in (7, 18, 0):
        p = write_gguf(tmp_path, monkeypatch, f"dims{n}", dims=n, rope_scaling="none")
        with pytest.raises(ShapeError, match="dimension_count"):
            load_model(p)
    # Partial RoPE: the factors cover the rotated pairs only.
    p = write_gguf(tmp_path, monkeypatch, "partial", dims=8, factors=good)
    with pytest.raises(ShapeError, match=r"expected \[4\]"):
        load_model(p)
    for bad in (-2.0, math.nan, math.inf):
        p = write_gguf(tmp_path, monkeypatch, f"factor{bad}", meta={"rope.scaling.factor": bad})
        with pytest.raises(ModelFileError, match="rope.scaling.factor"):
            load_model(p)


@pytest.mark.parametrize("kind", ["su", "llama3", "dynamic"])
def test_gguf_unsupported_scaling_names_the_type(tmp_path, monkeypatch, kind):
    """Types llama.cpp does not read from a GGUF file (YaRN and LongRoPE:
    test_rope_yarn_longrope.py)."""
    meta = {"rope.scaling.type": kind, "rope.scaling.factor": 4.0}
    p = write_gguf(tmp_path, monkeypatch, kind, meta=meta, rope_scaling="none")
    with pytest.raises(UnsupportedError, match=f"RoPE scaling type '{kind}'"):
        load_model(p)


def test_gguf_linear_scaling_as_llama_cpp_reads_it(tmp_path, monkeypatch):
    """No scaling type means llama.cpp's default, linear; "none" ignores the factor; the old
    rope.scale_linear key is the factor when rope.scaling.factor is absent."""
    p = write_gguf(
        tmp_path, monkeypatch, "t0", meta={"rope.scaling.factor": 2.5}, rope_scaling="none"
    )
    assert load_model(p).config.rope_linear_factor == 2.5
    meta = {"rope.scaling.type": "none", "rope.scaling.factor": 2.5}
    p = write_gguf(tmp_path, monkeypatch, "t1", meta=meta, rope_scaling="none")
    assert load_model(p).config.rope_linear_factor == 0.0
    p = write_gguf(
        tmp_path, monkeypatch, "t2", meta={"rope.scale_linear": 3.0}, rope_scaling="none"
    )
    assert load_model(p).config.rope_linear_factor == 3.0


def _hf_copy(synth_hf, tmp_path, name: str):
    d = shutil.copytree(synth_hf(dtype="f32", **synth_args("llama-llama3")), tmp_path / name)
    return d, json.loads((d / "config.json").read_text())


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"rope_scaling": {"rope_type": "ntk", "factor": 4.0}}, UnsupportedError, "'ntk'"),
        ({"rope_scaling": {"type": "dynamic"}}, ModelFileError, "factor"),
        ({"rope_scaling": {"type": "longrope", "long_factor": [1]}}, ModelFileError, "short_fac"),
        (
            {"rope_scaling": {"type": "su", "short_factor": [1], "long_factor": [1]}},
            ShapeError,
            "short_factor",
        ),
        ({"rope_scaling": {"factor": 2.0}}, UnsupportedError, "None"),
        ({"rope_scaling": "linear"}, ModelFileError, "rope_scaling"),
        ({"rope_scaling": {"type": "linear", "factor": 0}}, ModelFileError, "factor"),
        ({"rope_scaling": {"type": "linear", "factor": "2"}}, ModelFileError, "factor"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ModelFileError, "low_freq"),
        ({"partial_rotary_factor": 0.3125}, ShapeError, "5 values"),  # 16 * 0.3125 = 5: odd
        ({"partial_rotary_factor": 0.05}, ShapeError, "0 values"),
        ({"partial_rotary_factor": 1.5}, ModelFileError, "above 1"),
        ({"partial_rotary_factor": 0}, ModelFileError, "positive"),
        ({"rope_theta": -500.0}, ModelFileError, "rope_theta"),
    ],
)
def test_hf_bad_rope_config_is_a_typed_error(synth_hf, tmp_path, change, error, match):
    d, cfg = _hf_copy(synth_hf, tmp_path, "m")
    (d / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(error, match=match):
        load_model(d)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("low_freq_factor", 8.0, "above low_freq_factor"),
        ("high_freq_factor", 0.5, "above low_freq_factor"),
        ("factor", -8.0, "'factor'"),
        ("factor", math.nan, "'factor'"),
        ("original_max_position_embeddings", 0, "original_max_position_embeddings"),
    ],
)
def test_hf_bad_llama3_values_are_model_file_errors(synth_hf, tmp_path, key, value, match):
    d, cfg = _hf_copy(synth_hf, tmp_path, "m")
    cfg["rope_scaling"] = {**cfg["rope_scaling"], key: value}
    (d / "config.json").write_text(json.dumps(cfg))  # NaN is written as NaN, json reads it
    with pytest.raises(ModelFileError, match=match):
        load_model(d)


def test_rust_core_refuses_bad_rope_fields(synth_gguf):
    """The Rust core checks the same fields itself: a typed ShapeError, never a panic."""
    m = load_model(synth_gguf(dtype="F32", **synth_args("llama-llama3")))
    cfg, tensors = core_model_arguments(m)
    _core.Model(cfg, tensors)  # the good case builds
    factors = cfg.rope_freq_factors
    for change in (
        {"rope_dims": 7},
        {"rope_dims": 18},
        {"rope_dims": 8},  # the 8 factors then cover twice the rotated pairs
        {"rope_freq_factors": factors[:-1]},
        {"rope_freq_factors": factors[:-1] + [0.0]},
        {"rope_freq_factors": factors[:-1] + [math.nan]},
        {"rope_freq_factors": factors[:-1] + [-math.inf]},
        {"rope_linear_factor": -2.0},
        {"rope_linear_factor": math.inf},
    ):
        with pytest.raises(ShapeError, match="(?i)rope"):
            _core.Model(cfg.replace(**change), tensors)
