"""``serve --cors-origins``: Starlette's :class:`~starlette.middleware.cors.CORSMiddleware`,
so browser front-ends on the listed origins can call the API. It answers preflight
``OPTIONS`` requests itself, before any route (so they need no API key), and allows the
methods and headers those front-ends send."""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

#: The headers browser clients of OpenAI's and Anthropic's APIs send.
ALLOWED_HEADERS = [
    "Authorization",
    "Content-Type",
    "Accept",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "OpenAI-Organization",
    "OpenAI-Project",
    "X-Stainless-Arch",
    "X-Stainless-Lang",
    "X-Stainless-OS",
    "X-Stainless-Package-Version",
    "X-Stainless-Retry-Count",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Timeout",
    "X-Requested-With",
]
ALLOWED_METHODS = ["GET", "POST", "OPTIONS"]


def parse_origins(origins: str | list[str] | None) -> list[str]:
    """The origins of ``--cors-origins`` (a comma list, ``*``, or a list already), blanks
    dropped; an empty list: CORS off."""
    if origins is None:
        return []
    items = origins.split(",") if isinstance(origins, str) else list(origins)
    return [o.strip().rstrip("/") for o in items if o.strip()]


def cors_middleware(origins: str | list[str] | None) -> list[Middleware]:
    """The middleware list for ``origins`` (:func:`parse_origins`): none when it is empty.
    Credentials (cookies) are not allowed: the API authenticates with headers."""
    allowed = parse_origins(origins)
    if not allowed:
        return []
    return [
        Middleware(
            CORSMiddleware,
            allow_origins=allowed,
            allow_methods=ALLOWED_METHODS,
            allow_headers=ALLOWED_HEADERS,
            expose_headers=["Retry-After"],
            max_age=600,
        )
    ]
