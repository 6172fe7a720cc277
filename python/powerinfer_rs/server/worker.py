"""Worker threads (one per slot; one for an engine serving one request at a time) take jobs
from one bounded queue in arrival order and run each job's token stream, handing every step to
the job's asyncio queue. The event loop never runs model work; a cancelled job (its client went
away) stops before its next forward pass, so within one token, and closing its stream frees its
slot."""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..runtime.streaming import GenerationCancelled, TokenStream

log = logging.getLogger("powerinfer_rs.server")


class QueueFull(Exception):
    """The queue holds ``max_queue`` waiting requests already."""


@dataclass
class Done:
    """The last event of a job: why it ended, and its token counts and times."""

    finish_reason: str  # the engine's ("eos", "stop", "length", "context"), or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    error: BaseException | None = None
    stop_sequence: str | None = None  # the stop string that ended it
    #: The stream's :class:`~..runtime.generation.GenerationStats` (prefill and decode times,
    #: prompt tokens from the cache, speculative counts); None before it ran.
    stats: Any = None


@dataclass
class Job:
    """A request's generation: built on the event loop, run by the worker thread."""

    id: str
    steps: TokenStream
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None
    completion_tokens: int = 0
    #: Completion tokens made when the job was cancelled (None: not cancelled).
    tokens_at_cancel: int | None = None
    result: Done | None = None
    _cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop the generation before its next forward pass (or before it starts; a slot's
        prefill at its next chunk)."""
        if not self._cancel.is_set():
            self.tokens_at_cancel = self.completion_tokens
            self._cancel.set()
            self.steps.cancel()

    def _emit(self, event: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()


class Worker:
    """``threads`` threads running jobs (one: the thread that owns the engine's context;
    more: one per slot of a :class:`~..runtime.slots.SlotPool`). ``submit`` queues a job or
    raises :class:`QueueFull` at once; ``jobs_done`` counts finished jobs (tests wait on it);
    ``running`` maps each busy thread to its job; ``on_done``, when set, is called with each
    finished job (in its thread, before it counts in ``jobs_done``)."""

    def __init__(self, max_queue: int, threads: int = 1):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.max_queue = max_queue
        self.n_threads = threads
        self._queue: queue.Queue[Job] = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._done_lock = threading.Lock()
        self.running: dict[int, Job] = {}
        self.last: Job | None = None
        self.jobs_done = 0
        self.on_done: Callable[[Job], None] | None = None
        self._ids = itertools.count(1)

    @property
    def current(self) -> Job | None:
        """A running job (the oldest), or None when all threads are idle."""
        jobs = list(self.running.values())
        return min(jobs, key=lambda j: j.created) if jobs else None

    def next_id(self) -> int:
        return next(self._ids)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        for i in range(self.n_threads):
            name = "powerinfer-server" + (f"-{i}" if self.n_threads > 1 else "")
            t = threading.Thread(target=self._run, args=(i,), name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what is queued and running, and end the threads."""
        self._stop.set()
        for job in list(self.running.values()):
            job.cancel()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            job.cancel()
            job.result = Done("cancelled", job.steps.stats.prompt_tokens, 0)
            job._emit(job.result)
        for t in self._threads:
            t.join(timeout)

    def submit(self, job: Job) -> None:
        if self._stop.is_set():
            raise QueueFull("the server is shutting down")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(
                f"{self.max_queue} requests are waiting for the engine already; try again later"
            ) from None

    def _run(self, index: int) -> None:
        while not self._stop.is_set():
            try:
                job = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self.running[index] = job
            try:
                job.result = self._generate(job)
            finally:
                job.finished = time.perf_counter()
                _log_job(job)  # before the job counts as done: tests wait on jobs_done
                if self.on_done is not None:
                    self.on_done(job)
                with self._done_lock:
                    del self.running[index]
                    self.last = job
                    self.jobs_done += 1
                job._emit(job.result)

    def _generate(self, job: Job) -> Done:
        stats = job.steps.stats
        try:
            if not job.cancelled:
                for step in job.steps:
                    if step.token is not None:
                        job.completion_tokens += 1
                    if job.first_token is None:
                        job.first_token = time.perf_counter()
                    job._emit(step)
                    if job.cancelled:
                        break
        except GenerationCancelled:  # cancelled during its prefill
            pass
        except Exception as e:  # the engine refused or failed: the client gets the error
            log.exception("request %s failed", job.id)
            return Done("error", stats.prompt_tokens, job.completion_tokens, e)
        finally:
            job.steps.close()
        reason = "cancelled" if job.cancelled else stats.finish_reason
        return Done(
            reason, stats.prompt_tokens, job.completion_tokens, None, stats.stop_sequence, stats
        )


def _log_job(job: Job) -> None:
    r = job.result
    if r is None:
        return
    ttft = (job.first_token or job.finished or job.created) - job.created
    decode = (job.finished or 0.0) - (job.first_token or 0.0)
    rate = (job.completion_tokens - 1) / decode if job.completion_tokens > 1 and decode > 0 else 0
    log.info(
        "%s in=%d cached=%d out=%d ttft=%.3fs %.1f tok/s finish=%s",
        job.id,
        r.prompt_tokens,
        job.steps.stats.cached_tokens,
        r.completion_tokens,
        ttft,
        rate,
        r.finish_reason,
    )
