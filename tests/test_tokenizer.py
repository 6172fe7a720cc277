"""Tokenizers (GGUF gpt2 BPE, GGUF SentencePiece, tokenizer.json) and chat templates."""

from __future__ import annotations

import warnings

import pytest

from powerinfer_rs.errors import ModelFileError, TokenError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime.chat import CHATML_TEMPLATE, ChatTemplateError, format_chat
from powerinfer_rs.runtime.tokenizer import Tokenizer

TEXTS = [
    "The capital of France is",
    "Hello, world! 1234567890 3.14159",
    "  leading spaces and trailing  ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "unicode: naïve café, Ελληνικά, 日本語, emoji 😀👍🏽",
    "code: def f(x):\n    return x**2  # comment",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "",
]


# --------------------------------------------------------------------------- SmolLM2 (gpt2)
def test_smol_reference_ids(smol):
    # what HF's SmolLM2 tokenizer gives
    assert smol.tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


@pytest.mark.parametrize("text", TEXTS)
def test_smol_round_trip(smol, text):
    tok = smol.tokenizer
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, special=False)) == text


def test_smol_specials(smol):
    tok = smol.tokenizer
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    plain = tok.encode("<|im_start|>", special=False)
    assert len(plain) > 1 and 1 not in plain
    assert tok.is_special(1) and tok.is_special(2) and not tok.is_special(504)
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_id == 1
    assert tok.encode("hi")[0] != 1  # SmolLM2 adds no BOS by default
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "user\nhi"
    # digits are split one by one (the "smollm" pre-tokenizer)
    assert len(tok.encode("2024")) == 4
    assert tok.vocab_size == 49152 and tok.eos_ids == [2]
    assert tok.token_to_id("<|im_start|>") == 1 and tok.token_to_id("no-such-token") is None
    assert tok.id_to_token(504) == "The"


def test_smol_bad_ids(smol):
    tok = smol.tokenizer
    for bad in ([-1], [49152], [10**9]):
        with pytest.raises(TokenError):
            tok.decode(bad)
    with pytest.raises(TokenError):
        tok.id_to_token(49152)
    with pytest.raises(TokenError):
        tok.is_special(-3)


# --------------------------------------------------------------------------- synthetic
@pytest.mark.parametrize("text", TEXTS)
def test_synthetic_hf_and_gguf_tokenizers_agree(synth_hf, synth_gguf, text):
    hf = load_model(synth_hf("f32")).tokenizer
    gg = load_model(synth_gguf("F32")).tokenizer
    assert hf.encode(text) == gg.encode(text)
    assert hf.decode(hf.encode(text)) == text
    assert hf.vocab_size == gg.vocab_size == 300


def _spm_meta(add_bos: bool = True) -> dict:
    """A tiny SentencePiece-style vocabulary: specials, byte tokens, pieces with scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "llo",
        "hello",
        "▁hello",
        "wo",
        "wor",
        "ld",
        "world",
        "▁world",
        "▁w",
    ]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i) if len(p) == 1 else float(len(p)))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": add_bos,
    }


def test_spm_from_gguf_metadata():
    meta = _spm_meta()
    tok = Tokenizer.from_gguf(meta)
    ids = tok.encode("hello world")
    assert ids[0] == 1
    toks = [tok.id_to_token(i) for i in ids[1:]]
    assert toks == ["▁hello", "▁world"]
    for text in ("hello world", "héllo wörld ✓", "a\nb"):
        # byte fallback for unseen characters
        assert tok.decode(tok.encode(text, add_bos=False)) == text
        assert tok.decode(tok.encode(text), skip_special=True) == text
    assert tok.encode("hello", add_bos=False)[0] != 1


def test_tokenizer_errors():
    with pytest.raises(UnsupportedError, match="bert"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(ModelFileError):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(ModelFileError, match="merge"):
        Tokenizer.from_gguf(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": ["ab"],
            }
        )
    with pytest.raises(ModelFileError):
        Tokenizer.from_gguf(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": ["a c"],
            }
        )
    with pytest.raises(ModelFileError):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "a"]})


def test_unknown_pre_tokenizer_warns():
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.pre": "mystery",
    }
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tok = Tokenizer.from_gguf(meta)
    assert any("mystery" in str(x.message) for x in w)
    assert tok.encode("ab") == [2]


# --------------------------------------------------------------------------- chat
def test_chat_smol_template(smol):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    out = format_chat(smol.chat_template, msgs)
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    sys_msgs = [
        {"role": "system", "content": "Be brief."},
        *msgs,
        {"role": "assistant", "content": "4"},
    ]
    out = format_chat(smol.chat_template, sys_msgs, add_generation_prompt=False)
    assert out.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert out.endswith("<|im_start|>assistant\n4<|im_end|>\n")
    ids = smol.tokenizer.encode(out)
    assert ids.count(1) == 3  # <|im_start|> stays one special id


def test_chat_fallback_and_hf_features():
    msgs = [{"role": "user", "content": "hi"}]
    assert format_chat(None, msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert format_chat(CHATML_TEMPLATE, msgs, add_generation_prompt=False).endswith("<|im_end|>\n")
    tpl = (
        "{{ bos_token }}{% for m in messages %}\n  {{ m['content'] | tojson }}\n"
        "{% endfor %}{{ eos_token }}"
    )
    assert (
        format_chat(tpl, [{"role": "user", "content": "é"}], bos_token="<s>", eos_token="</s>")
        == '<s>  "é"\n</s>'
    )


def test_chat_errors():
    strict = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('first message must be from the user') }}{% endif %}ok"
    )
    with pytest.raises(ChatTemplateError, match="first message"):
        format_chat(strict, [{"role": "assistant", "content": "x"}])
    assert format_chat(strict, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ModelFileError):
        format_chat("{% for %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        format_chat(None, "hello")
    with pytest.raises(ChatTemplateError):
        format_chat(None, [{"content": "no role"}])
    # the sandbox refuses attribute access to internals
    with pytest.raises((ModelFileError, ChatTemplateError)):
        format_chat(
            "{{ messages.__class__.__mro__[1].__subclasses__() }}",
            [{"role": "user", "content": "x"}],
        )
