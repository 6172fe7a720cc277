"""``POST /v1/responses`` (OpenAI's Responses API, as Codex and the ``openai`` client's
``responses.create`` / ``responses.stream`` speak it) and ``GET /v1/responses/{id}``.

The request is translated into the chat request the chat route runs (:mod:`.responses_schema`)
and runs on its path: :func:`~.prepare.prepare` (the template, tools, reasoning splitter and
output constraint), the same worker and the same answer splitting (:func:`~.responses.split_with`,
:class:`~.responses.Calls`). Stateless but for ``previous_response_id``: every stored response
(``store``, default true) keeps its conversation in memory for the server's life, the last
:data:`~.responses_output.STORE_LIMIT` of them (an unknown or forgotten id is a 400 naming
``previous_response_id``, as OpenAI answers); its ``instructions`` are not carried over, as
OpenAI does not carry them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any, Callable

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..runtime.reasoning import Splitter
from ..runtime.tools import ToolCall
from .errors import APIError, from_validation, parse_body
from .fields import unknown_field_error
from .prepare import prepare
from .responses import Calls, split_with
from .responses_output import (
    Envelope,
    history_turn,
    output_items,
    response_status,
)
from .responses_schema import (
    ResponsesRequest,
    chat_tool_choice,
    chat_tools,
    check_unsupported,
    input_messages,
    response_format,
)
from .responses_stream import EventStream
from .routing import api_route, check_key, unknown_model
from .schemas import ChatRequest
from .sse import collect_answer, failure, start_job
from .thinking import split_piece
from .worker import Done, Job

#: The chat request's parameter names as the Responses API names them (errors name these).
PARAMS = (
    ("messages", "input"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("tool_choice.function.", "tool_choice."),
)


def renamed(e: APIError) -> APIError:
    """``e`` naming the Responses API's field where it names the chat request's."""
    p = e.param
    if p is None:
        return e
    for chat, ours in PARAMS:
        if p.startswith(chat):
            p = ours + p[len(chat) :]
            break
    if p.startswith("tools[") and ".function." in p:
        p = p.replace(".function.", ".", 1)
    e.param = p
    return e


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatRequest:
    """The chat request answering ``req`` over ``messages`` (the conversation so far, its
    instructions first)."""
    body: dict[str, Any] = {
        "messages": messages,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "max_tokens": req.max_output_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "response_format": response_format(req.text),
        "speculative": req.speculative,
        "draft_max": req.draft_max,
    }
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:
        body["reasoning_effort"] = effort
        if effort == "none":
            body["chat_template_kwargs"] = {"enable_thinking": False}
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as e:
        raise renamed(from_validation(e)) from None


def settings(req: ResponsesRequest) -> dict[str, Any]:
    """The request's settings as the ``response`` object echoes them."""
    fmt = (req.text.format if req.text is not None else None) or {"type": "text"}
    reasoning = req.reasoning.model_dump() if req.reasoning is not None else {}
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": req.store,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice or "auto",
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "truncation": "disabled",
        "metadata": req.metadata or {},
    }


def conversation(req: ResponsesRequest, state: Any) -> list[dict[str, Any]]:
    """The messages ``req`` continues (the stored ones of ``previous_response_id``) and its
    ``input``, without the instructions."""
    history = []
    if req.previous_response_id is not None:
        history = state.responses.history(req.previous_response_id)
    given = input_messages(req.input)
    if not given:
        raise APIError(400, "'input' is required (a string or a list of items)", param="input")
    return history + given


def parse(body: bytes, state: Any) -> ResponsesRequest:
    req = parse_body(body, ResponsesRequest)
    if req.model is not None and req.model != state.model_id:
        raise unknown_model(req.model, state)
    unknown = unknown_field_error(req.model_extra or {})
    if unknown is not None:
        raise unknown
    check_unsupported(req)
    return req


@api_route
async def create(request: Request, state: Any) -> Response:
    """``POST /v1/responses``."""
    check_key(request, state)
    req = parse(await request.body(), state)
    messages = conversation(req, state)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    chat = chat_request(req, system + messages)
    rid = f"resp_{uuid.uuid4().hex}"
    reasoning = (state.reasoning_format, state.reasoning_budget)
    try:
        steps, calls, think = await anyio.to_thread.run_sync(
            prepare, state.engine, chat, state.speculative, state.stream_tokens(rid), reasoning
        )
    except APIError as e:
        raise renamed(e) from None
    job, watcher = start_job(request, state.worker, rid, steps)
    env = Envelope(rid, state.model_id, settings(req))
    count = state.engine.tokenizer.encode

    def keep(text: str, made: list[ToolCall], body: dict[str, Any], thought: str) -> None:
        if req.store:
            state.responses.put(rid, messages + [history_turn(text, made, thought)], body)

    def reasoning_tokens(text: str) -> int:
        return len(count(text, add_bos=False)) if text else 0

    if req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        events = stream_events(job, watcher, EventStream(env), think, calls, reasoning_tokens, keep)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    text, _, done = await collect_answer(job, watcher)
    thought = ""
    if think is not None:
        thought, text = split_with(think, text)
    made: list[ToolCall] = []
    if calls is not None:
        text, made = calls.parse(text)
    items = output_items(rid.removeprefix("resp_"), thought, text, made, done)
    body = env.body(response_status(done, made), items, done, reasoning_tokens(thought))
    keep(text, made, body, thought)
    return JSONResponse(body)


async def stream_events(
    job: Job,
    watcher: asyncio.Task,
    out: EventStream,
    think: Splitter | None,
    calls: Calls | None,
    reasoning_tokens: Callable[[str], int],
    keep: Callable[[str, list[ToolCall], dict[str, Any], str], None],
) -> AsyncIterator[bytes]:
    """The streamed answer (:class:`~.responses_stream.EventStream`): the reasoning and the
    text as they come (what may start a tool call held back), the calls at the end."""
    thought, shown = [], []

    def deltas(text: str, end: bool = False) -> list[bytes]:
        reasoning, text = split_piece(think, calls, text, end)
        thought.append(reasoning)
        shown.append(text)
        return out.delta("reasoning", reasoning) + out.delta("message", text)

    try:
        for b in out.start():
            yield b
        while True:
            item = await job.events.get()
            if isinstance(item, Done):
                break
            for b in deltas(item.text):
                yield b
        if item.error is not None:
            yield out.failed(failure(item).message)
            return
        for b in deltas("", end=True):
            yield b
        made: list[ToolCall] = []
        if calls is not None:
            rest, made = calls.finish()
            shown.append(rest)
            for b in out.delta("message", rest):
                yield b
        events = out.finish(item, made, reasoning_tokens("".join(thought)))
        for b in events:
            yield b
        if out.final is not None:
            keep("".join(shown), made, out.final, "".join(thought))
    finally:
        watcher.cancel()
        job.cancel()


@api_route
async def retrieve(request: Request, state: Any) -> Response:
    """``GET /v1/responses/{id}``: a stored response."""
    check_key(request, state)
    return JSONResponse(state.responses.body(request.path_params["response_id"]))
