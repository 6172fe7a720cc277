"""``return_progress: true`` (llama.cpp's): a stream gets one ``prompt_progress`` chunk (no
choices) before its first token, counting the prompt as ``usage`` does; without it, none."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from powerinfer_rs import Engine  # noqa: E402
from powerinfer_rs.server.app import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client(smol):
    with TestClient(create_app(Engine(smol, threads=1), model_id="m")) as c:
        yield c


def stream(client, path: str, **extra) -> list[dict]:
    body = {"max_tokens": 3, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}  # fmt: skip
    if "chat" in path:
        body["messages"] = [{"role": "user", "content": "Hi there"}]
    else:
        body["prompt"] = "Once upon a time"
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(d) for d in data if d != "[DONE]"]


def text_of(choice: dict) -> str:
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_one_progress_chunk_before_the_first_token(client, path):
    chunks = stream(client, path, return_progress=True)
    marked = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    assert len(marked) == 1
    i = marked[0]
    texts = [j for j, c in enumerate(chunks) if c["choices"] and text_of(c["choices"][0])]
    assert texts and i < texts[0]
    p, usage = chunks[i]["prompt_progress"], chunks[-1]["usage"]
    assert chunks[i]["choices"] == [] and chunks[i]["usage"] is None
    assert p["total"] == p["processed"] == usage["prompt_tokens"]
    assert 0 <= p["cache"] <= p["total"] and p["time_ms"] >= 0


def test_no_progress_unless_asked(client):
    assert not any("prompt_progress" in c for c in stream(client, "/v1/completions"))
    off = stream(client, "/v1/completions", return_progress=False)
    assert not any("prompt_progress" in c for c in off)
