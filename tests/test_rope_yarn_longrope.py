"""YaRN, LongRoPE and dynamic NTK (python/powerinfer_rs/loading/rope.py), end to end.

Synthetic models (dim 64, 4 heads of 16, RoPE base 500) with an original context of 64 run
160 tokens, so most positions lie past it:

* YaRN (llama, qwen2, qwen3: ``rope.scaling.type = yarn``, ``factor`` 4 and
  ``original_context_length`` 64, the keys llama.cpp's converter writes) and Phi-3's LongRoPE
  (the ``rope_factors_short`` / ``rope_factors_long`` tensors and ``rope.scaling.attn_factor``
  its converter writes; the long factors at a context of 256, the short ones at 64) against
  llama.cpp (F32 weights and KV cache): logits within 1e-4 at every position, as in
  test_rope_scaling.py; without the scaling the logits are far from llama.cpp's;
* the frequencies and the magnitude against float64 transcriptions written here of
  transformers' ``_compute_yarn_parameters`` / ``_compute_longrope_parameters`` and of ggml's
  ``rope_yarn`` (its angle blend, ``ggml_rope_yarn_corr_dims``), and the model through the
  float64 reference (tests/reference.py) with those independent frequencies, against which
  llama.cpp and the engine are measured alike;
* config.json's rope_scaling for every type mapped to the same fields (dicts), the HF
  directories against their GGUF conversions, and typed errors.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.rope import gguf_rope_fields, hf_rope_fields
from powerinfer_rs.testing import synth

from _helpers import decode_logits, rel
from reference import exact_kv_engine, reference_logits

ORIGINAL = 64
YARN = dict(rope_theta=500.0, rope_scaling="yarn", rope_factor=4.0, rope_original_context=64)
LONGROPE = dict(
    rope_theta=500.0, rope_scaling="longrope", rope_factor=8.0, rope_original_context=64
)
#: name -> (family, synth arguments, context, tokens)
VARIANTS: dict[str, tuple[str, dict, int, int]] = {
    "llama-yarn": ("llama", YARN, 256, 160),
    "qwen2-yarn": ("qwen2", YARN, 256, 160),
    "qwen3-yarn": ("qwen3", YARN, 256, 160),
    "phi3-longrope-long": ("phi3", LONGROPE, 256, 160),
    # llama.cpp pads its context to a multiple of 256: the short factors from an original 256.
    "phi3-longrope-short": ("phi3", {**LONGROPE, "rope_original_context": 256}, 256, 160),
}
LOGITS_ATOL = 1e-4


def synth_args(variant: str) -> dict:
    arch, kw, _, _ = VARIANTS[variant]
    return {"arch": arch, "activation": "silu", "seed": 11, "max_context": 512, **kw}


def prompt(vocab: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(2).integers(3, vocab, n)]


def with_rope(m, fingerprint: str, **fields):
    """``m`` with its config's RoPE fields changed (the reference caches per fingerprint)."""
    cfg = m.config.replace(**fields)
    return dataclasses.replace(m, config=cfg, fingerprint=m.fingerprint + fingerprint)


