"""Constrained decoding (llguidance): JSON schemas, Lark grammars and regexes through the Python
API and the server's ``response_format`` and required tool calls; every answer parses and
validates, 20 seeds out of 20, even from SmolLM2-135M; bad schemas are typed errors (400s in
the server); a constrained answer cut off by ``max_tokens`` ends with ``length``.

The schema's numbers are bounded integers: a field of unbounded digits (a plain "number") lets
a 135M model at temperature 0.7 write digits until ``max_tokens`` (4 seeds of 20 did, at 200
tokens), which the answer then reports as ``length``."""

from __future__ import annotations

import json
import re

import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

from powerinfer_rs.runtime.constrain import GrammarError, closed_schema  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["C", "F"]},
        "hours": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 23},
            "maxItems": 4,
        },
        "place": {
            "type": "object",
            "properties": {
                "lat": {"type": "integer", "minimum": -90, "maximum": 90},
                "lon": {"type": "integer", "minimum": -180, "maximum": 180},
            },
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "days", "unit", "place"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "A weather forecast request for Paris, as JSON."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}


@pytest.fixture(scope="module")
def eng(smol):
    from powerinfer_rs import Engine

    return Engine(smol, threads=2)


def test_json_schema_answers_validate_for_every_seed(eng):
    for seed in range(20):
        out = eng.chat(ASK, max_new_tokens=120, temperature=1.0, seed=seed, json_schema=SCHEMA)
        assert eng.last_stats.finish_reason == "eos", (seed, out)
        jsonschema.validate(json.loads(out), SCHEMA)


def test_grammar_and_regex(eng):
    out = eng.chat(
        ASK, max_new_tokens=20, temperature=0.7, seed=1, regex=r"(sunny|rainy), [0-9]{2} C"
    )
    assert re.fullmatch(r"(sunny|rainy), [0-9]{2} C", out), out
    lark = 'start: "Answer: " ("yes" | "no")'
    out = eng.chat(ASK, max_new_tokens=10, temperature=0.7, seed=2, grammar=lark)
    assert out in ("Answer: yes", "Answer: no")


def test_cut_off_by_max_tokens_says_length(eng):
    out = eng.chat(ASK, max_new_tokens=3, temperature=0, json_schema=SCHEMA)
    assert eng.last_stats.finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(json_schema={"type": "string", "format": "weird-thing"}), "weird-thing"),
        (dict(json_schema=[1]), "must be a JSON schema"),
        (dict(grammar="start: (", json_schema=None), "lark"),
        (dict(regex="a", grammar='start: "a"'), "one of"),
    ],
)
def test_bad_constraints_are_grammar_errors(eng, kw, words):
    with pytest.raises(GrammarError, match=words):
        eng.generate("x", max_new_tokens=2, **kw)


def test_closed_schema_closes_every_object_that_does_not_say():
    got = closed_schema({"type": "object", "properties": {"a": {"type": "object"},
                         "b": {"type": "object", "additionalProperties": True}}})  # fmt: skip
    assert got["additionalProperties"] is False
    assert got["properties"]["a"]["additionalProperties"] is False
    assert got["properties"]["b"]["additionalProperties"] is True


def test_response_format_json_schema_validates_20_of_20(server):
    c = server.client()
    rf = {"type": "json_schema", "json_schema": {"name": "forecast", "schema": SCHEMA,
                                                 "strict": True}}  # fmt: skip
    for seed in range(20):
        r = c.chat.completions.create(model="smollm2", messages=ASK, response_format=rf,
                                      seed=seed, temperature=1.0, max_tokens=120)  # fmt: skip
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    # Any JSON object: SmolLM2 may write one longer than max_tokens; what ends by itself parses.
    for seed in range(3):
        r = c.chat.completions.create(model="smollm2", messages=ASK, max_tokens=60, seed=seed,
                                      response_format={"type": "json_object"})  # fmt: skip
        text = r.choices[0].message.content
        assert text.startswith("{")
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert r.choices[0].finish_reason == "length"
    r = c.chat.completions.create(model="smollm2", messages=ASK, response_format=rf,
                                  temperature=0, max_tokens=3)  # fmt: skip
    assert r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_call_validates_against_its_schema(server, stream):
    c = server.client()
    kw = dict(model="smollm2", tools=[WEATHER], temperature=0, max_tokens=40,
              messages=[{"role": "user", "content": "What is the weather in Paris?"}],
              tool_choice={"type": "function", "function": {"name": "get_weather"}})  # fmt: skip
    if stream:
        chunks = [x for x in c.chat.completions.create(stream=True, **kw) if x.choices]
        calls = [t.function for x in chunks for t in (x.choices[0].delta.tool_calls or [])]
    else:
        calls = [t.function for t in c.chat.completions.create(**kw).choices[0].message.tool_calls]
    assert [f.name for f in calls] == ["get_weather"]
    schema = closed_schema(WEATHER["function"]["parameters"])
    jsonschema.validate(json.loads(calls[0].arguments), schema)


@pytest.mark.parametrize(
    ("rf", "param", "words"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "string", "format": "weird-thing"}}}, "response_format", "weird-thing"),
        ({"type": "json_schema"}, "response_format.json_schema", "required"),
        ({"type": "xml"}, "response_format.type", ""),
    ],
)  # fmt: skip
def test_bad_response_formats_are_400s(server, rf, param, words):
    with server.http() as http:
        r = http.post("/v1/chat/completions",
                      json={"messages": ASK, "max_tokens": 4, "response_format": rf})  # fmt: skip
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and words in err["message"]
        assert http.post("/v1/chat/completions",
                         json={"messages": ASK, "max_tokens": 1}).status_code == 200  # fmt: skip


