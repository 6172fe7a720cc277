"""Reasoning in past assistant messages, rendered with the real templates
(tests/chat_templates/): OpenAI chat's ``reasoning_content``, Anthropic ``thinking`` blocks and
Responses ``reasoning`` items reach the templates that read them (Qwen3's and GLM-4.6's
``reasoning_content``, gpt-oss's ``thinking``) and are dropped where the template drops them
(before the last user message; SmolLM2's template, which reads neither). Through the server the
prompt the engine is asked for is captured (the engine's stream scripted, SmolLM2's template
swapped for the family's)."""

from __future__ import annotations

import json

import pytest
from test_server_tool_formats import Script
from test_tool_formats import ASK, TOOLS, template

anthropic = pytest.importorskip("anthropic")

THOUGHT = "Paris is in France; the tool knows its weather."
ARGS = {"city": "Paris", "days": 3, "metric": True}
CALL = {"id": "call_0", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}


def call_turn(reasoning: str | None = THOUGHT, content: str = "") -> list[dict]:
    """ASK, an assistant call (with ``reasoning_content`` unless None) and its result."""
    msg = {"role": "assistant", "content": content, "tool_calls": [CALL]}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return [*ASK, msg, RESULT]


def answered_then_asked(reasoning: str | None = THOUGHT) -> list[dict]:
    """ASK, an assistant answer (with ``reasoning_content`` unless None), a new question."""
    msg = {"role": "assistant", "content": "It is sunny."}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return [*ASK, msg, {"role": "user", "content": "And tomorrow?"}]


@pytest.fixture
def engine(server, monkeypatch):
    """``use(name)``: the server's engine rendering with template ``name`` (None: its own)."""

    def use(name: str | None):
        if name is not None:
            monkeypatch.setattr(server.engine.loaded, "chat_template", template(name))
        return server.engine

    return use


def test_qwen3_shows_the_reasoning_of_the_turns_after_the_last_question(engine):
    e = engine("qwen3")
    prompt = e.format_chat(call_turn(), tools=TOOLS)
    assert f"<|im_start|>assistant\n<think>\n{THOUGHT}\n</think>\n\n<tool_call>" in prompt
    bare = e.format_chat(call_turn(None), tools=TOOLS)
    assert "<think>" not in bare and "<|im_start|>assistant\n<tool_call>" in bare
    # Before the last question the template leaves it out: the same prompt as without it.
    assert e.format_chat(answered_then_asked()) == e.format_chat(answered_then_asked(None))
    assert THOUGHT not in e.format_chat(answered_then_asked())


def test_glm_reads_reasoning_content(engine):
    e = engine("glm-4.6")
    prompt = e.format_chat(call_turn(), tools=TOOLS)
    assert f"<|assistant|>\n<think>{THOUGHT}</think>" in prompt
    assert THOUGHT not in e.format_chat(answered_then_asked())


def test_gpt_oss_gets_it_as_its_analysis_channel(engine):
    e = engine("gpt-oss")
    want = (f"<|start|>assistant<|channel|>analysis<|message|>{THOUGHT}<|end|>"
            "<|start|>assistant to=functions.get_weather"
            "<|channel|>commentary json<|message|>")  # fmt: skip
    assert want in e.format_chat(call_turn(), tools=TOOLS)
    # The template refuses both content and thinking on a call: the reasoning wins, as
    # llama.cpp's gpt-oss handling has it.
    assert want in e.format_chat(call_turn(content="Let me look."), tools=TOOLS)
    # Earlier final answers' reasoning is dropped by the template.
    prompt = e.format_chat(answered_then_asked())
    assert THOUGHT not in prompt and "<|channel|>final<|message|>It is sunny.<|end|>" in prompt


def test_a_template_that_reads_neither_drops_it(engine):
    e = engine(None)  # SmolLM2's ChatML
    assert e.format_chat(answered_then_asked()) == e.format_chat(answered_then_asked(None))


@pytest.fixture
def scripted(server, monkeypatch):
    """``use(name, text)``: serve with template ``name``, the model writing ``text``."""

    def use(name: str, text: str = "It is sunny.") -> Script:
        script = Script(text)
        monkeypatch.setattr(server.engine.loaded, "chat_template", template(name))
        monkeypatch.setattr(server.engine, "stream_tokens", script)
        return script

    return use


def test_openai_chat_passes_reasoning_content(server, scripted):
    script = scripted("qwen3")
    server.client().chat.completions.create(
        model="smollm2", messages=call_turn(), tools=TOOLS, max_tokens=8
    )
    assert script.prompt == server.engine.format_chat(call_turn(), tools=TOOLS)
    assert f"<think>\n{THOUGHT}\n</think>" in script.prompt


def test_anthropic_thinking_blocks_are_reasoning_content(server, scripted):
    script = scripted("qwen3")
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    tools = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip
    client.messages.create(model="smollm2", max_tokens=8, tools=tools, messages=[
        {"role": "user", "content": ASK[0]["content"]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": ""},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "call_0", "name": "get_weather", "input": ARGS}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_0", "content": "sunny"}]},
    ])  # fmt: skip
    assert script.prompt == server.engine.format_chat(call_turn(), tools=TOOLS)


def responses_tools() -> list[dict]:
    return [{"type": "function", **t["function"]} for t in TOOLS]


def test_responses_reasoning_items_open_the_next_assistant_turn(server, scripted):
    script = scripted("qwen3")
    items = [
        {"role": "user", "content": ASK[0]["content"]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": THOUGHT}]},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather",
         "arguments": json.dumps(ARGS)},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
    ]  # fmt: skip
    server.client().responses.create(
        model="smollm2", input=items, tools=responses_tools(), max_output_tokens=8
    )
    assert script.prompt == server.engine.format_chat(call_turn(), tools=TOOLS)
    # A reasoning item with no assistant turn after it is dropped; a summary serves as text.
    items[1] = {"type": "reasoning", "id": "rs_1",
                "summary": [{"type": "summary_text", "text": THOUGHT}]}  # fmt: skip
    server.client().responses.create(
        model="smollm2", input=items, tools=responses_tools(), max_output_tokens=8
    )
    assert script.prompt == server.engine.format_chat(call_turn(), tools=TOOLS)
    server.client().responses.create(model="smollm2", input=items[:2], max_output_tokens=8)
    assert THOUGHT not in script.prompt


def test_previous_response_id_keeps_the_reasoning(server, scripted):
    call = json.dumps({"name": "get_weather", "arguments": ARGS})
    scripted("qwen3", f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>\n{call}\n</tool_call>")
    client = server.client()
    for stream in (False, True):
        kw = dict(model="smollm2", input=ASK[0]["content"], tools=responses_tools(),
                  max_output_tokens=64)  # fmt: skip
        if stream:
            with client.responses.stream(**kw) as s:
                first = s.get_final_response()
        else:
            first = client.responses.create(**kw)
        (fc,) = [o for o in first.output if o.type == "function_call"]
        assert [o.type for o in first.output][0] == "reasoning"
        script = scripted("qwen3")
        client.responses.create(
            model="smollm2", previous_response_id=first.id, tools=responses_tools(),
            input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}],
            max_output_tokens=8,
        )  # fmt: skip
        assert f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>" in script.prompt
        scripted("qwen3", f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>\n{call}\n</tool_call>")
