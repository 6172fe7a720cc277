"""Constrained output that starts after the reasoning (runtime/reasoning_constraint.py): inside
``<think>…</think>`` nothing is masked, the grammar binds the answer after the tag; at the first
step of a template that lets the model open a block, the ``<think>`` token is allowed beside
the grammar's; speculative drafts are cut at the closing token; Engine.chat and the server pass
where the block starts."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime.constrain import Constraint, grammar_of
from powerinfer_rs.runtime.reasoning import CLOSE, OPEN
from powerinfer_rs.runtime.reasoning_constraint import AfterReasoning

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
THOUGHT = "Hmm, a is one."
ANSWER = '{"a":1}'  # the grammar's spacing (none)
FORCED_OPEN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def smol_loaded(smol_path):
    return load_model(smol_path)


class _WithOpener:
    """The SmolLM2 tokenizer with a ``<think>`` token: ``opener``'s id (SmolLM2 has none)."""

    def __init__(self, tok, opener: int):
        self.tok, self.opener = tok, opener

    def token_to_id(self, s):
        return self.opener if s == OPEN else self.tok.token_to_id(s)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def _grammar(loaded) -> Constraint:
    return Constraint(grammar_of(json_schema=SCHEMA), loaded.tokenizer, loaded.config.vocab_size)


def _closing_index(tok, ids) -> int:
    return next(i for i in range(len(ids)) if CLOSE in tok.decode(ids[: i + 1]))


def test_free_inside_the_block_then_bound(smol_loaded):
    tok, n = smol_loaded.tokenizer, smol_loaded.config.vocab_size
    ids = tok.encode(f"{THOUGHT}{CLOSE}{ANSWER}", add_bos=False)
    k = _closing_index(tok, ids)
    logits = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    # Alone, the grammar refuses the reasoning's first token: the wrapper is what lets it be.
    assert _grammar(smol_loaded).mask(logits)[ids[0]] == -np.inf
    c = AfterReasoning(_grammar(smol_loaded), tok, "open")
    assert c.valid_prefix(ids) == k + 1  # a draft is cut at the closing token
    for i, t in enumerate(ids):
        m = c.mask(logits)
        if i <= k:
            assert np.array_equal(m, logits) and not c.done
        else:
            assert np.isfinite(m[t]) and np.isinf(m).sum() > n // 2
        c.consume(t)
    assert c.done and c.state == "bound"


def test_the_first_token_may_open_a_block(smol_loaded):
    tok, n = smol_loaded.tokenizer, smol_loaded.config.vocab_size
    opener = tok.encode("Hmm", add_bos=False)[0]
    logits = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    # The model opens a block: allowed though the grammar refuses it, then free until the tag.
    c = AfterReasoning(_grammar(smol_loaded), _WithOpener(tok, opener), "allowed")
    first = c.mask(logits)
    assert first[opener] == logits[opener] and np.isinf(first).sum() > n // 2
    assert c.valid_prefix([opener]) == 0
    c.consume(opener)
    assert c.state == "thinking"
    for t in tok.encode(f" a is one.{CLOSE}{ANSWER}", add_bos=False):
        c.consume(t)
    assert c.done
    # Or it answers at once: bound from the first token, the opener refused after it.
    c = AfterReasoning(_grammar(smol_loaded), _WithOpener(tok, opener), "allowed")
    answer = tok.encode(ANSWER, add_bos=False)
    c.mask(logits)
    c.consume(answer[0])
    assert c.state == "bound" and c.mask(logits)[opener] == -np.inf
    for t in answer[1:]:
        c.consume(t)
    assert c.done
    # Without a <think> token the model cannot open one: bound from the start.
    assert AfterReasoning(_grammar(smol_loaded), tok, "allowed").state == "bound"


def test_chat_lets_the_model_reason_before_the_schema(synth_gguf):
    eng = Engine.from_pretrained(synth_gguf(), threads=1, chat_template=FORCED_OPEN)
    ask = [{"role": "user", "content": "hi"}]
    prompt = eng.format_chat(ask)
    free = eng.generate(prompt, max_new_tokens=6, temperature=0.0)
    reply = eng.chat(ask, max_new_tokens=6, temperature=0.0, json_schema=SCHEMA)
    # The synthetic model never closes the block: all six tokens are its free greedy text.
    assert reply.reasoning.strip() == free.strip() != "" and reply.content == ""
    bound = eng.generate(prompt, max_new_tokens=6, temperature=0.0, json_schema=SCHEMA)
    assert bound.startswith("{")  # without the reasoning, the schema binds the first token


def test_the_server_passes_where_the_block_starts(server, monkeypatch):
    from powerinfer_rs.runtime.generation import GenerationStats
    from powerinfer_rs.runtime.streaming import TokenStep, TokenStream

    seen = []

    def scripted(prompt, **kwargs):
        seen.append(kwargs.get("reasoning"))
        text = f"{THOUGHT}{CLOSE}{ANSWER}"
        stats = GenerationStats(prompt_tokens=3, finish_reason="eos", completion_tokens=1)
        return TokenStream((TokenStep(i, c) for i, c in enumerate(text)), stats)

    monkeypatch.setattr(server.engine.loaded, "chat_template", FORCED_OPEN)
    monkeypatch.setattr(server.engine, "stream_tokens", scripted)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    ask = [{"role": "user", "content": "hi"}]
    r = server.client().chat.completions.create(model="smollm2", messages=ask, response_format=fmt)
    assert r.choices[0].message.content == ANSWER
    server.client().chat.completions.create(model="smollm2", messages=ask)
    assert seen == ["open", None]