# -- strings that are not text, schemas with no finite instance ---------------------------------

LONE = "a\ud800b"


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(json_schema={"enum": [LONE]}), "json_schema.enum[0]"),
        (dict(json_schema={"type": "object", "properties": {LONE: {}}}),
         "json_schema.properties (a key)"),
        (dict(regex=LONE), "regex"),
        (dict(grammar=f'start: "{LONE}"'), "grammar"),
    ],
)  # fmt: skip
def test_constraints_that_are_not_text_are_grammar_errors_naming_them(eng, kw, words):
    with pytest.raises(GrammarError) as e:
        eng.stream_tokens("x", max_new_tokens=2, **kw)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith(words) and "U+D800" in str(e.value)


SELF_REQUIRED = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
INFINITE = [
    SELF_REQUIRED,
    {"$ref": "#"},
    {"allOf": [{"$ref": "#"}]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1},
    {"type": "array", "contains": {"$ref": "#"}},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}, "required": ["x"],
     "$defs": {"n": {"type": "object", "properties": {"y": {"$ref": "#/$defs/n"}},
                     "required": ["y"]}}},
    {"anyOf": [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}]},
    {"type": ["object", "array"], "properties": {"a": {"$ref": "#"}}, "required": ["a"],
     "items": {"$ref": "#"}, "minItems": 2},
]  # fmt: skip
FINITE = [
    True,
    {},
    SCHEMA,
    {"type": "object", "properties": {"a": {"$ref": "#"}}},  # a not required
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["kids"]},  # a tree: the empty list ends it
    {"anyOf": [{"type": "null"}, SELF_REQUIRED]},
    {"properties": {"a": {"$ref": "#"}}, "required": ["a"]},  # no type: a string will do
    {"type": ["object", "string"], "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"$defs": {"node": {"type": "object", "required": ["next"], "properties": {
        "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}},
     "$ref": "#/$defs/node"},  # a linked list
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": {"type": "string"}},
     "$ref": "#/$defs/a"},
    {"type": "array", "contains": {"$ref": "#"}, "minContains": 0},
    {"$ref": "https://example.com/remote.json"},  # not followed: the grammar engine's to judge
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"],
     "enum": [{"a": 1}]},
]  # fmt: skip


def test_schemas_with_no_finite_instance_are_found_and_no_other():
    from powerinfer_rs.runtime.schema_check import no_finite_instance

    for s in INFINITE:
        assert no_finite_instance(s) is not None, s
    for s in FINITE:
        assert no_finite_instance(s) is None, s
    deep: dict = {"type": "string"}
    for _ in range(5000):  # deeper than Python's stack: left to the grammar engine
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    assert no_finite_instance(deep) is None


@pytest.mark.parametrize("schema", INFINITE[:3], ids=["self-required", "ref-root", "allOf"])
def test_a_schema_with_no_finite_instance_is_refused_before_generation(eng, schema):
    before = eng.n_past
    with pytest.raises(GrammarError, match="json_schema: this JSON schema has no finite instance"):
        eng.stream_tokens("x", max_new_tokens=4, json_schema=schema)
    assert eng.n_past == before
    from powerinfer_rs.runtime.constrain import tool_call_grammar

    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    with pytest.raises(GrammarError, match=r"tools\[0\] \('f'\): .* no finite instance"):
        tool_call_grammar(tools, None)


def test_a_grammar_that_admits_nothing_fails_at_once_without_the_parser_state(eng):
    """A Lark grammar is not analysed, but one that allows no text at all fails when the
    constraint is made (the first mask), and llguidance's state dump is cut from the message."""
    with pytest.raises(GrammarError, match="admits no text") as e:
        eng.stream_tokens("x", max_new_tokens=4, grammar='start: %json {"$ref": "#"}')
    assert "<state>" not in str(e.value) and "<grammar>" not in str(e.value)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("schema", [SELF_REQUIRED, {"$ref": "#"}], ids=["self", "ref"])
def test_response_formats_with_no_finite_instance_are_400s(server, schema, stream):
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with server.http() as http:
        body = {"messages": ASK, "max_tokens": 8, "response_format": rf, "stream": stream}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "response_format" and err["code"] == "invalid_schema"
        assert "no finite instance" in err["message"] and "<state>" not in err["message"]


def test_a_grammar_failing_during_generation_says_why_without_the_parser_state(eng):
    """A Lark grammar embedding a schema with no finite instance is not analysed: llguidance
    fails at the first token ("Too many items"); the error is a GrammarError without its state
    dump, and the server answers it as the request's fault (400), not a 500."""
    from powerinfer_rs.server.sse import failure
    from powerinfer_rs.server.worker import Done

    schema = {**SELF_REQUIRED, "x-guidance": {"whitespace_flexible": False}}
    with pytest.raises(GrammarError) as e:
        eng.generate(
            "x", max_new_tokens=8, temperature=0, grammar=f"start: %json {json.dumps(schema)}"
        )
    assert "Too many items" in str(e.value) and "<state>" not in str(e.value)
    answer = failure(Done("error", 1, 1, e.value))
    assert answer.status == 400 and answer.code == "invalid_schema"
    assert failure(Done("error", 1, 1, RuntimeError("boom"))).status == 500
