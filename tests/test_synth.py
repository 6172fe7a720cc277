"""Synthetic model writer: bf16 rounding, tokenizer, determinism, planted power law, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerinfer_rs.errors import ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.testing import synth, synth_model

from reference import reference_forward


def test_bf16_rounding():
    x = np.array(
        [
            1.0,
            -2.0,
            1 + 2**-8,
            1 + 3 * 2**-8,
            1 + 2**-8 + 2**-20,
            3.0e38,
            0.0,
            np.inf,
            -np.inf,
            np.nan,
        ],
        dtype=np.float32,
    )
    bits = synth_model.f32_to_bf16_bits(x)
    # 1+2^-8 is a tie -> even (1.0); 1+3*2^-8 is a tie -> even (1+2^-6)
    assert bits[:5].tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F82, 0x3F81]
    assert bits[7] == 0x7F80 and bits[8] == 0xFF80
    assert np.isnan(synth_model.bf16_bits_to_f32(bits)[9])
    rng = np.random.default_rng(0)
    y = rng.standard_normal(10000).astype(np.float32)
    back = synth_model.bf16_bits_to_f32(synth_model.f32_to_bf16_bits(y))
    assert np.all(np.abs(back - y) <= np.abs(y) * 2**-8)


def test_byte_level_vocab():
    tokens, merges = synth_model.byte_level_vocab(1000)
    assert len(tokens) == len(set(tokens)) == 1000
    assert len(merges) == 1000 - 259
    have = set(tokens[:259])
    for a, b in merges:  # every merge joins two earlier tokens
        assert a in have and b in have
        have.add(a + b)
    with pytest.raises(ShapeError):
        synth_model.byte_level_vocab(100)
    tok = synth_model.build_tokenizer(1000)
    assert tok.get_vocab_size() == 1000


def test_zipf_frequencies():
    p = synth_model.zipf_frequencies(5504, 0.1)
    assert abs(p.mean() - 0.1) < 1e-6
    assert p[0] == pytest.approx(0.98) and np.all(np.diff(p) <= 0)
    top = np.sort(p)[::-1]
    assert top[: len(p) // 10].sum() > 0.5 * p.sum()  # power law: top 10% carry most mass


def test_deterministic(tmp_path):
    kw = dict(dim=64, ffn=96, layers=1, heads=4, kv_heads=4, vocab=280)
    a = synth.write_hf_model(tmp_path / "a", seed=3, **kw)
    b = synth.write_hf_model(tmp_path / "b", seed=3, **kw)
    c = synth.write_hf_model(tmp_path / "c", seed=4, **kw)
    fa, fb, fc = (p / "model.safetensors" for p in (a, b, c))
    assert fa.read_bytes() == fb.read_bytes() != fc.read_bytes()
    assert load_model(a).fingerprint == load_model(b).fingerprint != load_model(c).fingerprint
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_act"] == "relu"


def test_planted_power_law(tmp_path):
    shape = dict(dim=128, ffn=512, layers=2, heads=4, kv_heads=4, vocab=400, seed=1, active=0.1)
    d = synth.write_hf_model(tmp_path / "m", dtype="f32", **shape)
    m = load_model(d)
    toks = np.random.default_rng(0).integers(3, 400, size=256).tolist()
    _, gates = reference_forward(m, toks)
    gen = synth_model.SynthWeights(synth_model.SynthSpec(**shape))
    for layer in range(2):
        freq = (gates[layer] > 0).mean(axis=0)
        planted = gen.firing_probabilities(layer)
        assert 0.05 < freq.mean() < 0.2, freq.mean()
        # the measured frequencies follow the planted ones neuron by neuron
        assert np.corrcoef(freq, planted)[0, 1] > 0.9
        assert np.abs(freq - planted).mean() < 0.05
        hot = np.argsort(-freq)[: 512 // 10]
        assert freq[hot].sum() > 0.4 * freq.sum()


def test_gate_noise_keeps_the_planted_law(tmp_path):
    """gate_noise: layer 0 still fires at the planted rates (here the ReluLLaMA-like 30%
    regime), as closely as without noise; the gate's non-bias part is no longer low rank;
    every other tensor is unchanged; the share is validated."""
    shape = dict(dim=128, ffn=512, layers=1, heads=4, kv_heads=4, vocab=400, seed=2)
    shape.update(active=0.3, gate_rank=16)
    toks = np.random.default_rng(1).integers(3, 400, size=512).tolist()
    err, gens = {}, {}
    for noise in (0.0, 0.25):
        d = synth.write_hf_model(tmp_path / f"m{noise}", dtype="f32", gate_noise=noise, **shape)
        _, gates = reference_forward(load_model(d), toks)
        gen = gens[noise] = synth_model.SynthWeights(
            synth_model.SynthSpec(gate_noise=noise, **shape)
        )
        freq, planted = (gates[0] > 0).mean(axis=0), gen.firing_probabilities(0)
        assert 0.27 < freq.mean() < 0.33, freq.mean()
        assert np.corrcoef(freq, planted)[0, 1] > 0.95
        err[noise] = np.abs(freq - planted).mean()
    assert err[0.25] < 0.06 and err[0.25] < err[0.0] + 0.01, err
    # full rank with noise: singular values past gate_rank carry a good part of the spectrum;
    # without it the non-bias part is exactly of rank 16
    sv = {
        k: np.linalg.svd(g.tensor("blk.0.ffn_gate")[:, 1:], compute_uv=False)
        for k, g in gens.items()
    }
    assert sv[0.25][16] > 0.2 * sv[0.25][0] and sv[0.25][100] > 0.1 * sv[0.25][0]
    assert sv[0.0][16] < 1e-4 * sv[0.0][0]
    assert np.array_equal(gens[0.0].tensor("blk.0.ffn_up"), gens[0.25].tensor("blk.0.ffn_up"))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ShapeError):
            synth_model.SynthSpec(gate_noise=bad, **shape).validate()


def test_gguf_needs_blocks(tmp_path):
    tiny = dict(layers=1, heads=4, kv_heads=4, vocab=300)
    with pytest.raises(ShapeError):
        synth.write_gguf_model(tmp_path / "x.gguf", dim=48, ffn=96, dtype="Q4_0", **tiny)
    with pytest.raises(UnsupportedError):
        synth.write_gguf_model(tmp_path / "x.gguf", dim=64, ffn=96, dtype="IQ2_XXS", **tiny)
    with pytest.raises(UnsupportedError):
        synth.write_hf_model(tmp_path / "y", dim=64, ffn=96, dtype="f64", **tiny)


def test_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        synth.main(["--help"])
    assert e.value.code == 0
    assert "--active" in capsys.readouterr().out
    out = tmp_path / "m.gguf"
    args = [
        "--dim",
        "64",
        "--ffn",
        "128",
        "--layers",
        "1",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--vocab",
        "300",
        "--format",
        "gguf-q8_0",
        "--out",
        str(out),
    ]
    assert synth.main(args) == 0
    m = load_model(out)
    assert m.tensors["blk.0.ffn_up"].dtype == "Q8_0" and m.config.n_kv_heads == 2
    assert (
        synth.main(
            [
                "--format",
                "hf",
                "--dtype",
                "f16",
                "--dim",
                "64",
                "--ffn",
                "96",
                "--layers",
                "1",
                "--heads",
                "4",
                "--vocab",
                "300",
                "--shards",
                "2",
                "--out",
                str(tmp_path / "hf"),
            ]
        )
        == 0
    )
    assert load_model(tmp_path / "hf").tensors["token_embd"].dtype == "F16"
    assert synth.main(["--dim", "30", "--heads", "4", "--out", str(tmp_path / "bad")]) == 2
