"""The float64 numpy reference: dequantisation, both RoPE styles, the q/k permutation, and the
real SmolLM2 answering " Paris"."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from powerinfer_rs.errors import TokenError
from powerinfer_rs.loading import load_model

from reference import (
    dequantize,
    dequantize_with_gguf,
    greedy_reference,
    reference_forward,
    reference_logits,
    rope,
)

TOKENS = [5, 17, 200, 3, 99, 42, 42, 250, 7, 120, 11]


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_matches_gguf(synth_gguf, dtype):
    m = load_model(synth_gguf(dtype))
    for name in ("token_embd", "blk.0.attn_q", "blk.1.ffn_down", "output_norm"):
        t = m.tensors[name]
        np.testing.assert_array_equal(dequantize(t), dequantize_with_gguf(t))


def test_dequantize_smol(smol):
    for name in ("token_embd", "blk.0.ffn_down", "blk.5.attn_norm"):
        t = smol.tensors[name]
        np.testing.assert_array_equal(dequantize(t), dequantize_with_gguf(t))


def test_hf_neox_equals_gguf_norm_with_permutation(synth_hf, synth_gguf):
    hf = load_model(synth_hf("f32"))
    gg = load_model(synth_gguf("F32"))
    assert (hf.config.rope_style, gg.config.rope_style) == ("neox", "norm")
    a = reference_logits(hf, TOKENS)
    b = reference_logits(gg, TOKENS)
    assert a.shape == (len(TOKENS), 300) and a.dtype == np.float64
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    # and the test is sensitive: the wrong rope style changes the logits
    wrong = copy.copy(gg)
    wrong.config = copy.copy(gg.config)
    wrong.config.rope_style = "neox"
    wrong.fingerprint = gg.fingerprint + "-wrong"
    assert np.abs(reference_logits(wrong, TOKENS) - a).max() > 1e-3


def test_causal(synth_hf):
    m = load_model(synth_hf("f32"))
    full = reference_logits(m, TOKENS)
    part = reference_logits(m, TOKENS[:4])
    np.testing.assert_allclose(part, full[:4], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [("bf16", 0.1), ("f16", 0.01)])
def test_low_precision_close(synth_hf, dtype, tol):
    ref = reference_logits(load_model(synth_hf("f32")), TOKENS)
    low = reference_logits(load_model(synth_hf(dtype)), TOKENS)
    assert np.abs(low - ref).max() < tol * np.abs(ref).max()


@pytest.mark.parametrize("dtype,tol", [("Q8_0", 0.05), ("Q4_1", 0.3)])
def test_quantised_close(synth_gguf, dtype, tol):
    ref = reference_logits(load_model(synth_gguf("F32")), TOKENS)
    q = reference_logits(load_model(synth_gguf(dtype)), TOKENS)
    assert np.abs(q - ref).max() < tol * np.abs(ref).max()


def test_rope_styles_are_permutations():
    rng = np.random.default_rng(0)
    hd = 8
    x = rng.standard_normal((5, 2, hd))
    pos = np.arange(5)
    perm = np.arange(hd).reshape(2, hd // 2).T.reshape(-1)  # neox index of norm slot
    np.testing.assert_allclose(
        rope(x[..., perm], pos, 10000.0, "norm"), rope(x, pos, 10000.0, "neox")[..., perm]
    )
    np.testing.assert_allclose(rope(x, np.zeros(5, int), 1e4, "norm"), x)  # position 0


def test_bad_tokens(synth_hf):
    m = load_model(synth_hf("f32"))
    with pytest.raises(TokenError):
        reference_logits(m, [300])
    with pytest.raises(TokenError):
        reference_logits(m, [])


def test_relu_gates_sparse(synth_hf):
    m = load_model(synth_hf("f32"))
    _, gates = reference_forward(m, TOKENS)
    assert len(gates) == 2 and gates[0].shape == (len(TOKENS), 128)
    frac = float((gates[0] > 0).mean())
    assert 0.02 < frac < 0.3  # planted mean 0.1


def test_smol_paris(smol):
    tok = smol.tokenizer
    ids = tok.encode("The capital of France is")
    out = greedy_reference(smol, ids, 1)
    print("SmolLM2 reference next token:", out, repr(tok.decode(out)))
    assert tok.decode(out) == " Paris"
