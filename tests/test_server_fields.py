"""Nothing in a request body is dropped in silence (issue 74): ``min_p`` and ``typical_p``
reach the sampler; llama.cpp's ``grammar`` (GBNF) and ``json_schema`` body fields, and the
``schema`` of ``{"type": "json_object", "schema": ...}``, constrain the output; the documented
no-ops are accepted; every other undeclared field, and DRY or XTC switched on, is a 400 naming
it. On the live SmolLM2 server (tests/live_server.py)."""

from __future__ import annotations

import json
import re

import pytest

from powerinfer_rs.server.fields import COMPANIONS, NO_OPS
from powerinfer_rs.server.responses import Calls

from live_server import MODEL_ID, chat

jsonschema = pytest.importorskip("jsonschema")

CHAT = {"model": MODEL_ID, "messages": chat("Tell me about a person."), "max_tokens": 40}
PROMPT = "Once upon a time"
HOT = dict(temperature=2.0, top_k=0, top_p=1.0, max_tokens=8)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def post(server, path: str, body: dict):
    with server.http() as http:
        return http.post(path, json=body)


def text_of(resp) -> str:
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def error_of(resp, param: str) -> dict:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param, err
    return err


def complete(server, **kw) -> str:
    return text_of(post(server, "/v1/completions", {"prompt": PROMPT, **kw}))


def test_min_p_reaches_the_sampler(server):
    greedy = server.engine.generate(PROMPT, max_new_tokens=8, temperature=0)
    # min_p = 1 keeps only the likeliest token: hot sampling becomes greedy, whatever the seed.
    assert {complete(server, **HOT, seed=s, min_p=1.0) for s in (1, 2, 3)} == {greedy}
    assert len({complete(server, **HOT, seed=s) for s in (1, 2, 3)}) > 1
    want = server.engine.generate(PROMPT, max_new_tokens=8, temperature=2.0, top_k=0,
                                  top_p=1.0, min_p=0.2, seed=5)  # fmt: skip
    assert complete(server, **HOT, seed=5, min_p=0.2) == want


def test_typical_p_reaches_the_sampler(server):
    # A tiny mass keeps one token per step, the most typical one: no randomness left.
    kw = dict(HOT, typical_p=1e-6)
    texts = {complete(server, **kw, seed=s) for s in (1, 2, 3)}
    want = server.engine.generate(PROMPT, max_new_tokens=8, temperature=2.0, top_k=0,
                                  top_p=1.0, typical_p=1e-6)  # fmt: skip
    assert texts == {want}
    body = {**CHAT, "max_tokens": 4, "typical_p": 0.5, "min_p": 0.1, "seed": 1}
    assert text_of(post(server, "/v1/chat/completions", body))


@pytest.mark.parametrize(
    "field,value", [("min_p", -0.1), ("min_p", 1.5), ("typical_p", 0), ("typical_p", 1.5)]
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_out_of_range_sampling_values_are_400s(server, path, field, value):
    body = {**CHAT, "prompt": PROMPT} if path.endswith("/completions") else dict(CHAT)
    body.pop("messages" if path == "/v1/completions" else "prompt", None)
    error_of(post(server, path, {**body, field: value}), field)


GBNF = r"""
root   ::= answer "!"
answer ::= ("yes" | "no") " " [0-9]{2,3}
"""


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_gbnf_grammar_constrains_the_output(server, path):
    body = {"grammar": GBNF, "temperature": 0.8, "seed": 3, "max_tokens": 16}
    body.update({"messages": chat("Yes or no?")} if "chat" in path else {"prompt": "Q: "})
    out = text_of(post(server, path, body))
    assert re.fullmatch(r"(yes|no) [0-9]{2,3}!", out), out


@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_a_body_schema_constrains_the_output(server, kind):
    if kind == "json_schema":
        body = {**CHAT, "json_schema": PERSON}
    else:
        body = {**CHAT, "response_format": {"type": "json_object", "schema": PERSON}}
    resp = post(server, "/v1/chat/completions", {**body, "temperature": 0, "max_tokens": 64})
    out = json.loads(text_of(resp))
    jsonschema.validate(out, PERSON)
    assert resp.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"grammar": "root ::= ("}, "grammar"),
        ({"grammar": "root ::= missing_rule"}, "grammar"),
        ({"grammar": 5}, "grammar"),
        ({"json_schema": "object"}, "json_schema"),
        ({"json_schema": PERSON, "grammar": GBNF}, "grammar"),
        ({"response_format": {"type": "json_object"}, "json_schema": PERSON}, "json_schema"),
    ],
)
def test_bad_or_clashing_constraints_are_400s(server, extra, param):
    error_of(post(server, "/v1/chat/completions", {**CHAT, **extra}), param)


UNKNOWN = [("mirostat", 2), ("tfs_z", 0.9), ("frobnicate", True), ("repeat_last_n", 64)]


