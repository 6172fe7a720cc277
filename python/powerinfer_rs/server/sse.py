"""Reading a job's events on the event loop: the whole answer, or server-sent events (one
``data: {json}`` per chunk, ending in ``data: [DONE]``); and the watch for a client that goes
away, which cancels the job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from ..runtime.constrain import GrammarError
from ..runtime.streaming import TokenStep, TokenStream
from .echo import echo_chunk
from .errors import APIError
from .responses import ChunkMaker
from .worker import Done, Job, QueueFull, Worker

DONE_EVENT = b"data: [DONE]\n\n"


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def failure(done: Done) -> APIError:
    """The error a job that failed in the engine answers with (no traceback): the request's
    own constraint failing on the way (a grammar too complex for the grammar engine) is the
    request's fault, a 400; anything else a 500."""
    e = done.error
    if isinstance(e, GrammarError):
        return APIError(400, f"generation failed: {e}", code="invalid_schema")
    return APIError(500, f"generation failed: {type(e).__name__}: {e}", type="server_error")


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client disconnects (run as a task; cancelled when the answer is
    complete)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def start_job(
    request: Request, worker: Worker, rid: str, steps: TokenStream
) -> tuple[Job, asyncio.Task]:
    """Queue the generation ``steps`` as job ``rid`` (a full queue is a 429, the steps closed)
    and watch for the client going away; the job and the watcher task."""
    job = Job(rid, steps, asyncio.get_running_loop())
    try:
        worker.submit(job)
    except QueueFull as e:
        steps.close()
        raise APIError(429, str(e), type="rate_limit_error", code="queue_full") from None
    return job, asyncio.create_task(watch_disconnect(request, job))


async def collect(job: Job) -> tuple[str, list[TokenStep], Done]:
    """Wait for the whole generation: its text, its steps and how it ended."""
    texts: list[str] = []
    steps: list[TokenStep] = []
    while True:
        event = await job.events.get()
        if isinstance(event, Done):
            return "".join(texts), steps, event
        texts.append(event.text)
        steps.append(event)


async def collect_answer(job: Job, watcher: asyncio.Task) -> tuple[str, list[TokenStep], Done]:
    """A non-streamed answer's whole generation (:func:`collect`), the disconnect ``watcher``
    and the job ended afterwards whatever happens; a generation that failed in the engine
    raises :func:`failure`'s error."""
    try:
        text, steps, done = await collect(job)
    finally:
        watcher.cancel()
        job.cancel()
    if done.error is not None:
        raise failure(done)
    return text, steps, done


async def event_stream(job: Job, chunks: ChunkMaker, watcher: asyncio.Task) -> AsyncIterator[bytes]:
    """The body of a streamed answer. Steps whose text is held back (part of a character or of
    a possible stop string) travel with the next chunk that has text."""
    try:
        first = chunks.first()
        if first is not None:
            yield sse(first)
        text, steps, started = "", [], False
        while True:
            event = await job.events.get()
            if not started and not (isinstance(event, Done) and event.error is not None):
                echoed = echo_chunk(chunks, job.steps)  # the prompt's pass is done by now
                if echoed is not None:
                    yield sse(echoed)
            if isinstance(event, Done):
                break
            if not started:
                started = True
                progress = chunks.prompt_progress(job.steps.stats)
                if progress is not None:
                    yield sse(progress)
            text += event.text
            steps.append(event)
            if text:
                piece = chunks.piece(text, steps)
                if piece is not None:
                    yield sse(piece)
                text, steps = "", []
        if event.error is not None:
            yield sse(failure(event).body())
        else:
            for chunk in chunks.last(text, steps, event):
                yield sse(chunk)
            usage = chunks.usage(event)
            if usage is not None:
                yield sse(usage)
        yield DONE_EVENT
    finally:
        watcher.cancel()
        job.cancel()
