"""The live server under concurrent clients: every request answered, and with fixed seeds the
same answers as one at a time; a client that disconnects mid-stream stops its generation within
one token and the next request is served normally."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from live_server import MODEL_ID, chat, openai

CLIENTS = 16
REQUESTS_PER_CLIENT = 4
TOPICS = ["rivers", "bread", "stars", "music", "trains", "cats", "rain", "maps"]


def request_kwargs(client: int, k: int) -> dict:
    """Request ``k`` of client ``client``: chat or completion, sampled with its own seed."""
    seed = 100 * client + k
    topic = TOPICS[(client + k) % len(TOPICS)]
    common = dict(model=MODEL_ID, max_tokens=6, temperature=0.9, seed=seed)
    if (client + k) % 2:
        return dict(kind="chat", messages=chat(f"Say something about {topic}."), **common)
    return dict(kind="completion", prompt=f"A short note on {topic}:", **common)


def send(server, kw: dict) -> str:
    kw = dict(kw)
    client = server.client()
    if kw.pop("kind") == "chat":
        return client.chat.completions.create(**kw).choices[0].message.content
    return client.completions.create(**kw).choices[0].text


def test_concurrent_clients_get_the_answers_of_sequential_requests(server):
    def client_run(c: int) -> list[str]:
        return [send(server, request_kwargs(c, k)) for k in range(REQUESTS_PER_CLIENT)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        concurrent = list(pool.map(client_run, range(CLIENTS)))
    sequential = [
        [send(server, request_kwargs(c, k)) for k in range(REQUESTS_PER_CLIENT)]
        for c in range(CLIENTS)
    ]
    assert all(len(answers) == REQUESTS_PER_CLIENT for answers in concurrent)
    assert all(a for answers in concurrent for a in answers)
    assert concurrent == sequential


def test_a_disconnect_mid_stream_stops_the_generation(server):
    done = server.worker.jobs_done
    stream = server.client().chat.completions.create(
        model=MODEL_ID,
        messages=chat("Tell me a long story."),
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got == 3:
            break
    stream.close()  # the client goes away
    t0 = time.monotonic()
    server.wait_idle(done + 1)
    job = server.worker.last
    assert job.result.finish_reason == "cancelled"
    assert job.tokens_at_cancel is not None
    assert job.completion_tokens - job.tokens_at_cancel <= 1  # stopped within one token
    assert job.completion_tokens < 400 and time.monotonic() - t0 < 10
    # The engine is free: a normal request is answered as usual.
    got = server.client().completions.create(
        model=MODEL_ID, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    want = server.engine.generate("The capital of France is", max_new_tokens=4, temperature=0)
    assert got.choices[0].text == want and got.choices[0].finish_reason == "length"


def test_a_request_cancelled_while_waiting_never_runs(server):
    done = server.worker.jobs_done
    answers: list = []
    kw = dict(model=MODEL_ID, prompt="Hi", max_tokens=3, temperature=0)
    with server.engine.ctx.lock:  # hold the engine: the first request runs and blocks
        first = threading.Thread(
            target=lambda: answers.append(server.client().completions.create(**kw))
        )
        first.start()
        while server.worker.current is None:
            first.join(0.01)
        with pytest.raises(openai.APITimeoutError):  # waits in the queue, then gives up
            server.client().with_options(timeout=0.5).completions.create(**kw)
        assert server.worker.waiting == 1
    first.join(60)
    server.wait_idle(done + 2)
    assert answers and answers[0].choices[0].text
    assert server.worker.last.result.finish_reason == "cancelled"
    assert server.worker.last.completion_tokens == 0 and server.worker.last.first_token is None


def test_stopping_the_worker_ends_queued_jobs(server):
    import asyncio

    from powerinfer_rs.server.worker import Done, Job, QueueFull, Worker

    async def main():
        worker = Worker(2)  # never started: the job stays queued
        job = Job(
            "x", server.engine.stream_tokens("Hi", max_new_tokens=2), asyncio.get_running_loop()
        )
        worker.submit(job)
        worker.stop()
        with pytest.raises(QueueFull):
            worker.submit(job)
        return await asyncio.wait_for(job.events.get(), 5)

    event = asyncio.run(main())
    assert isinstance(event, Done) and event.finish_reason == "cancelled"
