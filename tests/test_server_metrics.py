"""``GET /metrics`` (``serve --metrics``): Prometheus' text format, parsed with
``prometheus_client``'s parser; after a few requests its request and token counters are the
requests made and the tokens of their ``usage``, and its prefix-cache, slot and queue values
are /health's."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("httpx")
parser = pytest.importorskip("prometheus_client.parser")
from starlette.testclient import TestClient  # noqa: E402

from powerinfer_rs import Engine  # noqa: E402
from powerinfer_rs.server.app import create_app  # noqa: E402
from powerinfer_rs.server.metrics import endpoint_of  # noqa: E402

PROMPT = "Count with me: one, two, three, four, five, six. " * 3
OTHER = "A different prompt about rivers, lakes and the sea, to take the slot. " * 2


def scrape(c: TestClient, **kw) -> dict[tuple[str, tuple], float]:
    r = c.get("/metrics", **kw)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in parser.text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: dict, name: str, **labels) -> float:
    return m[(f"powerinfer_rs_{name}", tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def client(smol):
    app = create_app(
        Engine(smol, threads=1), model_id="m", parallel=1, cache_mib=64, metrics_route=True
    )
    with TestClient(app) as c:
        yield c


def test_counters_match_the_requests_and_health(client):
    usages = []  # PROMPT, OTHER (it takes the one slot), PROMPT again: from the prefix cache
    for prompt in (PROMPT, OTHER, PROMPT):
        body = {"prompt": prompt, "max_tokens": 3, "temperature": 0}
        usages.append(client.post("/v1/completions", json=body).json()["usage"])
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    usages.append(client.post("/v1/chat/completions", json=chat).json()["usage"])
    assert client.post("/v1/completions", json={"prompt": 5}).status_code == 400
    health = client.get("/health").json()
    m = scrape(client)
    assert value(m, "requests_total", endpoint="/v1/completions", status="200") == 3
    assert value(m, "requests_total", endpoint="/v1/completions", status="400") == 1
    assert value(m, "requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert value(m, "requests_total", endpoint="/health", status="200") == 1
    assert value(m, "prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert value(m, "generated_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert value(m, "prefill_seconds_total") > 0 and value(m, "decode_seconds_total") > 0
    cache = health["prefix_cache"]
    for key in ("lookups", "hits", "hit_tokens"):
        assert value(m, f"prefix_cache_{key}_total") == cache[key], key
    assert cache["hits"] >= 1 and cache["hit_tokens"] > 0, cache
    assert value(m, "slots") == health["parallel"] == 1
    assert value(m, "slots_busy") == 0 and value(m, "queue_length") == health["waiting"] == 0
    assert value(m, "speculative_drafted_tokens_total") >= 0
    again = scrape(client)
    assert value(again, "requests_total", endpoint="/metrics", status="200") == 1


def test_metrics_asks_for_the_key_and_is_off_by_default(smol):
    eng = Engine(smol, threads=1)
    with TestClient(create_app(eng, model_id="m", api_key="k", metrics_route=True)) as c:
        assert c.get("/metrics").status_code == 401
        m = scrape(c, headers={"Authorization": "Bearer k"})
        assert value(m, "requests_total", endpoint="/metrics", status="401") == 1
    with TestClient(create_app(eng, model_id="m")) as c:
        assert c.get("/metrics").status_code == 404


def test_endpoint_labels_are_bounded():
    assert endpoint_of("/v1/completions") == "/v1/completions"
    assert endpoint_of("/v1/models/anything") == "/v1/models/{model}"
    assert endpoint_of("/wp-admin") == "other"
