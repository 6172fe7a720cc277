"""The tool-call families through the server: the model's output is the transcript each real
template produces (:mod:`test_tool_formats`), one character per step, read back by the real
``openai`` and ``anthropic`` clients as ``tool_calls`` / ``tool_use`` (streamed and not), with
gpt-oss's analysis channel as ``reasoning_content`` and ``thinking`` blocks; a required call
is started in the family's syntax and constrained by its grammar; ``parallel_tool_calls``
false keeps the first call. SmolLM2 writes none of these formats, so the template is swapped
for the family's and the engine's stream is scripted."""

from __future__ import annotations

import json

import pytest
from test_tool_formats import ASK, CALLS, THOUGHT, TOOLS, template, transcript

from powerinfer_rs.runtime.generation import GenerationStats
from powerinfer_rs.runtime.streaming import TokenStep, TokenStream

FINAL = "It is sunny in Paris."


class Script:
    """A scripted engine stream: ``text`` one character per step; the prompt and grammar of
    the last request kept."""

    def __init__(self, text: str):
        self.text = text
        self.prompt = ""
        self.grammar = None

    def __call__(self, prompt, **kwargs):
        self.prompt, self.grammar = prompt, kwargs.get("grammar")
        text = self.text
        stats = GenerationStats(prompt_tokens=3, finish_reason="eos", completion_tokens=len(text))
        return TokenStream((TokenStep(i, c) for i, c in enumerate(text)), stats)


@pytest.fixture
def family(server, monkeypatch):
    """``use(name, text)``: serve with template ``name``, the model writing ``text``."""

    def use(name: str, text: str) -> Script:
        script = Script(text)
        monkeypatch.setattr(server.engine.loaded, "chat_template", template(name))
        monkeypatch.setattr(server.engine, "stream_tokens", script)
        return script

    return use


def _chat(server, stream: bool, **kw):
    """``(reasoning, content, calls, finish reason, content deltas)`` of a chat request."""
    c = server.client()
    kw = dict(model="smollm2", messages=ASK, tools=TOOLS, max_tokens=64, **kw)
    if not stream:
        ch = c.chat.completions.create(**kw).choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments))
                 for t in ch.message.tool_calls or []]  # fmt: skip
        reasoning = getattr(ch.message, "reasoning_content", None) or ""
        return reasoning, ch.message.content or "", calls, ch.finish_reason, []
    reasoning, deltas, calls, reason, order = "", [], [], None, []
    for x in c.chat.completions.create(stream=True, **kw):
        if not x.choices:
            continue
        d = x.choices[0].delta
        r = getattr(d, "reasoning_content", None) or ""
        reasoning += r
        deltas.append(d.content or "")
        calls += [(t.function.name, json.loads(t.function.arguments)) for t in d.tool_calls or []]
        order += ["r"] * bool(r) + ["c"] * bool(d.content) + ["t"] * bool(d.tool_calls)
        reason = x.choices[0].finish_reason or reason
    assert order == sorted(order, key="rct".index), order  # reasoning, content, then calls
    return reasoning, "".join(deltas), calls, reason, deltas


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_analysis_is_reasoning_content_and_its_call_a_tool_call(family, server, stream):
    prompt, text = transcript("gpt-oss", CALLS[:1], THOUGHT)
    family("gpt-oss", text)
    reasoning, content, calls, reason, deltas = _chat(server, stream)
    assert (reasoning, content, calls, reason) == (THOUGHT, "", CALLS[:1], "tool_calls")
    assert not any("<|" in d for d in deltas)


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_oss_final_channel_is_the_content(family, server, stream):
    text = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final"
            f"<|message|>{FINAL}")  # fmt: skip
    family("gpt-oss", text)
    reasoning, content, calls, reason, _ = _chat(server, stream)
    assert (reasoning, content, calls, reason) == (THOUGHT, FINAL, [], "stop")


@pytest.mark.parametrize("name", ["qwen3-coder", "glm-4.6", "deepseek-r1", "deepseek-v3.1",
                                  "kimi-k2"])  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
def test_each_familys_parallel_calls_are_tool_calls(family, server, name, stream):
    _, text = transcript(name, CALLS, THOUGHT if name in ("glm-4.6", "deepseek-r1") else "")
    family(name, text)
    reasoning, content, calls, reason, _ = _chat(server, stream)
    assert (content, calls, reason) == ("", CALLS, "tool_calls")
    assert reasoning == (THOUGHT if name in ("glm-4.6", "deepseek-r1") else "")
    first = _chat(server, stream, parallel_tool_calls=False)
    assert first[2] == CALLS[:1]


@pytest.mark.parametrize(("name", "opening"), [
    ("qwen3-coder", "<tool_call>\n<function=get_weather>\n"),
    ("glm-4.6", "<tool_call>get_weather\n"),
    ("deepseek-r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                    "get_weather\n```json\n"),
    ("deepseek-v3.1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"),
    ("kimi-k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                "<|tool_call_argument_begin|>"),
    ("gpt-oss", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"),
])  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
def test_a_named_call_is_started_and_constrained_in_the_familys_syntax(
    family, server, name, opening, stream
):
    args = {"city": "Paris", "days": 3, "metric": True}
    _, text = transcript(name, CALLS[:1])
    rest = text[text.index(opening) + len(opening) :] if opening in text else json.dumps(args)
    script = family(name, rest)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    _, content, calls, reason, _ = _chat(server, stream, tool_choice=choice)
    assert script.prompt.endswith(opening)
    if name == "deepseek-r1":  # the prompt's open think block is closed before the call
        assert script.prompt.endswith("<think>\n</think>\n\n" + opening)
    assert script.grammar is not None and script.grammar.kind == "lark"
    assert (content, calls, reason) == ("", [("get_weather", args)], "tool_calls")


def _anthropic(server):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip


@pytest.mark.parametrize("name", ["gpt-oss", "glm-4.6", "kimi-k2"])
def test_messages_answer_thinking_then_tool_use_blocks(family, server, name):
    thinks = name != "kimi-k2"
    _, text = transcript(name, CALLS[:1], THOUGHT if thinks else "")
    family(name, text)
    client = _anthropic(server)
    kw = dict(model="smollm2", max_tokens=64, messages=ASK, tools=ANTHROPIC_TOOLS)
    whole = client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        streamed = stream.get_final_message()
    for r in (whole, streamed):
        kinds = [b.type for b in r.content]
        assert kinds == (["thinking"] if thinks else []) + ["tool_use"], kinds
        assert r.stop_reason == "tool_use"
        assert (r.content[-1].name, r.content[-1].input) == CALLS[0]
        if thinks:
            assert r.content[0].thinking == THOUGHT


def test_engine_chat_keeps_gpt_oss_analysis_apart(server, monkeypatch):
    """The Python API's :class:`ChatReply` on the real gpt-oss template: the prompt ends with
    the generation prompt, the analysis channel is ``reasoning``, the final one the reply."""
    eng = server.engine
    text = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final" \
           f"<|message|>{FINAL}"  # fmt: skip
    seen = []
    monkeypatch.setattr(eng.loaded, "chat_template", template("gpt-oss"))
    monkeypatch.setattr(eng, "generate", lambda prompt, **kw: seen.append(prompt) or text)
    reply = eng.chat(ASK, max_new_tokens=4)
    assert seen[0].endswith(
        "<|start|>user<|message|>What is the weather in Paris?<|end|><|start|>assistant"
    )
    assert (str(reply), reply.reasoning) == (FINAL, THOUGHT)
    assert eng.chat(ASK, reasoning_format="none") == text
