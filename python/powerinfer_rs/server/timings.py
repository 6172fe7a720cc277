"""The ``timings`` object of a chat or completion answer, as llama-server's: prompt tokens
served from the prefix cache (``cache_n``) and computed (``prompt_n``), the generated tokens
(``predicted_n``), and each phase's milliseconds, milliseconds per token and tokens per
second. A non-streamed answer carries it in its body, a stream in its last chunk (the one with
the finish reason)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .worker import Done


def _rates(prefix: str, n: int, seconds: float) -> dict[str, Any]:
    """``{prefix}_n``, ``_ms``, ``_per_token_ms`` and ``_per_second`` (0 without tokens or
    time)."""
    ms = seconds * 1000.0
    return {
        f"{prefix}_n": n,
        f"{prefix}_ms": ms,
        f"{prefix}_per_token_ms": ms / n if n else 0.0,
        f"{prefix}_per_second": n / ms * 1000.0 if n and ms > 0 else 0.0,
    }


def timings(done: Done) -> dict[str, Any]:
    """The timings of a finished job: ``prompt_n + cache_n`` is the prompt's token count,
    ``predicted_n`` the answer's (its ``usage.completion_tokens``)."""
    s = done.stats
    cached = s.cached_tokens if s is not None else 0
    prompt_seconds = s.prefill_seconds if s is not None else 0.0
    decode_seconds = s.decode_seconds if s is not None else 0.0
    return {
        "cache_n": cached,
        **_rates("prompt", max(done.prompt_tokens - cached, 0), prompt_seconds),
        **_rates("predicted", done.completion_tokens, decode_seconds),
    }