# --------------------------------------------------------------------------- float64 rules
def hf_yarn(theta, dim, rs: dict, max_pos: int) -> tuple[np.ndarray, float]:
    """transformers' ``_compute_yarn_parameters`` (4.57) in float64: ``(inv_freq,
    attention_factor)``."""
    factor = rs["factor"]
    orig = rs.get("original_max_position_embeddings") or max_pos

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = rs.get("attention_factor")
    if attn is None:
        m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attn = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def corr(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = corr(fast), corr(slow)
    if rs.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    pos_freqs = theta ** (np.arange(0, dim, 2) / dim)
    extra = 1 - ramp
    inv = (1 / (factor * pos_freqs)) * (1 - extra) + (1 / pos_freqs) * extra
    return inv, attn


def ggml_yarn_angles(pos: int, theta, n_dims, factor, n_ctx_orig) -> tuple[np.ndarray, float]:
    """ggml's ``rope_yarn`` (CPU ops.cpp) in float64 for llama.cpp's YaRN defaults
    (ext_factor 1, beta 32 / 1): the angle of each pair at ``pos`` and the magnitude on cos and
    sin (``attn_factor = get_mscale(factor) / (1 + 0.1 ln factor)`` times the kernel's
    ``1 + 0.1 ln(1 / freq_scale)``)."""

    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(0, math.floor(corr_dim(32))), min(n_dims - 1, math.ceil(corr_dim(1)))
    freq_scale = 1 / factor
    out = []
    for i0 in range(0, n_dims, 2):
        theta_extrap = pos * theta ** (-i0 / n_dims)
        theta_interp = freq_scale * theta_extrap
        y = (i0 // 2 - low) / max(0.001, high - low)
        ramp_mix = 1 - min(1, max(0, y))
        out.append(theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix)
    attn = (0.1 * math.log(factor) + 1) / (1 + 0.1 * math.log(factor))
    return np.asarray(out), attn * (1 + 0.1 * math.log(1 / freq_scale))


def hf_longrope(theta, dim, cfg: dict, seq_len: int) -> tuple[np.ndarray, float]:
    """transformers' ``_compute_longrope_parameters`` (4.57) in float64 (Phi-3: the original
    context at the top level of config.json)."""
    rs = cfg["rope_scaling"]
    orig = cfg["original_max_position_embeddings"]
    factor = cfg["max_position_embeddings"] / orig
    attn = rs.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    ext = np.asarray(rs["long_factor"] if seq_len > orig else rs["short_factor"], np.float64)
    return 1.0 / (ext * theta ** (np.arange(0, dim, 2) / dim)), attn


def engine_inv_freq(c) -> np.ndarray:
    """The frequencies the engine turns by: ``theta^(-2i/d) / linear / factors`` (the Rust
    core's ``rope_inv_freqs``), from the config's fields."""
    d = c.rotary_dims
    inv = c.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if c.rope_linear_factor:
        inv = inv / c.rope_linear_factor
    if c.rope_freq_factors:
        inv = inv / np.asarray(c.rope_freq_factors, np.float64)
    return inv


# --------------------------------------------------------------------------- llama.cpp
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gguf_matches_llama_cpp_past_the_original_context(synth_gguf, variant):
    pytest.importorskip("llama_cpp")
    from test_architectures_llamacpp import open_llama

    _, _, n_ctx, n = VARIANTS[variant]
    path = synth_gguf(dtype="F32", **synth_args(variant))
    model = load_model(path)
    ids = prompt(model.config.vocab_size, n)
    llm = open_llama(path, n_ctx)
    llm.eval(ids)
    want = np.asarray(llm.scores[: len(ids)])
    eng = exact_kv_engine(model, threads=2, n_ctx=n_ctx)
    got = eng.logits(ids)
    worst = np.abs(got - want).max(axis=1)
    assert worst.max() <= LOGITS_ATOL, f"per position: {worst}"
    # One token at a time (the decode kernels) as well.
    assert np.abs(decode_logits(eng, ids) - want).max() <= LOGITS_ATOL
    # The scaling matters: plain RoPE (and, for LongRoPE, the other factor set) is far.
    c = model.config
    plain = with_rope(
        model, "-plain", rope_freq_factors=[], rope_long_factors=[], rope_attn_factor=0.0
    )
    far = np.abs(reference_logits(plain, ids) - want).max(axis=1)
    assert far[1:].min() > 10 * LOGITS_ATOL, far  # position 0 attends to itself alone
    past = worst[min(c.rope_original_context or ORIGINAL, n - 1) :].max()
    print(f"{variant}: ours - llama.cpp {worst.max():.2e} (past the original {past:.2e})")
    if c.rope_long_factors:
        other = 512 if n_ctx <= c.rope_original_context else ORIGINAL
        swapped = dataclasses.replace(
            model, config=c.for_context(other), fingerprint=model.fingerprint + f"-{other}"
        )
        far = np.abs(reference_logits(swapped, ids) - want).max(axis=1)
        assert far.max() > 100 * LOGITS_ATOL, far


@pytest.mark.parametrize("variant", ["llama-yarn", "phi3-longrope-long", "phi3-longrope-short"])
def test_llama_cpp_and_engine_against_independent_float64_rope(synth_gguf, synth_hf, variant):
    """The float64 reference with frequencies from the transcriptions above (not the loader's):
    llama.cpp and the engine are both within the same distance of it."""
    pytest.importorskip("llama_cpp")
    from test_architectures_llamacpp import open_llama

    arch, kw, n_ctx, n = VARIANTS[variant]
    path = synth_gguf(dtype="F32", **synth_args(variant))
    model = load_model(path)
    cfg = json.loads((synth_hf(dtype="f32", **synth_args(variant)) / "config.json").read_text())
    c = model.config
    if arch == "phi3":
        inv, attn = hf_longrope(c.rope_theta, c.rotary_dims, cfg, n_ctx)
    else:
        inv, attn = hf_yarn(c.rope_theta, c.rotary_dims, cfg["rope_scaling"], 512)
    plain = c.rope_theta ** (-np.arange(0, c.rotary_dims, 2) / c.rotary_dims)
    indep = with_rope(
        model,
        f"-indep-{n_ctx}",
        rope_freq_factors=[float(x) for x in plain / inv],
        rope_long_factors=[],
        rope_attn_factor=attn,
    )
    ids = prompt(c.vocab_size, n)
    ref = reference_logits(indep, ids)
    llm = open_llama(path, n_ctx)
    llm.eval(ids)
    llama = np.abs(np.asarray(llm.scores[: len(ids)]) - ref).max()
    ours = np.abs(exact_kv_engine(model, threads=2, n_ctx=n_ctx).logits(ids) - ref).max()
    print(f"{variant}: from the float64 reference llama.cpp {llama:.2e}, ours {ours:.2e}")
    assert llama <= LOGITS_ATOL and ours <= LOGITS_ATOL, (llama, ours)


def test_yarn_frequencies_are_hf_and_ggml_rules():
    """The loader's YaRN factors and magnitude (one rule for both formats) against
    transformers' inv_freq and ggml's angles, over bases, sizes, factors, the betas and
    ``truncate``."""
    for theta, dim, factor, orig in [
        (500.0, 16, 4.0, 64),
        (10000.0, 64, 8.0, 2048),
        (1e6, 128, 4.0, 32768),
        (10000.0, 32, 1.5, 512),
    ]:
        meta = {
            "llama.rope.scaling.type": "yarn",
            "llama.rope.scaling.factor": factor,
            "llama.rope.scaling.original_context_length": orig,
            "llama.rope.freq_base": theta,
            "llama.context_length": orig,
        }
        f = gguf_rope_fields(meta, "llama", dim, dim)
        c = dict(rope_theta=theta, rotary_dims=dim, rope_linear_factor=0.0)
        c = type("C", (), {**c, "rope_freq_factors": f["rope_freq_factors"]})
        ours = engine_inv_freq(c)
        angles, mscale = ggml_yarn_angles(1000, theta, dim, factor, orig)
        np.testing.assert_allclose(1000 * ours, angles, rtol=1e-6)
        assert f["rope_attn_factor"] == pytest.approx(mscale, rel=1e-12)
        assert f["max_context"] == int(factor * orig)
        rs = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
        inv, attn = hf_yarn(theta, dim, rs, orig)
        np.testing.assert_allclose(ours, inv, rtol=1e-6)
        hf = hf_rope_fields({"rope_scaling": rs}, dim, theta)
        assert hf["rope_freq_factors"] == f["rope_freq_factors"]
        assert hf["rope_attn_factor"] == pytest.approx(attn)
        # Every regime present: extrapolated, blended, interpolated pairs.
        ff = np.asarray(f["rope_freq_factors"])
        assert ff[0] == 1.0 and ff[-1] == pytest.approx(factor) and ((ff > 1) & (ff < factor)).any()
        # HF's own keys: betas, truncate off, DeepSeek's mscale pair, an explicit factor.
        for extra in (
            {"beta_fast": 16, "beta_slow": 2},
            {"truncate": False},
            {"mscale": 0.707, "mscale_all_dim": 1.0},
            {"attention_factor": 1.25, "beta_fast": 0},
        ):
            rs2 = {**rs, **extra}
            inv, attn = hf_yarn(theta, dim, rs2, orig)
            hf = hf_rope_fields({"rope_scaling": rs2}, dim, theta)
            np.testing.assert_allclose(
                theta ** (-np.arange(0, dim, 2) / dim) / hf["rope_freq_factors"], inv, rtol=1e-6
            )
            assert (hf["rope_attn_factor"] or 1.0) == pytest.approx(attn)


# --------------------------------------------------------------------------- HF
@pytest.mark.parametrize("variant", ["llama-yarn", "qwen2-yarn", "phi3-longrope-long"])
def test_hf_dir_matches_its_gguf_and_the_reference(synth_hf, synth_gguf, variant):
    _, _, n_ctx, _ = VARIANTS[variant]
    hf = load_model(synth_hf(dtype="f32", **synth_args(variant)))
    gg = load_model(synth_gguf(dtype="F32", **synth_args(variant)))
    fields = ("rope_freq_factors", "rope_long_factors", "rope_original_context", "max_context")
    assert [getattr(hf.config, f) for f in fields] == [getattr(gg.config, f) for f in fields]
    assert hf.config.rope_attn_factor == pytest.approx(gg.config.rope_attn_factor, rel=1e-6)
    ids = prompt(hf.config.vocab_size, 96)
    resolved = dataclasses.replace(
        hf, config=hf.config.for_context(n_ctx), fingerprint=hf.fingerprint + f"-{n_ctx}"
    )
    ref = reference_logits(resolved, ids)
    got = exact_kv_engine(hf, threads=2, n_ctx=n_ctx).logits(ids)
    assert rel(got, ref) <= 1e-5
    gg_logits = exact_kv_engine(gg, threads=2, n_ctx=n_ctx).logits(ids)
    assert np.abs(gg_logits - got).max() <= LOGITS_ATOL


def _hf(rs, **top):
    return hf_rope_fields({"rope_scaling": rs, **top}, 16, 500.0)


def test_hf_rope_scaling_types_map_to_the_engine_fields():
    """Each config.json type on dicts: the same fields as the GGUF rules (linear, llama3:
    test_rope_scaling.py), LongRoPE's two factor sets and magnitude, dynamic as plain RoPE."""
    short, long = [1.0] * 8, [float(1 + i) for i in range(8)]
    lr = {"type": "longrope", "short_factor": short, "long_factor": long}
    out = _hf(lr, max_position_embeddings=1024, original_max_position_embeddings=64)
    assert out["rope_freq_factors"] == short and out["rope_long_factors"] == long
    assert out["rope_original_context"] == 64
    assert out["rope_attn_factor"] == pytest.approx(math.sqrt(1 + math.log(16) / math.log(64)))
    # Phi-3's older "su", and transformers 5's original context inside rope_scaling.
    su = _hf(
        {**lr, "type": "su"}, max_position_embeddings=1024, original_max_position_embeddings=64
    )
    assert su == out
    v5 = _hf({**lr, "original_max_position_embeddings": 64}, max_position_embeddings=1024)
    assert v5 == out
    given = _hf({**lr, "attention_factor": 1.5}, max_position_embeddings=1024)
    assert given["rope_attn_factor"] == 1.5 and given["rope_original_context"] == 1024
    # Dynamic NTK: plain RoPE (transformers changes the base only past max_position).
    assert _hf({"type": "dynamic", "factor": 4.0}) == {"rope_dims": 0}
    assert _hf({"rope_type": "linear", "factor": 2.0})["rope_linear_factor"] == 2.0
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    llama3 |= {"high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    assert len(_hf(llama3)["rope_freq_factors"]) == 8
    yarn = _hf({"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=64)
    assert yarn["max_context"] == 256 and yarn["rope_attn_factor"] > 1


@pytest.mark.parametrize(
    ("rs", "error", "match"),
    [
        ({"rope_type": "ntk-by-parts", "factor": 2.0}, UnsupportedError, "'ntk-by-parts'"),
        ({"type": "longrope", "long_factor": [1.0] * 8}, ModelFileError, "short_factor"),
        ({"type": "su", "short_factor": [1.0] * 8, "long_factor": [1.0] * 7}, ShapeError, "7"),
        (
            {"type": "longrope", "short_factor": [0.0] * 8, "long_factor": [1.0] * 8},
            ModelFileError,
            "factor 0",
        ),
        ({"type": "dynamic"}, ModelFileError, "factor"),
        ({"rope_type": "yarn", "factor": -4.0}, ModelFileError, "factor"),
        ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, ModelFileError, "truncate"),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": math.nan}, ModelFileError, "beta_fast"),
    ],
)
def test_hf_bad_scaling_is_a_typed_error(rs, error, match):
    with pytest.raises(error, match=match):
        _hf(rs, max_position_embeddings=1024, original_max_position_embeddings=64)


def test_yarn_needs_a_base_above_one():
    with pytest.raises(ModelFileError, match="rope_theta above 1"):
        yarn = {"rope_type": "yarn", "factor": 2.0}
        hf_rope_fields({"rope_scaling": yarn, "max_position_embeddings": 64}, 16, 1.0)


# --------------------------------------------------------------------------- GGUF rules
def test_gguf_scaling_keys_as_llama_cpp_reads_them():
    """llama.cpp (checked against it): YaRN's yarn_* keys are not read for these families,
    ``rope.scaling.attn_factor`` scales the rotation of any type, "dynamic" is no GGUF type,
    YaRN with factor 1 scales nothing."""
    base = {"llama.context_length": 128, "llama.rope.freq_base": 500.0}
    yarn = {**base, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}
    ignored = {f"llama.rope.scaling.yarn_{k}": 7.0 for k in ("beta_fast", "beta_slow")}
    ignored |= {
        "llama.rope.scaling.yarn_ext_factor": 0.5,
        "llama.rope.scaling.yarn_log_multiplier": 0.3,
    }
    assert gguf_rope_fields({**yarn, **ignored}, "llama", 16, 16) == gguf_rope_fields(
        yarn, "llama", 16, 16
    )
    # No original context: the training one.
    with_orig = {**yarn, "llama.rope.scaling.original_context_length": 128}
    assert gguf_rope_fields(with_orig, "llama", 16, 16) == gguf_rope_fields(yarn, "llama", 16, 16)
    att = gguf_rope_fields({**yarn, "llama.rope.scaling.attn_factor": 1.5}, "llama", 16, 16)
    assert att["rope_attn_factor"] == pytest.approx(1.5 * (0.1 * math.log(4) + 1))
    assert gguf_rope_fields({**base, "llama.rope.scaling.attn_factor": 1.5}, "llama", 16, 16) == {
        "rope_dims": 0,
        "rope_attn_factor": 1.5,
    }
    assert gguf_rope_fields({**yarn, "llama.rope.scaling.factor": 1.0}, "llama", 16, 16) == {
        "rope_dims": 0
    }
    for kind in ("dynamic", "su", "llama3"):
        with pytest.raises(UnsupportedError, match=f"RoPE scaling type '{kind}'"):
            gguf_rope_fields({**yarn, "llama.rope.scaling.type": kind}, "llama", 16, 16)
    with pytest.raises(ModelFileError, match="attn_factor"):
        gguf_rope_fields({**base, "llama.rope.scaling.attn_factor": -1.0}, "llama", 16, 16)


def test_gguf_longrope_tensors_follow_llama_cpp(tmp_path, monkeypatch):
    """LongRoPE's tensors in a llama file load only with ``rope.scaling.type = longrope`` (as
    llama.cpp reads them); beside ``rope_freqs`` they are refused; short factors alone leave
    the long context plain."""
    import gguf

    pairs = 8
    tensors = {
        "rope_factors_long": np.linspace(1, 8, pairs, dtype=np.float32),
        "rope_factors_short": np.linspace(1, 1.5, pairs, dtype=np.float32),
    }
    small = dict(dim=64, ffn=128, layers=2, heads=4, kv_heads=2, vocab=300, activation="silu")

    def write(name, chosen, kind=None):
        with monkeypatch.context() as mp:
            mp.setattr(synth, "_rope_tensors", lambda spec: chosen)
            if kind:
                orig = gguf.GGUFWriter.add_context_length

                def add(w, n):
                    orig(w, n)
                    w.add_string("llama.rope.scaling.type", kind)

                mp.setattr(gguf.GGUFWriter, "add_context_length", add)
            return load_model(
                synth.write_gguf_model(tmp_path / f"{name}.gguf", dtype="F32", **small)
            )

    with pytest.raises(UnsupportedError, match="rope.scaling.type is not 'longrope'"):
        write("plain", tensors)
    m = write("longrope", tensors, "longrope")
    assert m.config.rope_long_factors == [float(x) for x in tensors["rope_factors_long"]]
    assert m.config.rope_freq_factors == [float(x) for x in tensors["rope_factors_short"]]
    assert m.config.rope_original_context == 512  # context_length: no original key
    short = write("short", {"rope_factors_short": tensors["rope_factors_short"]}, "longrope")
    assert short.config.rope_long_factors == [1.0] * pairs
    both = {**tensors, "rope_freqs": tensors["rope_factors_short"]}
    with pytest.raises(UnsupportedError, match="both rope_freqs"):
        write("both", both, "longrope")
    with pytest.raises(ShapeError, match=r"rope_factors_long.*expected \[8\]"):
        write("bad", {**tensors, "rope_factors_long": np.ones(7, np.float32)}, "longrope")


# --------------------------------------------------------------------------- the engine
def test_engine_picks_longrope_factors_by_its_context(synth_gguf):
    """At most the original context: the short factors; past it the long ones (llama.cpp's
    rule, by the context size); the default context (4096, capped by the model's) counts."""
    m = load_model(synth_gguf(dtype="F32", **synth_args("phi3-longrope-long")))
    ids = prompt(m.config.vocab_size, 40)

    def resolved(n):
        return dataclasses.replace(m, config=m.config.for_context(n), fingerprint=f"x{n}")

    short, long = reference_logits(resolved(ORIGINAL), ids), reference_logits(resolved(512), ids)
    assert rel(short, long) > 1e-3
    for n_ctx, want in ((ORIGINAL, short), (ORIGINAL + 1, long), (None, long)):
        got = exact_kv_engine(m, threads=2, n_ctx=n_ctx).logits(ids)
        assert rel(got, want) <= 1e-5, n_ctx
    assert m.config.for_context(ORIGINAL).rope_long_factors == []
