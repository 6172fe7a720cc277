"""The ASGI application (Starlette): routes, the API-key check, request parsing, and the
hand-over of each generation to the :class:`~.worker.Worker`."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._lazy import optional_import
from ..errors import PowerInferError
from ..runtime.chat import ChatTemplateError
from ..runtime.constrain import GrammarError
from ..runtime.engine import Engine
from ..runtime.reasoning import ReasoningSplitter
from ..runtime.slots import SlotPool
from ..runtime.speculative import DEFAULT_DRAFT_MAX, resolve_speculative
from ..runtime.streaming import TokenStream
from . import anthropic
from .auth import bearer_key, key_matches, normalise_keys
from .constraints import response_grammar
from .cors import cors_middleware
from .echo import EchoStream, apply_echo, echo_stream
from .errors import APIError, from_engine, parse_body
from .fields import unknown_field_error
from .health import health
from .metrics import Counters, CountRequests, render
from .responses import Calls, ChunkMaker, Envelope, TokenText, calls_for, full_response
from .schemas import ChatRequest, CompletionRequest, NamedToolChoice, unsupported_fields
from .speculation import DEFAULTS, SpeculativeDefaults, speculative_kwargs
from .sse import collect_answer, event_stream, start_job
from .thinking import check_format, splitter_for, template_kwargs
from .worker import Worker

log = logging.getLogger("powerinfer_rs.server")

#: Requests that may wait for the engine when none is given.
DEFAULT_MAX_QUEUE = 64


@dataclass
class ServerState:
    """What the routes share: the engine, its worker, the served model's id and the key, and
    the slot pool when requests run in slots (``parallel`` > 1 or a prefix cache, on an engine
    that can batch: :attr:`~..runtime.engine.Engine.can_batch`); without one the worker's one
    thread runs the engine's own context, one request at a time."""

    engine: Engine
    model_id: str
    api_keys: tuple[str, ...] = ()
    max_queue: int = DEFAULT_MAX_QUEUE
    speculative: SpeculativeDefaults = field(default_factory=SpeculativeDefaults)
    parallel: int = 1
    cache_mib: int = 0
    reasoning_format: str = "auto"
    reasoning_budget: int = -1
    created: int = field(default_factory=lambda: int(time.time()))
    worker: Worker = field(init=False)
    counters: Counters = field(init=False, default_factory=Counters)
    pool: SlotPool | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.engine.can_batch and (self.parallel > 1 or self.cache_mib > 0):
            self.pool = SlotPool(self.engine, self.parallel, cache_bytes=self.cache_mib << 20)
        self.worker = Worker(self.max_queue, self.slots)
        self.worker.on_done = self.counters.job

    @property
    def slots(self) -> int:
        """Requests that run at once."""
        return self.pool.parallel if self.pool is not None else 1

    @property
    def batching(self) -> bool:
        """Whether running requests decode together (in one batched pass per step)."""
        return self.slots > 1

    def stream_tokens(self, rid: str) -> Callable[..., TokenStream]:
        """What makes request ``rid``'s token stream: the pool's (the stream runs in a slot
        labelled ``rid``) or the engine's."""
        if self.pool is None:
            return self.engine.stream_tokens
        return functools.partial(self.pool.stream_tokens, request=rid)


