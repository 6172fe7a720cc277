"""The ``timings`` object of chat and completion answers (llama-server's): in the body, or in a
stream's last chunk; its counts agree with ``usage`` and its rates with its counts, and a
repeated prompt on a server with a prefix cache reports the cached tokens in ``cache_n``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from powerinfer_rs import Engine  # noqa: E402
from powerinfer_rs.server.app import create_app  # noqa: E402
from powerinfer_rs.server.timings import timings  # noqa: E402
from powerinfer_rs.server.worker import Done  # noqa: E402

KEYS = {
    "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
    "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
}  # fmt: skip
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def client(smol):
    app = create_app(Engine(smol, threads=1), model_id="m", parallel=2, cache_mib=64)
    with TestClient(app) as c:
        yield c


def assert_consistent(t: dict, usage: dict) -> None:
    assert set(t) == KEYS
    assert t["predicted_n"] == usage["completion_tokens"]
    assert t["prompt_n"] + t["cache_n"] == usage["prompt_tokens"]
    for phase in ("prompt", "predicted"):
        n, ms = t[f"{phase}_n"], t[f"{phase}_ms"]
        assert ms >= 0
        if n and ms > 0:
            assert t[f"{phase}_per_second"] == pytest.approx(n / ms * 1000)
            assert t[f"{phase}_per_token_ms"] == pytest.approx(ms / n)
    assert t["predicted_n"] > 0 and t["predicted_ms"] > 0 and t["prompt_ms"] > 0


def test_completion_timings_and_the_cache(client):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    first = client.post("/v1/completions", json=body).json()
    assert_consistent(first["timings"], first["usage"])
    again = client.post("/v1/completions", json=body).json()
    assert_consistent(again["timings"], again["usage"])
    assert again["timings"]["cache_n"] > 0  # the repeated prompt came from the prefix cache
    assert again["timings"]["prompt_n"] < first["timings"]["prompt_n"]


def test_chat_timings(client):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "temperature": 0}
    got = client.post("/v1/chat/completions", json=body).json()
    assert_consistent(got["timings"], got["usage"])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_timings_in_the_last_chunk(client, path):
    body = {"max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        body["prompt"] = "Hello"
    with client.stream("POST", path, json=body) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    with_timings = [c for c in chunks if "timings" in c]
    assert len(with_timings) == 1
    last = with_timings[0]
    assert last["choices"][0]["finish_reason"] is not None
    assert_consistent(last["timings"], chunks[-1]["usage"])


def test_timings_without_stats():
    t = timings(Done("cancelled", 5, 0))
    assert t["cache_n"] == 0 and t["prompt_n"] == 5 and t["predicted_per_second"] == 0.0


def test_timings_on_the_engines_own_context(smol):
    """Without slots (one request at a time): a follow-up that extends the last prompt reuses
    the context's tokens, and says so in cache_n."""
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    with TestClient(create_app(Engine(smol, threads=1), model_id="m")) as c:
        first = c.post("/v1/completions", json=body).json()
        assert_consistent(first["timings"], first["usage"])
        again = c.post("/v1/completions", json={**body, "prompt": PROMPT + " And"}).json()
        assert_consistent(again["timings"], again["usage"])
        assert again["timings"]["cache_n"] > 0


def test_messages_timings_in_the_body_and_the_streams_message_delta(client):
    """Anthropic's ``/v1/messages`` carries the same ``timings``: in the body, and streamed in
    its ``message_delta`` event (the one with the stop reason and the usage)."""
    body = {"model": "any", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip

    def as_openai(usage: dict) -> dict:
        return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"]}

    got = client.post("/v1/messages", json=body).json()
    assert_consistent(got["timings"], as_openai(got["usage"]))
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    with_timings = [e for e in events if "timings" in e]
    assert [e["type"] for e in with_timings] == ["message_delta"]
    assert_consistent(with_timings[0]["timings"], as_openai(with_timings[0]["usage"]))
