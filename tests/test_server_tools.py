"""Tools in ``/v1/chat/completions``: the tools in the prompt (the template's own way, or the
fallback system prompt), the model's calls parsed by each family's convention and answered as
``tool_calls`` (streamed and not), ``tool_choice`` (none, auto, required, a named function),
calls and results accepted back in the history, bad tool requests answered with a 400.

Whether the arguments validate against the tool's schema needs constrained decoding (not yet
here): these tests check the calls' shape, not what SmolLM2 writes in them."""

from __future__ import annotations

import json
import re

import pytest

from powerinfer_rs.runtime.chat import CHATML_TEMPLATE
from powerinfer_rs.runtime.tools import (
    FALLBACK_PROMPT,
    ToolCallStream,
    parse_tool_calls,
    prompt_messages,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "",
         [("get_weather", {"city": "Paris"})]),
        ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
         '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
         "Let me look.", [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
        ('<tool_call>{"name": "get_time", "arguments": {}}', "", [("get_time", {})]),  # cut off
        ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}]', "",
         [("get_weather", {"city": "Rome"})]),
        ('<|python_tag|>{"name": "get_time", "parameters": {}}; '
         '{"name": "get_weather", "parameters": {"city": "Lima"}}', "",
         [("get_time", {}), ("get_weather", {"city": "Lima"})]),
        ('{"name": "get_weather", "parameters": {"city": "Kyiv"}}', "",
         [("get_weather", {"city": "Kyiv"})]),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Baku\\"}"}', "",
         [("get_weather", {"city": "Baku"})]),
    ],
)  # fmt: skip
def test_each_convention_is_parsed(text, content, calls):
    got_content, got = parse_tool_calls(text, TOOLS)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got] == calls
    assert len({c.id for c in got}) == len(got)
    entry = got[0].openai()
    assert entry["type"] == "function" and json.loads(entry["function"]["arguments"]) == calls[0][1]


@pytest.mark.parametrize(
    "text",
    [
        "Paris is sunny.",
        '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',  # not a given tool
        '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',  # not an object
        '<tool_call>{"name": "get_time", "arguments": </tool_call>',  # not JSON
        '{"city": "Paris"}',  # JSON, but no call
    ],
)
def test_what_is_no_call_stays_text(text):
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_the_stream_shows_text_and_holds_calls():
    s = ToolCallStream(TOOLS)
    shown = [s.push(p) for p in ["Let me ", "check. <tool", "_call>{\"name\": ", '"get_time", ',
                                 '"arguments": {}}</tool_call>']]  # fmt: skip
    assert "".join(shown) == "Let me check. "
    assert shown[1] == "check. "  # "<tool" held back: it may start a call
    rest, calls = s.finish()
    assert rest == "" and [c.name for c in calls] == ["get_time"]
    plain = ToolCallStream(TOOLS)
    assert plain.push("It is <t") == "It is " and plain.push("oo hot") == "<too hot"
    assert plain.finish() == ("", [])
    bare = ToolCallStream(TOOLS)
    assert bare.push('{"name": "get_time",') == "" and bare.push(' "parameters": {}}') == ""
    assert [c.name for c in bare.finish()[1]] == ["get_time"]


def test_a_template_without_tools_gets_the_fallback_prompt_and_hermes_history():
    history = [
        {"role": "system", "content": "Be brief."},
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    msgs, extra = prompt_messages(history, TOOLS, CHATML_TEMPLATE)
    assert extra == {}
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.")
    assert FALLBACK_PROMPT in msgs[0]["content"] and '"name": "get_weather"' in msgs[0]["content"]
    assert msgs[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    }
    assert msgs[3] == {"role": "user", "content": "<tool_response>\nsunny, 21 C\n</tool_response>"}
    native = "{% for t in tools %}{{ t.function.name }}{% endfor %}"
    msgs, extra = prompt_messages(history, TOOLS, native)
    assert extra == {"tools": TOOLS} and msgs[3]["role"] == "tool"
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_engine_format_chat_renders_the_tools(smol):
    from powerinfer_rs import Engine

    eng = Engine(smol, threads=1)
    plain = eng.format_chat(ASK)
    with_tools = eng.format_chat(ASK, tools=TOOLS)
    assert "get_weather" in with_tools and "get_weather" not in plain


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", NAMED])
def test_a_required_call_comes_back_as_tool_calls(server, stream, choice):
    c = server.client()
    kw = dict(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice=choice,
              temperature=0, max_tokens=48)  # fmt: skip
    if not stream:
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        calls = [(t.id, t.function.name, t.function.arguments) for t in ch.message.tool_calls]
    else:
        chunks = [x for x in c.chat.completions.create(stream=True, **kw) if x.choices]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        calls = [(t.id, t.function.name, t.function.arguments)
                 for x in chunks for t in (x.choices[0].delta.tool_calls or [])]  # fmt: skip
    assert len(calls) == 1
    cid, name, args = calls[0]
    assert cid.startswith("call_") and name == "get_weather"
    assert isinstance(json.loads(args), dict)


def test_tool_choice_none_is_a_plain_chat_and_history_round_trips(server):
    c = server.client()
    plain = c.chat.completions.create(model="smollm2", messages=ASK, temperature=0, max_tokens=12)
    none = c.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER],
                                     tool_choice="none", temperature=0, max_tokens=12)  # fmt: skip
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None
    history = [*ASK,
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_9", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_9", "content": "sunny, 21 C"}]  # fmt: skip
    r = c.chat.completions.create(model="smollm2", messages=history, tools=[WEATHER],
                                  temperature=0, max_tokens=16)  # fmt: skip
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}),
         "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
         "tools[0].function.name"),
        (dict(tools=[WEATHER], tool_choice="sometimes"), "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400s_naming_the_field(server, kw, param):
    with server.http() as http:
        body = {"messages": ASK, "max_tokens": 4, **kw}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"].startswith(param), err
        ok = http.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 1})
        assert ok.status_code == 200


