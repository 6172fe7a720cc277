"""The server with parallel slots (``serve --parallel``, runtime/slots.py) under abuse, on a
synthetic model: 16 streaming clients against 4 slots and a queue of 4 (the rest are 429s),
half of those served leaving mid-stream, and a request longer than the context (400). Afterwards
/health shows every slot idle, nothing waiting and the prefix cache within its bound, and a
greedy request gives the text it gave before."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest

from powerinfer_rs import Engine
from powerinfer_rs.loading import load_model

from live_server import MODEL_ID, LiveServer, httpx

CLIENTS = 16
PARALLEL = 4
QUEUE = 4
N_CTX = 160
GREEDY = dict(model=MODEL_ID, prompt="hello world", max_tokens=12, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def slots_server(synth_gguf):
    model = load_model(synth_gguf(dtype="F32", activation="relu"))
    live = LiveServer(
        Engine(model, threads=2, n_ctx=N_CTX), parallel=PARALLEL, cache_mib=1, max_queue=QUEUE
    )
    yield live
    live.stop()


def wait_for(what, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError("waited too long")
        time.sleep(0.01)


def test_health_says_how_requests_run(slots_server):
    with slots_server.http() as http:
        h = http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == MODEL_ID and h["busy"] is False
    assert h["parallel"] == PARALLEL and h["batching"] is True and h["waiting"] == 0
    assert [s["id"] for s in h["slots"]] == list(range(PARALLEL))
    assert {s["state"] for s in h["slots"]} == {"idle"}
    assert set(h["prefix_cache"]) == {
        "entries", "bytes", "limit_bytes", "lookups", "hits", "hit_rate", "hit_tokens"
    }  # fmt: skip
    assert h["prefix_cache"]["limit_bytes"] == 1 << 20


def test_abuse_leaves_the_server_idle_and_the_same(slots_server, caplog):
    s = slots_server
    caplog.set_level(logging.INFO, logger="powerinfer_rs.server")
    with s.http() as http:
        before = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
    done0 = s.worker.jobs_done
    statuses: list[int | None] = [None] * CLIENTS
    chunks = [0] * CLIENTS
    tickets = itertools.count()
    answered = threading.Semaphore(0)

    def client(i: int) -> None:
        body = dict(GREEDY, prompt=f"client {i} says", max_tokens=60, stream=True)
        with httpx.Client(base_url=s.url, timeout=60) as c:
            with c.stream("POST", "/v1/completions", json=body) as r:
                statuses[i] = r.status_code
                answered.release()
                if r.status_code != 200:
                    r.read()
                    return
                leave = next(tickets) % 2 == 0  # half of those served go away mid-stream
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks[i] += 1
                        if leave and chunks[i] == 3:
                            return  # closing the response disconnects

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    # Hold the slots' executor: the first requests bind slots and wait for their prefill,
    # the next wait in the queue, and the rest find it full.
    with s.state.pool.batcher._cv:
        for t in threads:
            t.start()
        for _ in range(CLIENTS):
            assert answered.acquire(timeout=60)
        with s.http() as http:
            h = http.get("/health").json()
            too_long = http.post("/v1/completions", json=dict(GREEDY, prompt="word " * (2 * N_CTX)))
    for t in threads:
        t.join(120)
    served = sum(st == 200 for st in statuses)
    assert sum(st == 429 for st in statuses) == CLIENTS - served >= CLIENTS - PARALLEL - QUEUE
    assert served >= PARALLEL + 1
    assert h["waiting"] == QUEUE and h["busy"] is True
    assert sum(x["state"] == "prefill" and x["request"] is not None for x in h["slots"]) == PARALLEL
    assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]

    s.wait_idle(done0 + served)

    def idle() -> bool:
        with s.http() as http:
            h = http.get("/health").json()
        return h["waiting"] == 0 and not h["busy"] and {x["state"] for x in h["slots"]} == {"idle"}

    wait_for(idle)
    with s.http() as http:
        h = http.get("/health").json()
        after = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
    assert h["prefix_cache"]["bytes"] <= h["prefix_cache"]["limit_bytes"]
    assert all(x["request"] is None for x in h["slots"])
    assert after == before
    lines = [r.getMessage() for r in caplog.records if " in=" in r.getMessage()]
    assert sum("finish=cancelled" in line for line in lines) >= served // 2
    assert sum("finish=length" in line for line in lines) >= served - served // 2
    assert all(" cached=" in line for line in lines)
    stats = s.state.pool.batcher.stats()
    assert stats["shared_rounds"] > 0 and stats["max_slots"] >= 2, stats
    assert stats["split_rounds"] == 0, stats


def test_every_route_runs_in_a_slot(slots_server):
    s = slots_server
    eng = s.engine
    ask = [{"role": "user", "content": "hello there"}]
    want = eng.chat(ask, max_new_tokens=8, temperature=0, ignore_eos=True)
    done, lookups = s.worker.jobs_done, s.state.pool.cache.lookups
    with s.http() as http:
        chat = http.post(
            "/v1/chat/completions",
            json=dict(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0, ignore_eos=True),
        )
        msg = http.post(
            "/v1/messages", json=dict(model=MODEL_ID, messages=ask, max_tokens=8, temperature=0)
        )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == want
    assert msg.status_code == 200 and msg.json()["type"] == "message"
    s.wait_idle(done + 2)
    assert s.state.pool.cache.lookups == lookups + 2  # each bound a slot


def test_a_hybrid_engine_serves_one_request_at_a_time(synth_gguf, tmp_path):
    from test_speculative import _plan

    from powerinfer_rs.server.cli import startup_lines

    model = load_model(synth_gguf(dtype="F32", activation="relu"))
    eng = Engine(model, threads=2, sparsity="exact-relu", plan=_plan(model, tmp_path),
                 device="gpu-sim")  # fmt: skip
    live = LiveServer(eng, parallel=4, cache_mib=8)
    try:
        with live.http() as http:
            h = http.get("/health").json()
            got = http.post("/v1/completions", json=GREEDY).json()["choices"][0]["text"]
        assert h["batching"] is False and h["parallel"] == 1 and len(h["slots"]) == 1
        assert h["prefix_cache"]["limit_bytes"] == 0 and live.state.pool is None
        assert got == eng.generate("hello world", max_new_tokens=12, temperature=0, ignore_eos=True)
        lines = startup_lines(live.state, 4, 8, "http://x/v1")
        assert "one request at a time" in lines[0] and "batching off" in lines[1]
    finally:
        live.stop()


def test_health_of_a_server_without_slots(server):
    """``create_app``'s defaults (``serve --parallel 1 --cache-ram 0``): the engine's own
    context, one request at a time, as before."""
    with server.http() as http:
        h = http.get("/health").json()
    assert h["parallel"] == 1 and h["batching"] is False and server.state.pool is None
    assert len(h["slots"]) == 1 and h["slots"][0]["id"] == 0
    assert h["prefix_cache"]["entries"] == 0 and h["prefix_cache"]["limit_bytes"] == 0


def test_concurrent_sampled_answers_are_the_sequential_ones(slots_server):
    """Seeded sampling: each row is computed exactly as alone, so the draws are the same."""
    s = slots_server
    n = QUEUE  # never a 429, however the worker threads are late to take jobs from the queue

    def send(i: int) -> str:
        body = dict(GREEDY, prompt=f"note {i}:", temperature=0.9, seed=i, max_tokens=48)
        with s.http() as http:
            r = http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    rounds0 = s.state.pool.batcher.shared_rounds
    out: list[str | None] = [None] * n
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, send(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert out == [send(i) for i in range(n)]
    assert s.state.pool.batcher.shared_rounds > rounds0
