"""gpt-oss's harmony format under a constraint, on a real llguidance matcher over a tokenizer
that has harmony's special tokens (SmolLM2's, with ``<|start|>``, ``<|channel|>``,
``<|message|>``, ``<|end|>``, ``<|constrain|>``, ``<|return|>`` and ``<|call|>`` added as
special tokens, as gpt-oss's vocabulary has them): a ``json_schema`` answer must open the
``final`` channel, after any ``analysis`` messages (llama.cpp's gpt-oss response-format rule);
a forced call continues its commentary header (the prompt's prefix) with the tool's name,
``<|constrain|>json<|message|>`` and the arguments. The server and ``Engine.chat`` ask for it
from the real gpt-oss template."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("llguidance")
from test_tool_formats import ASK, TOOLS, template  # noqa: E402

from powerinfer_rs.runtime.constrain import Constraint, Grammar, GrammarError  # noqa: E402
from powerinfer_rs.runtime.harmony_constraint import in_final_channel  # noqa: E402
from powerinfer_rs.runtime.reasoning import reasoning_start  # noqa: E402
from powerinfer_rs.runtime.tool_formats import FAMILIES  # noqa: E402

SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|return|>",
            "<|call|>"]  # fmt: skip
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"]}  # fmt: skip


@pytest.fixture(scope="module")
def harmony_tok(smol):
    """SmolLM2's tokenizer with harmony's special tokens, in the shape :class:`Constraint`
    reads (``inner``: a ``tokenizers.Tokenizer``; ``eos_ids``), and its vocabulary size."""
    from tokenizers import AddedToken, Tokenizer

    inner = Tokenizer.from_str(smol.tokenizer.inner.to_str())
    inner.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    tok = SimpleNamespace(inner=inner, eos_ids=[inner.token_to_id("<|return|>")])
    return tok, inner.get_vocab_size(with_added_tokens=True)


def accepts(harmony_tok, grammar: Grammar, text: str) -> tuple[bool, bool]:
    """``(every token of text allowed by the mask and consumed, the grammar complete)``."""
    tok, n_vocab = harmony_tok
    c = Constraint(grammar, tok, n_vocab)
    for t in tok.inner.encode(text, add_special_tokens=False).ids:
        if not np.isfinite(c.mask(np.zeros(n_vocab, dtype=np.float32))[t]):
            return False, False
        c.consume(t)
    return True, c.done


def test_the_specials_are_single_tokens(harmony_tok):
    tok, n_vocab = harmony_tok
    ids = tok.inner.encode("".join(SPECIALS), add_special_tokens=False).ids
    assert len(ids) == len(SPECIALS) and min(ids) >= n_vocab - len(SPECIALS)


def test_a_schema_answer_opens_the_final_channel(harmony_tok):
    g = in_final_channel(Grammar("json_schema", SCHEMA))
    answer = '{"answer":42}'  # the fixed layout of every schema constraint (constrain.compact)
    assert accepts(harmony_tok, g, f"<|channel|>final<|message|>{answer}") == (True, True)
    assert accepts(harmony_tok, g, f"<|channel|>final <|constrain|>json<|message|>{answer}") \
        == (True, True)  # fmt: skip
    thought = "<|channel|>analysis<|message|>Six times seven; {not json} <tags>.<|end|>"
    two = f"{thought}<|start|>assistant{thought}<|start|>assistant"
    assert accepts(harmony_tok, g, f"{two}<|channel|>final<|message|>{answer}") == (True, True)
    # Not without the channel, not another channel, not text that breaks the schema.
    assert accepts(harmony_tok, g, answer)[0] is False
    assert accepts(harmony_tok, g, f"<|channel|>commentary<|message|>{answer}")[0] is False
    assert accepts(harmony_tok, g, '<|channel|>final<|message|>{"answer":"x"}')[0] is False
    # The schema alone (today's binding from the first token) takes the bare answer only.
    plain = Grammar("json_schema", SCHEMA)
    assert accepts(harmony_tok, plain, answer) == (True, True)
    assert accepts(harmony_tok, plain, f"<|channel|>final<|message|>{answer}")[0] is False


def test_other_kinds_and_bad_schemas(harmony_tok):
    lark = Grammar("lark", 'start: "yes"')
    assert in_final_channel(lark) is lark
    assert accepts(harmony_tok, in_final_channel(Grammar("json_schema", True)),
                   '<|channel|>final<|message|>{"a":1}') == (True, True)  # fmt: skip
    loop = {"$ref": "#/$defs/a", "$defs": {"a": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/a"}}, "required": ["a"]}}}  # fmt: skip
    with pytest.raises(GrammarError):
        in_final_channel(Grammar("json_schema", loop))


def test_a_forced_call_continues_its_commentary_header(harmony_tok):
    args = json.dumps({"city": "Paris", "days": 3, "metric": True})
    fmt = FAMILIES["gpt-oss"]
    prefix, g = fmt.force(TOOLS, None)
    assert prefix == "<|channel|>commentary to=functions."
    call = f"get_weather <|constrain|>json<|message|>{args}"
    assert accepts(harmony_tok, g, call) == (True, True)
    assert accepts(harmony_tok, g, call.replace("get_weather", "get_wether"))[0] is False
    assert accepts(harmony_tok, g, f"get_weather json<|message|>{args}")[0] is False
    prefix, g = fmt.force(TOOLS, "get_weather")
    assert prefix.endswith("to=functions.get_weather <|constrain|>json<|message|>")
    assert accepts(harmony_tok, g, args) == (True, True)
    text = prefix + args  # what the model's turn reads as: the parser takes it back
    assert fmt.parse(text, TOOLS)[1][0].name == "get_weather"


def test_the_harmony_template_asks_for_it():
    tpl = template("gpt-oss")
    assert reasoning_start(tpl, "<|start|>assistant") == "harmony"
    assert reasoning_start(tpl, "<|start|>assistant", "none") == "harmony"  # the format's own
    assert reasoning_start(template("qwen3"), "<|im_start|>assistant\n") == "allowed"


def test_the_server_and_chat_pass_it(server, monkeypatch):
    from powerinfer_rs.runtime.generation import GenerationStats
    from powerinfer_rs.runtime.streaming import TokenStep, TokenStream

    seen = []
    text = '<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant' \
           '<|channel|>final<|message|>{"answer": 42}'  # fmt: skip

    def scripted(prompt, **kwargs):
        seen.append(kwargs)
        stats = GenerationStats(prompt_tokens=3, finish_reason="eos", completion_tokens=len(text))
        return TokenStream((TokenStep(i, c) for i, c in enumerate(text)), stats)

    monkeypatch.setattr(server.engine.loaded, "chat_template", template("gpt-oss"))
    monkeypatch.setattr(server.engine, "stream_tokens", scripted)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    r = server.client().chat.completions.create(
        model="smollm2", messages=ASK, response_format=fmt, max_tokens=32
    )
    assert seen[-1]["reasoning"] == "harmony"
    assert seen[-1]["grammar"] == Grammar("json_schema", SCHEMA)
    msg = r.choices[0].message
    assert json.loads(msg.content) == {"answer": 42} and msg.reasoning_content == "Easy."
    # A forced call is started by the prompt: its grammar is the call's, not wrapped.
    server.client().chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=32
    )
    assert "reasoning" not in seen[-1] or seen[-1]["reasoning"] is None


def test_on_a_vocabulary_without_the_tokens_it_is_a_typed_error(server, monkeypatch):
    monkeypatch.setattr(server.engine.loaded, "chat_template", template("gpt-oss"))
    with pytest.raises(GrammarError):
        server.engine.chat(ASK, json_schema=SCHEMA, max_new_tokens=4)
