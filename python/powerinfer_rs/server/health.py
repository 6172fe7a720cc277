"""``GET /health``: the server's state without touching the engine (no lock is taken, so it
answers while requests run): the model, whether it is busy, the queue, the slots and the prefix
cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..runtime.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from .app import ServerState


def engine_slot(state: ServerState) -> dict[str, Any]:
    """The one slot of a server without a slot pool: the engine's own context."""
    job = state.worker.current
    s = state.engine.last_stats
    return {
        "id": 0,
        "state": "idle" if job is None else "decode",
        "request": None if job is None else job.id,
        "n_past": len(state.engine.ctx.ids),
        "prompt_tokens": s.prompt_tokens,
        "cached_tokens": s.cached_tokens,
        "completion_tokens": s.completion_tokens,
    }


def health_body(state: ServerState) -> dict[str, Any]:
    """The body of /health: "status", "model", "busy", "waiting" (queued requests), "parallel"
    (requests that run at once), "batching" (whether they decode together), "slots" (each
    one's id, state, request, n_past, prompt_tokens, cached_tokens, completion_tokens) and
    "prefix_cache" (entries, bytes, limit_bytes, lookups, hits, hit_rate, hit_tokens) and, with
    slots, "rounds" (the batcher's counters: decode rounds, the slot rows they served, rounds
    shared by several slots, the most slots in one, prefill chunks and tokens; rows / rounds is
    how many streams a decode step carried on average)."""
    pool = state.pool
    rounds = None
    if pool is None:
        slots, cache = [engine_slot(state)], PrefixCache(0).stats()
    else:
        stats = pool.stats()
        slots, cache, rounds = pool.info(), stats["prefix_cache"], stats["batcher"]
    return {
        "status": "ok",
        "model": state.model_id,
        "busy": state.worker.current is not None,
        "waiting": state.worker.waiting,
        "parallel": state.slots,
        "batching": state.batching,
        "slots": slots,
        "prefix_cache": cache,
        **({"rounds": rounds} if rounds is not None else {}),
    }


async def health(request: Request) -> Response:
    return JSONResponse(health_body(request.app.state.server))
