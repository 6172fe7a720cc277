"""``GET /metrics`` (``serve --metrics``): the server's counters in Prometheus' text format,
rendered by ``prometheus_client``. The server counts requests (by endpoint and status), prompt
and generated tokens, prefill and decode seconds and speculative drafts (:class:`Counters`);
the slots, the queue and the prefix cache are read from :func:`~.health.health_body` at each
scrape, so they agree with ``/health``."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .health import health_body

if TYPE_CHECKING:
    from .app import ServerState
    from .worker import Job

PREFIX = "powerinfer_rs"

#: The routes counted by name; any other path counts as "other" (so odd paths cannot grow
#: the label set without bound).
ENDPOINTS = (
    "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions",
    "/v1/messages", "/v1/messages/count_tokens",
)  # fmt: skip


def endpoint_of(path: str) -> str:
    """The ``endpoint`` label of ``path``."""
    if path in ENDPOINTS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "other"


class Counters:
    """What the server counts (thread-safe): requests by (endpoint, status), and over every
    finished generation its prompt and generated tokens, prefill and decode seconds, and
    speculative drafted and accepted tokens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.totals: dict[str, float] = dict.fromkeys(TOTALS, 0)

    def request(self, path: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint_of(path), str(status))] += 1

    def job(self, job: Job) -> None:
        """Add a finished job's counts (:attr:`~.worker.Worker.on_done`)."""
        done = job.result
        if done is None:
            return
        s = done.stats
        add = {"prompt_tokens": done.prompt_tokens, "generated_tokens": done.completion_tokens}
        if s is not None:
            add |= {
                "prefill_seconds": s.prefill_seconds,
                "decode_seconds": s.decode_seconds,
                "speculative_drafted_tokens": s.drafted_tokens,
                "speculative_accepted_tokens": s.accepted_tokens,
            }
        with self._lock:
            for k, v in add.items():
                self.totals[k] += v

    def snapshot(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        with self._lock:
            return dict(self.requests), dict(self.totals)


#: The generation totals: name -> help.
TOTALS = {
    "prompt_tokens": "Prompt tokens of finished generations (cached ones included)",
    "generated_tokens": "Tokens generated",
    "prefill_seconds": "Seconds spent in prompt prefill",
    "decode_seconds": "Seconds spent decoding",
    "speculative_drafted_tokens": "Speculative draft tokens sent to verification",
    "speculative_accepted_tokens": "Speculative draft tokens accepted",
}


#: The prefix cache's counters in /health: key -> help.
CACHE_COUNTERS = {
    "lookups": "Prefix cache lookups",
    "hits": "Prefix cache hits",
    "hit_tokens": "Prompt tokens served from the prefix cache",
}


class Collector:
    """The ``prometheus_client`` collector of one server: its :class:`Counters` and, read at
    each scrape, its /health state."""

    def __init__(self, state: ServerState, counters: Counters):
        self.state, self.counters = state, counters

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        requests, totals = self.counters.snapshot()
        fam = CounterMetricFamily(
            f"{PREFIX}_requests", "HTTP requests answered", labels=["endpoint", "status"]
        )
        for (endpoint, status), n in sorted(requests.items()):
            fam.add_metric([endpoint, status], n)
        yield fam
        for name, text in TOTALS.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=totals[name])
        h = health_body(self.state)
        busy = sum(1 for s in h["slots"] if s["state"] != "idle")
        cache = h["prefix_cache"]
        gauges = {
            "slots": ("Slots (requests that run at once)", h["parallel"]),
            "slots_busy": ("Slots running a request", busy),
            "queue_length": ("Requests waiting for a slot", h["waiting"]),
            "prefix_cache_bytes": ("Bytes held by the prefix cache", cache["bytes"]),
            "prefix_cache_entries": ("Entries in the prefix cache", cache["entries"]),
        }
        for name, (text, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", text, value=value)
        for key, text in CACHE_COUNTERS.items():
            yield CounterMetricFamily(f"{PREFIX}_prefix_cache_{key}", text, value=cache[key])


def render(state: ServerState, counters: Counters) -> bytes:
    """The text format of ``state``'s metrics (a fresh registry per scrape)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(state, counters))
    return generate_latest(registry)


class CountRequests:
    """ASGI middleware counting each HTTP request by endpoint and the status it was answered
    with (a stream's status is its first line; a request that fails before answering counts
    as 500)."""

    def __init__(self, app: Any, counters: Counters):
        self.app, self.counters = app, counters

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counted_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            self.counters.request(scope["path"], status)
