"""``/v1/responses`` (OpenAI's Responses API) through the real ``openai`` client against a live
server (tests/live_server.py): ``responses.create`` and ``responses.stream``, every body and
event validated by the client's own pydantic types; the answer is the chat route's (the same
prompt, the same tokens); ``previous_response_id`` chaining and the store's bound; function
tools and their calls back in the input; reasoning items (a scripted thinking model, as in
test_server_reasoning.py); ``text.format``; requests refused by name."""

from __future__ import annotations

import json

import pytest
from pydantic import TypeAdapter

from live_server import MODEL_ID, chat

openai = pytest.importorskip("openai")
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402

from powerinfer_rs.runtime.generation import GenerationStats  # noqa: E402
from powerinfer_rs.runtime.streaming import TokenStep, TokenStream  # noqa: E402

GREEDY = dict(temperature=0, max_output_tokens=24)
QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS = TypeAdapter(ResponseStreamEvent)


def valid(r) -> Response:
    """``r`` (the client's object, built without validation) validated by its own type."""
    return Response.model_validate(r.model_dump(exclude_unset=True))


def raw_events(server, body: dict) -> list[dict]:
    """The SSE events of a streamed request, each validated as the client's event type."""
    out = []
    with server.http() as http, http.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                assert event["type"] == name
                EVENTS.validate_python(event)
                out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def test_create_answers_as_the_chat_route(server):
    client = server.client()
    r = client.responses.create(model=MODEL_ID, input=QUESTION, **GREEDY)
    valid(r)
    want = client.chat.completions.create(
        model=MODEL_ID, messages=chat(QUESTION), temperature=0, max_tokens=24
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == MODEL_ID
    assert r.output_text == want.choices[0].message.content and "Paris" in r.output_text
    assert [o.type for o in r.output] == ["message"]
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.usage.output_tokens == want.usage.completion_tokens
    finished = want.choices[0].finish_reason == "stop"
    assert r.status == ("completed" if finished else "incomplete")
    assert r.output[0].status == r.status


def test_instructions_and_input_items_are_the_chat_messages(server):
    client = server.client()
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Answer briefly."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": QUESTION},
    ]
    r = client.responses.create(model=MODEL_ID, instructions="Be kind.", input=items, **GREEDY)
    messages = [{"role": "system", "content": "Be kind."},
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, *chat(QUESTION)]  # fmt: skip
    want = client.chat.completions.create(
        model=MODEL_ID, messages=messages, temperature=0, max_tokens=24
    )
    assert r.output_text == want.choices[0].message.content
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.instructions == "Be kind."


def test_the_stream_helper_gets_the_same_answer(server):
    kw = dict(model=MODEL_ID, input="Say hello.", temperature=0, max_output_tokens=64)
    whole = server.client().responses.create(**kw)
    assert whole.status == "completed", whole.output_text  # the stream helper needs completed
    with server.client().responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    valid(final)
    assert "".join(deltas) == final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    events = raw_events(server, {**kw, "stream": True})
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]  # fmt: skip
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1


def test_a_cut_off_stream_ends_incomplete(server):
    body = {"model": MODEL_ID, "input": QUESTION, "max_output_tokens": 2, "stream": True}
    events = raw_events(server, body)
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 2


def test_previous_response_id_continues_the_conversation(server):
    client = server.client()
    first = client.responses.create(model=MODEL_ID, input="My name is Ada.", **GREEDY)
    second = client.responses.create(
        model=MODEL_ID, input="What is my name?", previous_response_id=first.id, **GREEDY
    )
    valid(second)
    assert second.previous_response_id == first.id
    turns = [*chat("My name is Ada."), {"role": "assistant", "content": first.output_text},
             *chat("What is my name?")]  # fmt: skip
    want = client.chat.completions.create(
        model=MODEL_ID, messages=turns, temperature=0, max_tokens=24
    )
    assert second.usage.input_tokens == want.usage.prompt_tokens
    assert second.output_text == want.choices[0].message.content
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id="resp_nope")
    assert e.value.body["param"] == "previous_response_id"
    assert e.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nope")
    unstored = client.responses.create(model=MODEL_ID, input="Hi", store=False, **GREEDY)
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL_ID, input="Hi", previous_response_id=unstored.id)


