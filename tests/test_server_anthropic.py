"""Anthropic's Messages API (``POST /v1/messages``) through the official ``anthropic`` client
against a live server on SmolLM2: a message, a streamed message equal to it, stop sequences,
token counting, the key in ``x-api-key``, and bad input answered in Anthropic's error shape
while the server keeps serving."""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")

from live_server import MODEL_ID, LiveServer  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
#: The client (2.x) has no sampling parameters of its own; the API still takes them.
GREEDY = {"temperature": 0}


def client(server, api_key: str = "none"):
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=120)


def test_a_message_is_the_engines_chat(server):
    got = client(server).messages.create(
        model="claude-any", max_tokens=12, extra_body=GREEDY, messages=QUESTION
    )
    want = server.engine.chat(QUESTION, max_new_tokens=12, temperature=0)
    assert got.type == "message" and got.role == "assistant" and got.model == MODEL_ID
    assert [b.type for b in got.content] == ["text"] and got.content[0].text == want
    assert "Paris" in want
    prompt = len(server.engine.tokenizer.encode(server.engine.format_chat(QUESTION)))
    assert got.usage.input_tokens == prompt
    assert got.usage.output_tokens == server.engine.last_stats.completion_tokens
    assert got.stop_reason == ("end_turn" if got.usage.output_tokens < 12 else "max_tokens")
    assert got.id.startswith("msg_")


def test_system_prompt_and_text_blocks(server):
    c = client(server)
    blocks = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                           {"type": "text", "text": "of France?"}]}]  # fmt: skip
    a = c.messages.create(model="m", max_tokens=8, extra_body=GREEDY, messages=blocks,
                          system="Answer in one word.")  # fmt: skip
    b = c.messages.create(model="m", max_tokens=8, extra_body=GREEDY, messages=QUESTION,
                          system=[{"type": "text", "text": "Answer in one word."}])  # fmt: skip
    want = server.engine.chat(
        [{"role": "system", "content": "Answer in one word."}, *QUESTION],
        max_new_tokens=8,
        temperature=0,
    )
    assert a.content[0].text == b.content[0].text == want


def test_the_stream_carries_the_same_message(server):
    c = client(server)
    kw = dict(model="m", max_tokens=16, extra_body=GREEDY, messages=QUESTION)
    whole = c.messages.create(**kw)
    kinds, text = [], ""
    with c.messages.stream(**kw) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "content_block_delta":
                text += ev.delta.text
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stop_sequences_report_which_one(server):
    c = client(server)
    free = c.messages.create(model="m", max_tokens=16, extra_body=GREEDY, messages=QUESTION)
    word = free.content[0].text.split()[1]  # a word the answer contains
    got = c.messages.create(
        model="m", max_tokens=16, extra_body=GREEDY, messages=QUESTION,
        stop_sequences=["zzz-never", word],
    )  # fmt: skip
    assert got.stop_reason == "stop_sequence" and got.stop_sequence == word
    assert word not in got.content[0].text and free.content[0].text.startswith(got.content[0].text)


def test_count_tokens(server):
    got = client(server).messages.count_tokens(model="m", messages=QUESTION)
    prompt = len(server.engine.tokenizer.encode(server.engine.format_chat(QUESTION)))
    assert got.input_tokens == prompt


@pytest.mark.parametrize(
    ("kw", "status", "words"),
    [
        (dict(max_tokens=0), 400, "max_tokens"),
        (dict(extra_body={"temperature": 1.5}), 400, "temperature"),
        (dict(messages=[]), 400, "messages"),
        (dict(messages=[{"role": "robot", "content": "hi"}]), 400, "role"),
        (dict(messages=[*QUESTION, {"role": "assistant", "content": "The"}]), 400, "last"),
        (dict(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]), 400,
         "'image' blocks"),
        (dict(tools=[{"name": "f", "input_schema": {"type": "object"}}],
              tool_choice={"type": "tool", "name": "g"}), 400, "'g'"),
        (dict(tools=[{"name": "bad name", "input_schema": {}}]), 400, "tools[0].name"),
    ],
)  # fmt: skip
def test_bad_input_is_an_anthropic_error_and_the_server_keeps_serving(server, kw, status, words):
    c = client(server)
    args = dict(model="m", max_tokens=4, messages=QUESTION) | kw
    with pytest.raises(anthropic.APIStatusError) as e:
        c.messages.create(**args)
    assert e.value.status_code == status
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"]
    ok = c.messages.create(model="m", max_tokens=2, extra_body=GREEDY, messages=QUESTION)
    assert ok.content[0].text


def test_the_key_is_read_from_x_api_key(smol):
    from powerinfer_rs import Engine

    live = LiveServer(Engine(smol, threads=1), api_key="sekret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(live, api_key="wrong").messages.create(model="m", max_tokens=1,
                                                          messages=QUESTION)  # fmt: skip
        assert e.value.body["error"]["type"] == "authentication_error"
        got = client(live, api_key="sekret").messages.create(
            model="m", max_tokens=1, messages=QUESTION
        )
        assert got.usage.output_tokens <= 1
    finally:
        live.stop()


WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip(server, stream):
    """A required tool call comes back as a tool_use block whose input fits the schema; its
    result goes back as a tool_result block and the model answers."""
    jsonschema = pytest.importorskip("jsonschema")
    from powerinfer_rs.runtime.constrain import closed_schema

    c = client(server)
    kw = dict(model="m", max_tokens=40, extra_body=GREEDY, messages=ASK_WEATHER,
              tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})  # fmt: skip
    if stream:
        with c.messages.stream(**kw) as s:
            kinds = [ev.type for ev in s]
            msg = s.get_final_message()
        assert "content_block_start" in kinds and kinds[-1] == "message_stop"
    else:
        msg = c.messages.create(**kw)
    assert msg.stop_reason == "tool_use"
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["get_weather"] and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, closed_schema(WEATHER["input_schema"]))
    history = [
        *ASK_WEATHER,
        {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "sunny, 21 C"}]},
    ]  # fmt: skip
    answer = c.messages.create(model="m", max_tokens=24, extra_body=GREEDY, messages=history,
                               tools=[WEATHER])  # fmt: skip
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert answer.content


def test_tool_choice_any_and_none(server):
    c = client(server)
    anyone = c.messages.create(model="m", max_tokens=40, extra_body=GREEDY,
                               messages=ASK_WEATHER, tools=[WEATHER],
                               tool_choice={"type": "any"})  # fmt: skip
    assert anyone.stop_reason == "tool_use"
    assert [b.name for b in anyone.content if b.type == "tool_use"] == ["get_weather"]
    none = c.messages.create(model="m", max_tokens=12, extra_body=GREEDY, messages=ASK_WEATHER,
                             tools=[WEATHER], tool_choice={"type": "none"})  # fmt: skip
    plain = c.messages.create(model="m", max_tokens=12, extra_body=GREEDY, messages=ASK_WEATHER)
    assert none.content[0].text == plain.content[0].text and none.stop_reason != "tool_use"


# -- tool turns that do not add up, tools no call could satisfy --------------------------------

USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ([{"role": "user", "content": [{**RESULT, "tool_use_id": "toolu_x"}]}],
         "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x"),
        ([*ASK_WEATHER, {"role": "assistant", "content": [USE]},
          {"role": "user", "content": [{**RESULT, "tool_use_id": "toolu_2"}]}],
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
         "toolu_1"),
        ([*ASK_WEATHER, {"role": "assistant", "content": [USE]}, *ASK_WEATHER],
         "without `tool_result` blocks immediately after: toolu_1"),
        ([*ASK_WEATHER, {"role": "assistant", "content": [USE]},
          {"role": "user", "content": [RESULT]}, {"role": "assistant", "content": "Sunny."},
          {"role": "user", "content": [RESULT]}],
         "messages.4.content.0: unexpected `tool_use_id`"),
        ([*ASK_WEATHER, {"role": "assistant", "content": [{**USE, "id": None}]},
          {"role": "user", "content": "well?"}], "messages.1.content.0.id: Field required"),
    ],
)  # fmt: skip
def test_tool_turns_that_do_not_add_up_are_400s(server, messages, words):
    with server.http() as http:
        for route in ("/v1/messages", "/v1/messages/count_tokens"):
            body = {"model": "m", "max_tokens": 4, "messages": messages, "tools": [WEATHER]}
            r = http.post(route, json=body)
            assert r.status_code == 400, r.text
            assert r.json() == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": r.json()["error"]["message"]},
            }
            assert words in r.json()["error"]["message"]


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_weather"}, {"type": "any"}])
def test_tool_choice_without_tools_is_a_400(server, choice):
    c = client(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=4, messages=QUESTION, tool_choice=choice)
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "may only be specified while providing tools" in body["error"]["message"]


SELF_REQUIRED = {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#"}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", [{"$ref": "#"}, SELF_REQUIRED], ids=["ref", "self"])
def test_a_tool_no_call_could_satisfy_is_a_400_before_any_event(server, schema, stream):
    with server.http() as http:
        body = {"model": "m", "max_tokens": 8, "messages": ASK_WEATHER, "stream": stream,
                "tools": [{"name": "f", "input_schema": schema}],
                "tool_choice": {"type": "any"}}  # fmt: skip
        r = http.post("/v1/messages", json=body)
        assert r.status_code == 400, r.text
        msg = r.json()["error"]["message"]
        assert "tools[0] ('f')" in msg and "no finite instance" in msg and "<state>" not in msg


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_cut_off_by_max_tokens_leaks_no_call_text(server, stream):
    c = client(server)
    kw = dict(model="m", max_tokens=3, extra_body=GREEDY, messages=ASK_WEATHER, tools=[WEATHER],
              tool_choice={"type": "any"})  # fmt: skip
    if stream:
        with c.messages.stream(**kw) as s:
            msg = s.get_final_message()
    else:
        msg = c.messages.create(**kw)
    assert msg.stop_reason == "max_tokens"
    assert msg.content == []
