"""Several API keys (``--api-key`` repeated or a comma list, ``--api-key-file``): any listed key
authorises, in ``Authorization: Bearer`` and Anthropic's ``x-api-key``; a bad key file stops
``serve`` before the model loads. And ``--cors-origins``: preflights answered without a key,
for the listed origins only."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from powerinfer_rs import Engine  # noqa: E402
from powerinfer_rs.server.app import create_app  # noqa: E402
from powerinfer_rs.server.auth import (  # noqa: E402
    APIKeyFileError,
    key_matches,
    normalise_keys,
    read_key_file,
)
from powerinfer_rs.server.cli import add_arguments, api_keys  # noqa: E402

COUNT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture(scope="module")
def engine(smol):
    return Engine(smol, threads=1)


def serve_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_keys_from_flags_and_file(tmp_path, monkeypatch):
    monkeypatch.delenv("POWERINFER_RS_API_KEY", raising=False)
    f = tmp_path / "keys"
    f.write_text("# team keys\nfile-one\n\n  file-two  # the CI's\n")
    a = serve_args("--api-key", "a,b", "--api-key", "c", "--api-key-file", str(f))
    assert api_keys(a) == ["a", "b", "c", "file-one", "file-two"]
    assert api_keys(serve_args()) == []
    monkeypatch.setenv("POWERINFER_RS_API_KEY", "env1,env2")
    assert api_keys(serve_args()) == ["env1", "env2"]
    assert api_keys(serve_args("--api-key", "x")) == ["x"]


@pytest.mark.parametrize("content", [None, "", "# only a comment\n\n"])
def test_a_bad_key_file_stops_serve(tmp_path, content):
    f = tmp_path / "keys"
    if content is not None:
        f.write_text(content)
    with pytest.raises(APIKeyFileError):
        read_key_file(f)
    with pytest.raises(SystemExit, match="--api-key-file"):
        api_keys(serve_args("--api-key-file", str(f)))


def test_key_matching():
    keys = normalise_keys(["k1", "k2,k3"])
    assert keys == ("k1", "k2", "k3")
    assert all(key_matches(k, keys) for k in keys)
    assert not key_matches("k", keys) and not key_matches(None, keys)
    assert not key_matches("k1", ()) and normalise_keys(None) == ()


def test_any_listed_key_authorises(engine):
    app = create_app(engine, model_id="m", api_key=["one", "two,three"])
    with TestClient(app) as c:
        for key in ("one", "two", "three"):
            auth = {"Authorization": f"Bearer {key}"}
            assert c.get("/v1/models", headers=auth).status_code == 200
            r = c.post("/v1/messages/count_tokens", json=COUNT, headers={"x-api-key": key})
            assert r.status_code == 200, r.text
            r = c.post("/v1/messages/count_tokens", json=COUNT, headers=auth)
            assert r.status_code == 200, r.text
        for bad in ({"Authorization": "Bearer four"}, {"Authorization": "Basic one"}, {}):
            r = c.get("/v1/models", headers=bad)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        for bad in ({"x-api-key": "four"}, {"x-api-key": "one,two"}, {}):
            r = c.post("/v1/messages/count_tokens", json=COUNT, headers=bad)
            assert r.status_code == 401 and r.json()["type"] == "error"


def preflight(c: TestClient, origin: str, path: str = "/v1/chat/completions"):
    return c.options(path, headers={
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-api-key",
    })  # fmt: skip


def test_cors_preflight_needs_no_key_and_names_the_origin(engine):
    origins = "https://a.example, http://b:3000"
    app = create_app(engine, model_id="m", api_key="k", cors_origins=origins)
    with TestClient(app) as c:
        r = preflight(c, "https://a.example")
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "https://a.example"
        assert "POST" in r.headers["access-control-allow-methods"]
        allowed = r.headers["access-control-allow-headers"].lower()
        assert {"authorization", "content-type", "x-api-key"} <= set(allowed.split(", "))
        assert preflight(c, "http://b:3000").status_code == 200
        r = preflight(c, "https://evil.example")
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        keyed = {"Origin": "https://a.example", "Authorization": "Bearer k"}
        r = c.get("/v1/models", headers=keyed)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://a.example"
        r = c.get("/v1/models", headers={"Origin": "https://a.example"})
        assert r.status_code == 401  # only the preflight goes without a key


def test_cors_any_origin_and_off(engine):
    with TestClient(create_app(engine, model_id="m", cors_origins="*")) as c:
        r = preflight(c, "https://anywhere.example", "/v1/messages")
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    with TestClient(create_app(engine, model_id="m")) as c:
        r = preflight(c, "https://a.example")
        assert "access-control-allow-origin" not in r.headers
        r = c.get("/v1/models", headers={"Origin": "https://a.example"})
        assert "access-control-allow-origin" not in r.headers