@pytest.mark.parametrize(
    "path,field,value",
    [(p, f, v) for p in ("/v1/chat/completions", "/v1/completions") for f, v in UNKNOWN]
    + [("/v1/completions", "parallel_tool_calls", False)],  # a chat field only
)
def test_unknown_fields_are_400s_naming_them(server, path, field, value):
    body = dict(CHAT) if "chat" in path else {"prompt": PROMPT, "max_tokens": 2}
    err = error_of(post(server, path, {**body, field: value}), field)
    assert err["code"] == "unknown_parameter" and field in err["message"]


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"dry_multiplier": 0.8}, "dry_multiplier"),
        ({"dry_multiplier": 0.8, "dry_base": 1.75}, "dry_multiplier"),
        ({"dry_base": 1.75, "dry_multiplier": 0.5}, "dry_multiplier"),
        ({"xtc_probability": 0.5, "xtc_threshold": 0.1}, "xtc_probability"),
        ({"xtc_threshold": 0.1, "xtc_probability": 0.5}, "xtc_probability"),
    ],
)
def test_dry_and_xtc_switched_on_are_400s_saying_not_implemented(server, fields, param):
    err = error_of(post(server, "/v1/chat/completions", {**CHAT, **fields}), param)
    assert "not implemented" in err["message"] and err["code"] == "unsupported_parameter"


def test_no_ops_and_features_left_off_are_accepted(server):
    values = {"metadata": {"a": "b"}, "store": False, "cache_prompt": True, "id_slot": -1}
    noops = {name: values.get(name, "x") for name in NO_OPS}
    off = {"dry_multiplier": 0.0, "xtc_probability": 0}
    off.update({name: 1 for name in COMPANIONS})
    for body in ({**CHAT, "max_tokens": 2, **noops, **off}, {**CHAT, "max_tokens": 2, **noops}):
        assert text_of(post(server, "/v1/chat/completions", body)) is not None
    body = {"prompt": PROMPT, "max_tokens": 2, **noops, "dry_base": 2.0}  # DRY off: inert
    assert text_of(post(server, "/v1/completions", body)) is not None


def test_every_no_op_says_why():
    assert all(len(why) > 20 for why in NO_OPS.values())
    assert not set(NO_OPS) & set(COMPANIONS)


TOOLS = [
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_date", "parameters": {"type": "object"}}},
]
TWO_CALLS = (
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "get_date", "arguments": {}}</tool_call>'
)


@pytest.mark.parametrize("first_only,names", [(False, ["get_time", "get_date"]),
                                              (True, ["get_time"])])  # fmt: skip
def test_parallel_tool_calls_false_keeps_the_first_call(first_only, names):
    whole = Calls(TOOLS, first_only=first_only)
    assert [c.name for c in whole.parse(TWO_CALLS)[1]] == names
    streamed = Calls(TOOLS, first_only=first_only)
    for piece in re.findall(".{1,7}", TWO_CALLS, re.S):
        streamed.stream.push(piece)
    assert [c.name for c in streamed.finish()[1]] == names


def test_a_constraint_beside_a_required_call_is_a_400(server):
    body = {**CHAT, "tools": TOOLS, "tool_choice": "required", "grammar": GBNF}
    error_of(post(server, "/v1/chat/completions", body), "grammar")


def test_parallel_tool_calls_is_accepted_on_chat(server):
    for value in (True, False):
        body = {**CHAT, "max_tokens": 24, "tools": TOOLS, "tool_choice": "required",
                "parallel_tool_calls": value, "temperature": 0}  # fmt: skip
        resp = post(server, "/v1/chat/completions", body)
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["choices"][0]["message"]["tool_calls"]) == 1


#: Every declared field of the two requests and what happens to it: passed to the engine (by
#: ``engine_kwargs`` or the route), or refused when set (:func:`unsupported_fields`, ``n`` and
#: ``best_of`` above 1). A field added to a schema fails here until it is put in one of them.
ENGINE = {
    "max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos",
}  # fmt: skip
ROUTE = {"model", "n", "stream", "stream_options", "speculative", "draft_max", "grammar",
         "json_schema", "response_format", "return_progress"}  # fmt: skip
CHAT_ONLY = {"messages", "tools", "tool_choice", "parallel_tool_calls",
             "max_completion_tokens", "logprobs", "top_logprobs",
             "chat_template_kwargs", "reasoning_effort"}  # to the template  # fmt: skip
COMPLETION_ONLY = {"prompt", "logprobs", "echo", "best_of"}
REFUSED = {"functions", "logit_bias"}
REFUSED_COMPLETION = {"tools", "suffix"}


def test_every_declared_field_is_honoured_or_refused():
    from powerinfer_rs.server.schemas import ChatRequest, CompletionRequest, unsupported_fields

    assert set(ChatRequest.model_fields) == ENGINE | ROUTE | CHAT_ONLY | REFUSED
    want = ENGINE | ROUTE | COMPLETION_ONLY | REFUSED | REFUSED_COMPLETION
    assert set(CompletionRequest.model_fields) == want
    assert set(ChatRequest(messages=[{"role": "user"}]).engine_kwargs(1)) >= ENGINE - {"max_tokens"}
    for name in REFUSED | REFUSED_COMPLETION:
        req = CompletionRequest(prompt="x", **{name: "x" if name == "suffix" else {"a": 1}})
        assert unsupported_fields(req) == [name]