def test_the_store_is_bounded():
    from powerinfer_rs.server.errors import APIError
    from powerinfer_rs.server.responses_output import ResponseStore

    store = ResponseStore(limit=2)
    for rid in ("a", "b", "c"):
        store.put(rid, [{"role": "user", "content": rid}], {"id": rid})
    assert len(store) == 2 and store.history("c") == [{"role": "user", "content": "c"}]
    with pytest.raises(APIError) as e:
        store.history("a")
    assert e.value.status == 400 and e.value.param == "previous_response_id"


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_is_a_function_call_item_and_its_output_goes_back(server, stream):
    client = server.client()
    kw = dict(model=MODEL_ID, input="What is the weather in Paris?", tools=[WEATHER],
              tool_choice="required", temperature=0, max_output_tokens=48)  # fmt: skip
    if stream:
        with client.responses.stream(**kw) as s:
            kinds = [e.type for e in s]
            r = s.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
    else:
        r = client.responses.create(**kw)
    valid(r)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and r.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments), dict)
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    chained = client.responses.create(
        model=MODEL_ID, input=[answer], previous_response_id=r.id, tools=[WEATHER], **GREEDY
    )
    items = [{"role": "user", "content": kw["input"]}, call.model_dump(exclude_none=True), answer]
    explicit = client.responses.create(model=MODEL_ID, input=items, tools=[WEATHER], **GREEDY)
    assert chained.usage.input_tokens == explicit.usage.input_tokens
    assert chained.output_text == explicit.output_text


def script(text: str):
    """An engine ``stream_tokens`` that writes ``text`` whatever the prompt, a character a
    step."""

    def stream(prompt, **kwargs):
        stats = GenerationStats(prompt_tokens=3, finish_reason="eos", completion_tokens=len(text))
        return TokenStream((TokenStep(i, c) for i, c in enumerate(text)), stats)

    return stream


@pytest.fixture
def thinking(server, monkeypatch):
    from test_server_reasoning import ANSWER, THINK_TEMPLATE, THOUGHT

    monkeypatch.setattr(server.engine.loaded, "chat_template", THINK_TEMPLATE)
    monkeypatch.setattr(server.engine, "stream_tokens", script(f"{THOUGHT}\n</think>\n\n{ANSWER}"))
    return server, THOUGHT, ANSWER


def test_reasoning_is_a_reasoning_item_before_the_message(thinking):
    server, thought, answer = thinking
    client = server.client()
    r = client.responses.create(model=MODEL_ID, input="hi")
    valid(r)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == thought and r.output_text == answer
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.stream(model=MODEL_ID, input="hi") as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == thought and final.output_text == answer
    first_text = kinds.index("response.output_text.delta")
    assert kinds.index("response.reasoning_text.delta") < first_text
    assert "response.reasoning_text.done" in kinds[:first_text]
    events = raw_events(server, {"model": MODEL_ID, "input": "hi", "stream": True})
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1]


def test_a_scripted_call_in_free_text_streams_as_a_function_call(server, monkeypatch):
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    said = f"Let me check.<tool_call>{call}</tool_call>"
    monkeypatch.setattr(server.engine, "stream_tokens", script(said))
    client = server.client()
    r = client.responses.create(model=MODEL_ID, input="weather?", tools=[WEATHER])
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me check."
    assert json.loads(r.output[1].arguments) == {"city": "Oslo"}
    with client.responses.stream(model=MODEL_ID, input="weather?", tools=[WEATHER]) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text == "Let me check."
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].name == "get_weather"


def test_text_format_json_schema_constrains_the_answer(server):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}  # fmt: skip
    r = server.client().responses.create(
        model=MODEL_ID, input="Is Paris in France?", temperature=0, max_output_tokens=32,
        text={"format": {"type": "json_schema", "name": "yn", "schema": schema, "strict": True}},
    )  # fmt: skip
    assert json.loads(r.output_text)["answer"] in ("yes", "no")
    assert r.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "hi", "frobnicate": 1}, 400, "frobnicate"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "hi", "tools": [{**WEATHER, "name": "bad name!"}]}, 400, "tools[0].name"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         400, "input[0].content[0].type"),
        ({"input": [{"type": "file_search_call", "id": "x"}]}, 400, "input[0].type"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, 400, "input[0].role"),
        ({}, 400, "input"),
        ({"input": "hi", "model": "gpt-4o"}, 404, "model"),
        ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "hi", "truncation": "auto"}, 400, "truncation"),
        ({"input": "hi", "include": ["file_search_call.results"]}, 400, "include"),
        ({"input": "hi", "tool_choice": {"type": "web_search_preview"}}, 400, "tool_choice"),
        ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}},
         400, "tool_choice"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, 400, "text.format.schema"),
        ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
    ],
)  # fmt: skip
def test_bad_requests_are_named(server, body, status, param):
    with server.http() as http:
        r = http.post("/v1/responses", json={"max_output_tokens": 2, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()
