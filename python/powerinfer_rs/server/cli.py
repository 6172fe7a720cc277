"""``python -m powerinfer_rs serve``: its arguments and the uvicorn run. The ASGI stack is
imported only when the server starts, so the rest of the command line works without it."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from .._lazy import optional_import
from ..loading.gguf_split import SHARD_NAME
from .auth import APIKeyFileError, read_key_file, split_keys

SERVER_EXTRA = "pip install 'powerinfer-rs[server]'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The server's own options (the model options come from the main command line)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (8000)")
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY[,KEY...]",
        help="require one of these keys, in 'Authorization: Bearer KEY' (or Anthropic's "
        "'x-api-key: KEY'); repeatable, or a comma list (default: $POWERINFER_RS_API_KEY; none)",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="more keys, one a line ('#' starts a comment); a missing or empty file stops "
        "the server at startup",
    )
    p.add_argument(
        "--cors-origins",
        default=None,
        metavar="ORIGINS",
        help="let browser pages from these origins call the API: a comma list "
        "('https://a.example,http://localhost:3000') or '*' for any (default: off). Preflight "
        "OPTIONS requests need no key",
    )
    p.add_argument(
        "--metrics",
        action="store_true",
        help="serve GET /metrics in Prometheus' text format: requests by endpoint and status, "
        "tokens, prefill and decode seconds, busy slots, the queue, the prefix cache, "
        "speculative drafts (default: off; it asks for the API key as the other routes do; "
        "needs prometheus_client)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for the engine; more are answered 429 (64)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=4,
        help="requests decoding together, each in a slot of its own, one batched pass per step "
        "(4; 1: one request at a time). A hybrid GPU engine serves one at a time",
    )
    p.add_argument(
        "--cache-ram",
        type=int,
        default=2048,
        metavar="MIB",
        help="RAM for the slots' prefix cache: the KV of earlier prompts, reused by new requests "
        "that start with the same tokens (2048 MiB; 0: off)",
    )
    p.add_argument(
        "--reasoning-format",
        choices=("auto", "none"),
        default="auto",
        help="auto (default): a <think> template's reasoning goes to reasoning_content and "
        "Anthropic thinking blocks; none: it stays in the answer's content",
    )
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        metavar="N",
        help="-1 (default): the model thinks as it likes; 0: no thinking (the template is "
        "rendered with enable_thinking false, where it reads it)",
    )
    p.add_argument(
        "--pooling",
        choices=("mean", "cls", "last"),
        default=None,
        help="how /v1/embeddings pools the tokens' hidden states (default: the file's "
        "pooling_type; mean where it names none)",
    )
    p.add_argument(
        "--model-alias", default=None, help="the model's id in the API (default: the file name)"
    )
    p.add_argument("--log-level", default="info", help="debug, info (default), warning")


def model_id(model: str | None, alias: str | None) -> str:
    """The id the API serves the model under: ``alias``, else the file or directory name
    without ``.gguf`` (and without a split file's ``-00001-of-0000N``)."""
    if alias:
        return alias
    if model is None:
        from ..runtime.default_model import default_model_path

        model = str(default_model_path())
    name = Path(model).name or Path(model).resolve().name
    name = SHARD_NAME.sub(".gguf", name)  # a split file's model, not its first shard
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def api_keys(a: argparse.Namespace) -> list[str]:
    """The keys the server asks for: ``--api-key`` (each one a key or a comma list; else
    $POWERINFER_RS_API_KEY) and ``--api-key-file``'s; a file that cannot be read or lists no
    key stops the command (:class:`SystemExit`)."""
    given = a.api_key if a.api_key else [os.environ.get("POWERINFER_RS_API_KEY")]
    keys = split_keys(given)
    if a.api_key_file is not None:
        try:
            keys += read_key_file(a.api_key_file)
        except APIKeyFileError as e:
            raise SystemExit(f"serve: {e}") from None
    return keys


def serve(a: argparse.Namespace, engine_options: dict) -> int:
    """Load the engine and serve it until interrupted."""
    uvicorn = optional_import("uvicorn", "serve", SERVER_EXTRA)
    optional_import("starlette", "serve", SERVER_EXTRA)
    optional_import("pydantic", "serve", SERVER_EXTRA)
    if a.metrics:
        optional_import("prometheus_client", "serve --metrics", SERVER_EXTRA)
    from ..runtime.engine import Engine
    from ..runtime.speculative import mode_of_flag
    from .app import create_app

    if a.max_queue < 1:
        raise SystemExit(f"serve: --max-queue must be >= 1, got {a.max_queue}")
    if a.parallel < 1:
        raise SystemExit(f"serve: --parallel must be >= 1, got {a.parallel}")
    if a.cache_ram < 0:
        raise SystemExit(f"serve: --cache-ram must be >= 0, got {a.cache_ram}")
    if a.reasoning_budget not in (-1, 0):
        raise SystemExit(f"serve: --reasoning-budget must be -1 or 0, got {a.reasoning_budget}")
    keys = api_keys(a)  # a bad key file fails before the model loads
    logging.basicConfig(
        level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    engine = Engine.from_pretrained(a.model, **engine_options)
    name = model_id(a.model, a.model_alias)
    app = create_app(
        engine,
        model_id=name,
        api_key=keys or None,
        cors_origins=a.cors_origins,
        metrics_route=a.metrics,
        max_queue=a.max_queue,
        speculative=mode_of_flag(a.speculative),
        draft_max=a.draft_max,
        parallel=a.parallel,
        cache_mib=a.cache_ram,
        reasoning_format=a.reasoning_format,
        reasoning_budget=a.reasoning_budget,
        pooling=a.pooling,
    )
    log = logging.getLogger("powerinfer_rs.server")
    url = f"http://{a.host}:{a.port}/v1"
    for line in startup_lines(app.state.server, a.parallel, a.cache_ram, url):
        log.info("%s", line)
    uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level, access_log=False)
    return 0


def startup_lines(state: Any, parallel: int, cache_mib: int, url: str) -> list[str]:
    """What the server says when it starts: how it serves (slots, batching, the prefix cache)
    and where, and, for a hybrid engine asked for slots, that it serves one request at a
    time."""
    engine, pool = state.engine, state.pool
    lines = []
    if not engine.can_batch and (parallel > 1 or cache_mib > 0):
        lines.append(
            f"device {engine.device}: a hybrid engine serves one request at a time (batching "
            f"off, no prefix cache; --parallel {parallel} and --cache-ram {cache_mib} do not "
            "apply)"
        )
    cache = f"{pool.cache.limit_bytes >> 20} MiB" if pool and pool.cache.enabled else "off"
    lines.append(
        f"serving {state.model_id} ({engine.threads} threads, context {engine.n_ctx}, "
        f"{state.slots} slot{'' if state.slots == 1 else 's'}, batching "
        f"{'on' if state.batching else 'off'}, prefix cache {cache}) on {url}"
    )
    return lines