def api_route(
    fn: Callable[[Request, ServerState], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route answering every failure in OpenAI's error shape, never with a traceback."""

    @functools.wraps(fn)
    async def route(request: Request) -> Response:
        state: ServerState = request.app.state.server
        try:
            return await fn(request, state)
        except APIError as e:
            log.info("%s %s -> %d %s", request.method, request.url.path, e.status, e.message)
            return error_response(e)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(APIError(500, "internal server error", type="server_error"))

    return route


def error_response(e: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def check_key(request: Request, state: ServerState) -> None:
    if not state.api_keys:
        return
    given = request.headers.get("authorization", "")
    if not key_matches(bearer_key(given), state.api_keys):
        what = "no API key given" if not given else "incorrect API key"
        raise APIError(401, f"{what} (send 'Authorization: Bearer KEY')", code="invalid_api_key")


def model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "powerinfer-rs",
    }


@api_route
async def list_models(request: Request, state: ServerState) -> Response:
    check_key(request, state)
    return JSONResponse({"object": "list", "data": [model_card(state)]})


@api_route
async def get_model(request: Request, state: ServerState) -> Response:
    check_key(request, state)
    name = request.path_params["model"]
    if name != state.model_id:
        raise unknown_model(name, state)
    return JSONResponse(model_card(state))


def unknown_model(name: str, state: ServerState) -> APIError:
    return APIError(
        404,
        f"the model '{name}' does not exist; this server serves '{state.model_id}'",
        param="model",
        code="model_not_found",
    )


async def parse(request: Request, kind: type) -> ChatRequest | CompletionRequest:
    req = parse_body(await request.body(), kind)
    state: ServerState = request.app.state.server
    if req.model is not None and req.model != state.model_id:
        raise unknown_model(req.model, state)
    if req.n != 1:
        raise APIError(400, f"n={req.n}: this server returns one choice per request", param="n")
    if getattr(req, "best_of", None) not in (None, 1):
        raise APIError(400, "best_of must be 1 (one choice per request)", param="best_of")
    bad = unsupported_fields(req)
    if bad:
        raise APIError(400, f"'{bad[0]}' is not supported by this server", param=bad[0])
    unknown = unknown_field_error(req.model_extra or {})
    if unknown is not None:
        raise unknown
    return req


def tool_setup(engine: Engine, req: ChatRequest) -> Calls | None:
    """The request's tools and how the answer starts (see :class:`~.responses.Calls`); a
    ``tool_choice`` that names no given tool is a 400."""
    tools = req.active_tools
    choice = req.tool_choice
    if choice not in (None, "none", "auto") and not req.tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    if tools is None:
        return None
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    calls = calls_for(engine, tools, choice == "required", named, "tool_choice")
    calls.first_only = req.parallel_tool_calls is False
    return calls


def prepare(
    engine: Engine,
    req: ChatRequest | CompletionRequest,
    defaults: SpeculativeDefaults = DEFAULTS,
    stream_tokens: Callable[..., TokenStream] | None = None,
    reasoning: tuple[str, int] = ("auto", -1),
) -> tuple[TokenStream, Calls | None, ReasoningSplitter | None]:
    """Check the request against the engine and make its token stream (runs in a thread: it
    renders the chat template and tokenizes; it does not touch the context); ``defaults``: the
    server's speculative decoding options; ``stream_tokens``: what makes the stream (default:
    the engine's own, see :meth:`ServerState.stream_tokens`); ``reasoning``: the server's
    reasoning format and budget (:mod:`.thinking`). Returns the stream, the tools' parser and
    the reasoning splitter (None: the answer is not split)."""
    calls, think = None, None
    if isinstance(req, ChatRequest):
        param = "messages"
        calls = tool_setup(engine, req)
        try:
            prompt: Any = engine.format_chat(
                [m.as_template_message() for m in req.messages],
                tools=None if calls is None else calls.tools,
                template_kwargs=template_kwargs(req, reasoning[1]),
            )
        except ChatTemplateError as e:
            raise APIError(400, str(e), param=e.param or param) from None
        except PowerInferError as e:
            raise from_engine(e, param) from None
        if calls is None or not calls.prefix:  # a started call is no reasoning
            think = splitter_for(engine.loaded.chat_template, prompt, reasoning[0])
        if calls is not None:
            prompt += calls.prefix
        limit = req.token_limit if req.token_limit is not None else engine.n_ctx
    else:
        param, prompt, limit = "prompt", req.prompt, req.token_limit
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: give one prompt per request", param=param)
            prompt = prompt[0]
    grammar, where = response_grammar(req)
    if calls is not None and calls.grammar is not None:
        if grammar is not None:  # a required call's arguments follow the tool's schema
            raise APIError(400, f"{where} cannot constrain an answer that tool_choice makes a "
                           "tool call", param=where)  # fmt: skip
        grammar, where = calls.grammar, "tools"
    kwargs = req.engine_kwargs(limit)
    kwargs.update(speculative_kwargs(engine, req.speculative, req.draft_max, defaults))
    try:
        make = stream_tokens or engine.stream_tokens
        if think is not None and grammar is not None:  # the grammar binds after the reasoning
            kwargs["reasoning"] = "open" if think.opened else "allowed"
        steps = make(prompt, logprobs=req.engine_logprobs, grammar=grammar, **kwargs)
        if getattr(req, "echo", False):
            steps = echo_stream(engine, prompt, steps, req.engine_logprobs, limit)
        return steps, calls, think
    except GrammarError as e:
        code = "invalid_grammar" if where == "grammar" else "invalid_schema"
        raise APIError(400, str(e), param=where, code=code) from None
    except PowerInferError as e:
        raise from_engine(e, param) from None


async def completion(request: Request, state: ServerState, kind: type) -> Response:
    check_key(request, state)
    req = await parse(request, kind)
    chat = kind is ChatRequest
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{state.worker.next_id()}"
    reasoning = (state.reasoning_format, state.reasoning_budget)
    steps, calls, think = await anyio.to_thread.run_sync(
        prepare, state.engine, req, state.speculative, state.stream_tokens(rid), reasoning
    )
    job, watcher = start_job(request, state.worker, rid, steps)
    env = Envelope(rid, state.model_id, chat)
    text_of = TokenText(state.engine.tokenizer) if req.engine_logprobs is not None else None
    if req.stream:
        chunks = ChunkMaker(env, text_of, req.include_usage, calls, req.return_progress, think)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            event_stream(job, chunks, watcher), media_type="text/event-stream", headers=headers
        )
    text, taken, done = await collect_answer(job, watcher)
    body = full_response(env, text, taken, done, text_of, calls, think)
    if isinstance(steps, EchoStream):
        body = apply_echo(body, steps, text_of, taken)
    return JSONResponse(body)


@api_route
async def metrics(request: Request, state: ServerState) -> Response:
    """``GET /metrics`` (``serve --metrics``): Prometheus' text format (:mod:`.metrics`); it
    asks for the API key as the other routes do."""
    check_key(request, state)
    from prometheus_client import CONTENT_TYPE_LATEST

    body = await anyio.to_thread.run_sync(render, state, state.counters)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@api_route
async def chat_completions(request: Request, state: ServerState) -> Response:
    return await completion(request, state, ChatRequest)


@api_route
async def completions(request: Request, state: ServerState) -> Response:
    return await completion(request, state, CompletionRequest)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (no such route, wrong method) in OpenAI's shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal server error"
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_response(
        APIError(status, f"{request.method} {request.url.path}: {detail}", type=kind)
    )


def create_app(
    engine: Engine,
    *,
    model_id: str,
    api_key: str | Sequence[str] | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    speculative: str = "auto",
    draft_max: int = DEFAULT_DRAFT_MAX,
    parallel: int = 1,
    cache_mib: int = 0,
    cors_origins: str | list[str] | None = None,
    metrics_route: bool = False,
    reasoning_format: str = "auto",
    reasoning_budget: int = -1,
) -> Starlette:
    """The application serving ``engine`` as ``model_id``: OpenAI's routes, and Anthropic's
    ``/v1/messages`` (:mod:`.anthropic`). ``api_key``: the key, or keys (a list or a comma
    list), any of which a request must give (:mod:`.auth`; None: none asked).
    ``speculative`` and ``draft_max``: the speculative decoding of requests that do not say
    (:mod:`.speculation`); checked here. ``parallel``: requests decoding together in slots
    (:mod:`..runtime.slots`; a hybrid engine serves one at a time whatever it says);
    ``cache_mib``: the slots' prefix cache (MiB, 0: off). The defaults (1, 0) serve one
    request at a time on the engine's own context, as ``serve --parallel 1 --cache-ram 0``.
    ``cors_origins``: the origins browser pages may call from (a comma list or ``*``;
    :mod:`.cors`; None: CORS off). ``metrics_route``: serve ``GET /metrics`` (:mod:`.metrics`,
    needs ``prometheus_client``). ``reasoning_format``: ``auto`` (a ``<think>`` template's
    reasoning goes to ``reasoning_content``) or ``none`` (all in ``content``);
    ``reasoning_budget``: 0 renders with ``enable_thinking`` false, -1 leaves it to the model
    (:mod:`.thinking`)."""
    # A bad default fails now, not at the first request.
    resolve_speculative(speculative, draft_max, getattr(engine, "draft", None))
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
    if isinstance(cache_mib, bool) or not isinstance(cache_mib, int) or cache_mib < 0:
        raise ValueError(f"cache_mib must be an integer >= 0, got {cache_mib!r}")
    defaults = SpeculativeDefaults(speculative, draft_max)
    keys = normalise_keys(api_key)
    state = ServerState(engine, model_id, keys, max_queue, defaults, parallel, cache_mib,
                        check_format(reasoning_format), reasoning_budget)  # fmt: skip

    @asynccontextmanager
    async def lifespan(app: Starlette):
        state.worker.start()
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(state.worker.stop)
            if state.pool is not None:
                await anyio.to_thread.run_sync(state.pool.close)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages", anthropic.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"]),
    ]
    middleware = cors_middleware(cors_origins)
    if metrics_route:
        optional_import("prometheus_client", "the /metrics route", "pip install prometheus_client")
        routes.append(Route("/metrics", metrics, methods=["GET"]))
        middleware.append(Middleware(CountRequests, counters=state.counters))
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=middleware,
    )
    app.state.server = state
    return app
