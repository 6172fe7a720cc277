"""Bad requests to the live server answer in OpenAI's error shape, with the right status and
the field at fault, never a traceback; the server keeps serving after each. The API key and the
full queue on a second server (key set, one waiting place)."""

from __future__ import annotations

import json
import threading

import pytest

from live_server import MODEL_ID, LiveServer, chat, openai

OK_CHAT = {"model": MODEL_ID, "messages": chat("Hi"), "max_tokens": 2, "temperature": 0}


def post(server, path: str, body, **kw):
    with server.http() as http:
        if isinstance(body, (bytes, str)):
            return http.post(path, content=body, headers={"content-type": "application/json"})
        return http.post(path, json=body, **kw)


def assert_error(resp, status: int, param: str | None = None, *words: str) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert "Traceback" not in err["message"]
    assert err["param"] == param
    for w in words:
        assert w in err["message"], err["message"]
    return err


def assert_still_serving(server) -> None:
    resp = post(server, "/v1/chat/completions", OK_CHAT)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "body,param,words",
    [
        (b"{not json", None, ["not valid JSON"]),
        (b"[1, 2]", None, []),
        ({**OK_CHAT, "temperature": "hot"}, "temperature", ["'hot'"]),
        ({**OK_CHAT, "temperature": 3.5}, "temperature", ["less than or equal to 2"]),
        ({**OK_CHAT, "top_p": 0}, "top_p", []),
        ({**OK_CHAT, "max_tokens": -1}, "max_tokens", []),
        ({**OK_CHAT, "max_tokens": 1.5}, "max_tokens", []),
        ({**OK_CHAT, "seed": "7"}, "seed", []),
        ({**OK_CHAT, "presence_penalty": 2.5}, "presence_penalty", []),
        ({**OK_CHAT, "stop": 5}, "stop", []),
        ({**OK_CHAT, "stream": "yes"}, "stream", []),
        ({**OK_CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs", []),
        ({**OK_CHAT, "messages": []}, "messages", []),
        ({**OK_CHAT, "messages": [{"content": "x"}]}, "messages[0].role", ["required"]),
        ({**OK_CHAT, "messages": "Hi"}, "messages", []),
        ({**OK_CHAT, "n": 2}, "n", ["one choice"]),
        ({**OK_CHAT, "tools": [{"type": "function"}]}, "tools[0].function", ["required"]),
        ({**OK_CHAT, "response_format": {"type": "xml"}}, "response_format.type", []),
        ({k: v for k, v in OK_CHAT.items() if k != "messages"}, "messages", ["required"]),
    ],
)
def test_bad_chat_requests_are_400_naming_the_field(server, body, param, words):
    assert_error(post(server, "/v1/chat/completions", body), 400, param, *words)
    assert_still_serving(server)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "x", "logprobs": 6}, "logprobs"),
        ({"prompt": "x", "echo": "loud"}, "echo"),
        ({"prompt": [10**30]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
    ],
)
def test_bad_completion_requests_are_400_naming_the_field(server, body, param):
    assert_error(post(server, "/v1/completions", body), 400, param)
    assert_still_serving(server)


def test_the_openai_client_sees_bad_requests_as_bad_requests(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(model=MODEL_ID, messages=chat("x"), n=3)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"


def test_unknown_model_is_404(server):
    err = assert_error(
        post(server, "/v1/chat/completions", {**OK_CHAT, "model": "gpt-4"}), 404, "model"
    )
    assert err["code"] == "model_not_found" and MODEL_ID in err["message"]
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("gpt-4")
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert_still_serving(server)


def test_a_prompt_longer_than_the_context_is_400_with_the_numbers(server):
    n_ctx = server.engine.n_ctx
    ids = [1] * (n_ctx + 5)
    err = assert_error(post(server, "/v1/completions", {"prompt": ids}), 400, "prompt")
    assert err["code"] == "context_length_exceeded"
    assert str(n_ctx + 5) in err["message"] and str(n_ctx) in err["message"]
    long_chat = {**OK_CHAT, "messages": chat("word " * n_ctx)}
    err = assert_error(post(server, "/v1/chat/completions", long_chat), 400, "messages")
    assert err["code"] == "context_length_exceeded" and str(n_ctx) in err["message"]
    assert_still_serving(server)


def test_unknown_routes_and_methods_answer_in_the_error_shape(server):
    with server.http() as http:
        assert_error(http.get("/v1/nothing"), 404)
        assert_error(http.get("/v1/chat/completions"), 405)
    assert_still_serving(server)


@pytest.fixture(scope="module")
def keyed(smol):
    """A second server: API key "sekret", one waiting place in the queue."""
    from powerinfer_rs import Engine

    live = LiveServer(Engine(smol, threads=1), api_key="sekret", max_queue=1)
    yield live
    live.stop()


def test_api_key_is_checked(keyed):
    with pytest.raises(openai.AuthenticationError) as e:
        keyed.client(api_key="wrong").models.list()
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with keyed.http() as http:
        assert_error(http.get("/v1/models"), 401, None, "no API key")
        assert_error(http.post("/v1/completions", json={"prompt": "x"}), 401)
        assert http.get("/health").status_code == 200  # health needs no key
    with pytest.raises(openai.AuthenticationError):
        keyed.client(api_key="wrong").chat.completions.create(**OK_CHAT)
    got = keyed.client(api_key="sekret").chat.completions.create(**OK_CHAT)
    assert got.choices[0].message.content


def test_a_full_queue_answers_429_at_once(keyed):
    client = keyed.client(api_key="sekret")
    done = keyed.worker.jobs_done
    results: list = []

    def request() -> None:
        results.append(client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2))

    with keyed.engine.ctx.lock:  # the engine is busy: the first request runs, then blocks
        first = threading.Thread(target=request)
        first.start()
        while keyed.worker.current is None:
            first.join(0.01)
        second = threading.Thread(target=request)  # waits in the one place of the queue
        second.start()
        while keyed.worker.waiting < 1:
            second.join(0.01)
        with pytest.raises(openai.RateLimitError) as e:
            client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2)
        assert e.value.status_code == 429 and e.value.body["code"] == "queue_full"
    first.join(60)
    second.join(60)
    assert len(results) == 2 and all(r.choices[0].text for r in results)
    keyed.wait_idle(done + 2)


#: Where a lone surrogate goes: sent as the JSON escape "\\ud800" it is no text, and so no prompt.
LONE = "@lone@"
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONE}]}),
        ("/v1/chat/completions", {"messages": [{"role": LONE, "content": "hi"}]}),
        ("/v1/chat/completions", {"messages": HI, "stop": [LONE]}),
        ("/v1/chat/completions", {"messages": HI, "tools": [
            {"type": "function", "function": {"name": "f", "description": LONE}}]}),
        ("/v1/chat/completions", {"messages": HI, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": [LONE]}}}}),
        ("/v1/completions", {"prompt": LONE}),
        ("/v1/messages", {"model": "m", "max_tokens": 2, "system": LONE, "messages": HI}),
        ("/v1/messages/count_tokens", {"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": LONE}]}]}),
    ],
)  # fmt: skip
def test_strings_that_are_not_text_are_400s(server, path, body):
    raw = json.dumps(body).replace(LONE, "a\\ud800b")
    r = post(server, path, raw)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "not valid JSON" in message and "Traceback" not in message
    assert post(server, "/v1/chat/completions", OK_CHAT).status_code == 200