# -- tool histories that do not add up, tools no call could satisfy ----------------------------

CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_9", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}  # fmt: skip
ANSWER = {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}
BAD_HISTORIES = [
    ([*ASK, {**ANSWER, "tool_call_id": "call_1"}], "messages[1].role", "none precedes it"),
    ([*ASK, CALLED, {**ANSWER, "tool_call_id": "nope"}], "messages[2].tool_call_id",
     "answers no call"),
    ([*ASK, CALLED, {"role": "tool", "content": "sunny"}], "messages[2].tool_call_id",
     "needs its 'tool_call_id'"),
    ([*ASK, CALLED, *ASK], "messages[1].tool_calls", "no answer to ['call_9']"),
    ([*ASK, CALLED], "messages[1].tool_calls", "no answer to ['call_9']"),
    ([*ASK, CALLED, ANSWER, *ASK, ANSWER], "messages[4].role", "none precedes it"),
    ([*ASK, {**CALLED, "tool_calls": [{"type": "function", "function": {"name": "get_time"}}]}],
     "messages[1].tool_calls[0].id", "has no 'id'"),
]  # fmt: skip


@pytest.mark.parametrize(("history", "param", "words"), BAD_HISTORIES)
def test_tool_histories_that_do_not_add_up_are_refused(history, param, words):
    from powerinfer_rs.runtime.chat import ChatTemplateError
    from powerinfer_rs.runtime.tools import check_tool_history

    with pytest.raises(ChatTemplateError, match=re.escape(words)) as e:
        check_tool_history(history)
    assert e.value.param == param
    with pytest.raises(ChatTemplateError, match=re.escape(words)):
        prompt_messages(history, TOOLS, CHATML_TEMPLATE)


def test_tool_histories_that_add_up_are_taken():
    from powerinfer_rs.runtime.tools import check_tool_history

    two = {**CALLED, "tool_calls": [*CALLED["tool_calls"], {**CALLED["tool_calls"][0],
                                                            "id": "call_10"}]}  # fmt: skip
    for history in (
        [*ASK, CALLED, ANSWER],
        [*ASK, CALLED, ANSWER, {"role": "assistant", "content": "Sunny."}, *ASK],
        [*ASK, two, {**ANSWER, "tool_call_id": "call_10"}, ANSWER],  # any order
        [*ASK, CALLED, ANSWER, CALLED, ANSWER],
    ):
        check_tool_history(history)


@pytest.mark.parametrize(("index", "history_param"), [(1, "messages[2].tool_call_id"),
                                                      (3, "messages[1].tool_calls")])  # fmt: skip
def test_tool_histories_that_do_not_add_up_are_400s(server, index, history_param):
    history = BAD_HISTORIES[index][0]
    with server.http() as http:
        r = http.post("/v1/chat/completions",
                      json={"messages": history, "tools": [WEATHER], "max_tokens": 2})  # fmt: skip
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == history_param
        # without tools in the request too: the history alone is checked
        r = http.post("/v1/chat/completions", json={"messages": history, "max_tokens": 2})
        assert r.status_code == 400, r.text


SELF_REF = {"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "choice", ["required", "auto", {"type": "function", "function": {"name": "f"}}]
)
def test_a_tool_no_call_could_satisfy_is_a_400_before_generation(server, choice, stream):
    with server.http() as http:
        body = {"messages": ASK, "max_tokens": 8, "tools": [WEATHER, SELF_REF],
                "tool_choice": choice, "stream": stream}  # fmt: skip
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools" and err["code"] == "invalid_schema"
        assert "tools[1] ('f')" in err["message"] and "no finite instance" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_cut_off_by_max_tokens_leaks_no_call_text(server, stream):
    """The prompt starts a required call; cut off before it closes, the answer has no calls
    and no content (the inside of a call is never shown as text), and says "length"."""
    c = server.client()
    kw = dict(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
              temperature=0, max_tokens=3)  # fmt: skip
    if not stream:
        ch = c.chat.completions.create(**kw).choices[0]
        assert ch.finish_reason == "length" and not ch.message.tool_calls
        assert not ch.message.content
    else:
        chunks = [x for x in c.chat.completions.create(stream=True, **kw) if x.choices]
        assert chunks[-1].choices[0].finish_reason == "length"
        assert "".join(x.choices[0].delta.content or "" for x in chunks) == ""
        assert not any(x.choices[0].delta.tool_calls for x in chunks)
