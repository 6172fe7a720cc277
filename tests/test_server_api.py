"""The OpenAI-compatible server through the official ``openai`` client against a live server
(tests/live_server.py): chat and text completions, streamed and not, usage, finish reasons,
stop strings, seeds, log-probabilities, the model list, the request log."""

from __future__ import annotations

import logging
import math

import pytest

from live_server import MODEL_ID, chat

GREEDY = dict(temperature=0, max_tokens=12)
QUESTION = chat("What is the capital of France?")


def stream_text(stream) -> tuple[str, list]:
    chunks = list(stream)
    text = "".join(
        (c.choices[0].delta.content or "") if hasattr(c.choices[0], "delta") else c.choices[0].text
        for c in chunks
        if c.choices
    )
    return text, chunks


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert server.client().models.retrieve(MODEL_ID).id == MODEL_ID
    with server.http() as http:
        health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL_ID


def test_chat_completion_is_the_engines_chat(server):
    got = server.client().chat.completions.create(model=MODEL_ID, messages=QUESTION, **GREEDY)
    want = server.engine.chat(QUESTION, max_new_tokens=12, temperature=0)
    choice = got.choices[0]
    assert got.object == "chat.completion" and got.model == MODEL_ID
    assert choice.message.role == "assistant" and choice.message.content == want
    assert "Paris" in want
    prompt = len(server.engine.tokenizer.encode(server.engine.format_chat(QUESTION)))
    assert got.usage.prompt_tokens == prompt
    assert got.usage.completion_tokens == server.engine.last_stats.completion_tokens
    assert got.usage.total_tokens == prompt + got.usage.completion_tokens
    assert choice.finish_reason == ("stop" if got.usage.completion_tokens < 12 else "length")


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streamed_text_equals_the_whole_text_at_temperature_0(server, kind):
    client = server.client()
    if kind == "chat":
        create = client.chat.completions.create
        kw = dict(model=MODEL_ID, messages=chat("Write a haiku about rivers."), **GREEDY)
    else:
        create = client.completions.create
        kw = dict(model=MODEL_ID, prompt="Once upon a time", **GREEDY)
    whole = create(**kw)
    text = whole.choices[0].message.content if kind == "chat" else whole.choices[0].text
    streamed, chunks = stream_text(
        create(stream=True, stream_options={"include_usage": True}, **kw)
    )
    assert streamed == text and len(text) > 10
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])
    if kind == "chat":
        assert chunks[0].choices[0].delta.role == "assistant"
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(server):
    stream = server.client().completions.create(
        model=MODEL_ID, prompt="1, 2, 3,", stream=True, **GREEDY
    )
    chunks = list(stream)
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


def test_length_and_stop(server):
    client = server.client()
    kw = dict(model=MODEL_ID, prompt="1, 2, 3, 4,", temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(max_tokens=10, **kw)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 10
    assert " 6" in full.choices[0].text
    cut = client.completions.create(max_tokens=10, stop=[" 6", "xyz"], **kw)
    assert cut.choices[0].text == full.choices[0].text.split(" 6")[0]
    assert cut.choices[0].finish_reason == "stop"
    one = client.completions.create(max_tokens=10, stop=" 6", **kw)
    assert one.choices[0].text == cut.choices[0].text


def test_max_completion_tokens_and_max_tokens(server):
    client = server.client()
    a = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, temperature=0, max_completion_tokens=3
    )
    b = client.chat.completions.create(
        model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=3
    )
    assert a.usage.completion_tokens == b.usage.completion_tokens == 3
    assert a.choices[0].message.content == b.choices[0].message.content


def test_seeded_sampling_is_reproducible(server):
    client = server.client()
    kw = dict(model=MODEL_ID, prompt="My favourite food is", max_tokens=12, temperature=1.0)
    a = client.completions.create(seed=5, **kw).choices[0].text
    b = client.completions.create(seed=5, **kw).choices[0].text
    c = client.completions.create(seed=6, **kw).choices[0].text
    assert a == b != c


def test_penalties_and_extensions_are_used(server):
    client = server.client()

    def text(prompt: str, **kw) -> str:
        kw = {"temperature": 0, **kw}
        got = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, **kw)
        return got.choices[0].text

    loop = "1, 1, 1, 1, 1, 1,"
    plain = text(loop, extra_body={"ignore_eos": True})
    assert plain != text(loop, frequency_penalty=2.0, extra_body={"ignore_eos": True})
    assert plain != text(loop, extra_body={"ignore_eos": True, "repetition_penalty": 1.5})
    story = "Once upon a time"
    assert text(story) != text(story, presence_penalty=2.0)
    sampled = text("The sea is", temperature=1.5, seed=1, extra_body={"top_k": 1})
    assert sampled == text("The sea is")


def test_chat_logprobs(server):
    got = server.client().chat.completions.create(
        model=MODEL_ID, messages=QUESTION, logprobs=True, top_logprobs=3, **GREEDY
    )
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens
    assert "".join(t.token for t in content) == got.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token  # greedy
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)
        assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token
    none = server.client().chat.completions.create(model=MODEL_ID, messages=QUESTION, **GREEDY)
    assert none.choices[0].logprobs is None


def test_completion_logprobs_streamed_and_not(server):
    kw = dict(model=MODEL_ID, prompt="The capital of France is", logprobs=2, **GREEDY)
    whole = server.client().completions.create(**kw)
    lp = whole.choices[0].logprobs
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(
        len(top) == 2 and math.isfinite(v) for top, v in zip(lp.top_logprobs, lp.token_logprobs)
    )
    chunks = list(server.client().completions.create(stream=True, **kw))
    streamed = [
        v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs)


def test_follow_up_turn_reuses_the_conversation_cache(server):
    client = server.client()
    first = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, **GREEDY)
    turn = QUESTION + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And of Spain?"},
    ]
    client.chat.completions.create(model=MODEL_ID, messages=turn, **GREEDY)
    stats = server.engine.last_stats
    assert stats.prefill_tokens < stats.prompt_tokens - 20  # only the new turn was computed


def test_one_log_line_per_request(server, caplog):
    with caplog.at_level(logging.INFO, logger="powerinfer_rs.server"):
        done = server.worker.jobs_done
        server.client().completions.create(model=MODEL_ID, prompt="Hi", **GREEDY)
        server.wait_idle(done + 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "powerinfer_rs.server"]
    assert len(lines) == 1
    assert lines[0].startswith("cmpl-") and "in=" in lines[0] and "out=12" in lines[0]
    assert "ttft=" in lines[0] and "tok/s" in lines[0]
