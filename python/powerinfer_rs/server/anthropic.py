"""``POST /v1/messages``: Anthropic's Messages API, as coding agents and the ``anthropic`` client
speak it, on the same engine and worker as the OpenAI routes.

Served: a system prompt (a string or text blocks), user and assistant turns of text (a string
or text blocks), ``max_tokens`` (required), ``stop_sequences`` (the one that ended the text is
reported in ``stop_sequence``), ``temperature``, ``top_p``, ``top_k``, ``stream`` (Anthropic's
events: ``message_start``, ``content_block_start``, ``ping``, ``content_block_delta``,
``content_block_stop``, ``message_delta``, ``message_stop``; ``error`` when the engine fails),
``POST /v1/messages/count_tokens``, llama-server's ``timings`` (:mod:`.timings`; in the
body, and in a stream's ``message_delta``), and errors in Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``). The key is taken from ``x-api-key`` (or
``Authorization: Bearer``). Any ``model`` name is accepted (agents send their own); answers
name the served model. ``tools`` with ``tool_choice`` (auto, any, tool, none) as in the OpenAI
route (:func:`~.responses.calls_for`: a required call's input constrained to its
``input_schema``), answered with ``tool_use`` blocks and ``stop_reason: "tool_use"``; the
assistant's ``tool_use`` and the user's ``tool_result`` blocks are taken back in the history,
checked as Anthropic checks them (:func:`check_tool_turns`: every ``tool_use`` answered in the
next message, every ``tool_result`` answering one; a ``tool_choice`` asking for a call needs
``tools``); a tool whose ``input_schema`` no call could satisfy is a 400 before generation.
Not served, refused with a 400 naming the field: images and documents, and a last turn by the
assistant (prefill).
"""

# ruff: noqa: UP007, UP045 (pydantic evaluates these annotations at run time; Python 3.9
# cannot evaluate `X | Y`)
from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Annotated, Any, Callable, Literal, Optional, Union

import anyio
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..errors import PowerInferError
from ..runtime.chat import ChatTemplateError
from ..runtime.constrain import GrammarError
from ..runtime.reasoning import Splitter
from ..runtime.streaming import TokenStream
from ..runtime.tools import ToolCall
from .anthropic_blocks import BlockStream, blocks, event
from .auth import bearer_key, key_matches
from .errors import APIError, from_engine, parse_body
from .responses import Calls, calls_for, split_with
from .schemas import MAX_STOPS, DraftMax, Lenient, SpeculativeMode
from .speculation import DEFAULTS, SpeculativeDefaults, speculative_kwargs
from .sse import collect_answer, failure, start_job
from .thinking import split_piece, splitter_for, template_kwargs, with_call
from .timings import timings
from .worker import Done, Job

log = logging.getLogger("powerinfer_rs.server")

#: The engine's finish reasons as Anthropic's stop reasons.
STOP_REASONS = {
    "eos": "end_turn",
    "stop": "stop_sequence",
    "length": "max_tokens",
    "context": "max_tokens",
}
#: HTTP status -> Anthropic's error type.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class Block(BaseModel):
    """A content block: ``text``, an assistant's ``tool_use`` or a user's ``tool_result``
    (others are refused, see :func:`block_text`)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None
    id: Optional[str] = None
    name: Optional[str] = None
    input: Optional[dict[str, Any]] = None
    tool_use_id: Optional[str] = None
    content: Union[str, list[Block], None] = None
    is_error: Optional[bool] = None


class AnthropicTool(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Optional[str] = None
    input_schema: dict[str, Any]


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None


class Message(Lenient):
    role: Literal["user", "assistant"]
    content: Union[str, list[Block]]


class MessagesRequest(Lenient):
    """``POST /v1/messages`` (unknown fields such as ``metadata`` are ignored)."""

    model: str
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Annotated[list[Message], Field(min_length=1)]
    system: Union[str, list[Block], None] = None
    stop_sequences: Optional[Annotated[list[str], Field(max_length=MAX_STOPS)]] = None
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    top_k: Optional[Annotated[int, Field(ge=0)]] = None
    stream: bool = False
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[ToolChoice] = None
    #: Extensions: speculative decoding (see :mod:`.speculation`).
    speculative: Optional[SpeculativeMode] = None
    draft_max: Optional[DraftMax] = None
    #: ``{"type": "disabled"}`` renders with ``enable_thinking`` false; else the model thinks.
    thinking: Optional[dict[str, Any]] = None

    def openai_tools(self) -> Optional[list[dict[str, Any]]]:
        """The tools in OpenAI's shape (what :mod:`..runtime.tools` takes); None without any
        or with ``tool_choice`` none."""
        if not self.tools or (self.tool_choice and self.tool_choice.type == "none"):
            return None
        return [
            {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.input_schema}}
            for t in self.tools
        ]  # fmt: skip


class CountRequest(Lenient):
    """``POST /v1/messages/count_tokens``."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: Union[str, list[Block], None] = None
    tools: Optional[list[AnthropicTool]] = None
    tool_choice: Optional[ToolChoice] = None

    openai_tools = MessagesRequest.openai_tools


def block_text(content: Union[str, list[Block], None], where: str) -> str:
    """The text of a string or of text blocks; any other block is a 400 naming it."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for i, b in enumerate(content):
        if b.type != "text" or b.text is None:
            raise APIError(
                400, f"{where}[{i}]: '{b.type}' blocks are not supported here", param=where
            )
        parts.append(b.text)
    return "".join(parts)


def turn_messages(m: Message, where: str) -> list[dict[str, Any]]:
    """One turn as the chat template's messages: an assistant's text, ``tool_use`` blocks
    (as OpenAI-style ``tool_calls``) and ``thinking`` blocks (as ``reasoning_content``), a
    user's ``tool_result`` blocks (as ``tool`` messages, first) and text."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    texts, calls, results, thoughts = [], [], [], []
    for i, b in enumerate(m.content):
        at = f"{where}[{i}]"
        if b.type == "text" and b.text is not None:
            texts.append(b)
        elif b.type == "thinking" and m.role == "assistant":
            thoughts.append(str(getattr(b, "thinking", None) or ""))
        elif b.type == "redacted_thinking" and m.role == "assistant":
            continue  # encrypted by another server: nothing a template can show
        elif b.type == "tool_use" and m.role == "assistant" and b.name:
            fn = {"name": b.name, "arguments": json.dumps(b.input or {})}
            calls.append({"id": b.id, "type": "function", "function": fn})
        elif b.type == "tool_result" and m.role == "user" and b.tool_use_id:
            text = block_text(b.content, f"{at}.content")
            if b.is_error:
                text = f"error: {text}"
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": text})
        else:
            raise APIError(400, f"{at}: '{b.type}' blocks are not supported here", param=where)
    out = list(results)
    text = block_text(texts, where)
    if m.role == "assistant":
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["tool_calls"] = calls
        if thoughts:  # for the templates that read it (runtime.reasoning_history)
            msg["reasoning_content"] = "\n".join(thoughts)
        out.append(msg)
    elif text or not results:
        out.append({"role": "user", "content": text})
    return out


def check_tool_turns(req: MessagesRequest | CountRequest) -> None:
    """Refuse tool turns that do not add up, in Anthropic's words: every ``tool_use`` block has
    an id and is answered by a ``tool_result`` block in the next message, and every
    ``tool_result`` answers a ``tool_use`` of the message right before it. A ``tool_choice``
    that asks for a call (any, tool) needs ``tools``."""
    choice = req.tool_choice
    if choice is not None and choice.type in ("any", "tool") and not req.tools:
        raise APIError(400, f"tool_choice of type {choice.type!r} may only be specified "
                       "while providing tools", param="tool_choice")  # fmt: skip
    asked: list[str] = []  # the tool_use ids of the message before
    for i, m in enumerate(req.messages):
        blocks = [] if isinstance(m.content, str) else m.content
        if asked:
            answered = {b.tool_use_id for b in blocks if b.type == "tool_result"}
            missing = [a for a in asked if a not in answered]
            if m.role != "user" or missing:
                raise APIError(
                    400,
                    f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing or asked)}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message.",
                    param="messages",
                )
        for j, b in enumerate(blocks):
            if b.type == "tool_result" and b.tool_use_id not in asked:
                raise APIError(
                    400,
                    f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {b.tool_use_id}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message.",
                    param="messages",
                )
            if b.type == "tool_use" and not b.id:
                raise APIError(400, f"messages.{i}.content.{j}.id: Field required",
                               param="messages")  # fmt: skip
        asked = [b.id for b in blocks if b.type == "tool_use" and b.id]


def template_messages(req: MessagesRequest | CountRequest) -> list[dict[str, Any]]:
    """The conversation as the chat template takes it (its tool turns checked first:
    :func:`check_tool_turns`)."""
    check_tool_turns(req)
    out = []
    system = block_text(req.system, "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        out += turn_messages(m, f"messages[{i}].content")
    if req.messages[-1].role != "user":
        raise APIError(
            400,
            "the last message must be the user's (continuing an assistant turn is not supported)",
            param="messages",
        )
    return out


def error_body(e: APIError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(e.status, "api_error" if e.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def anthropic_route(
    fn: Callable[[Request, Any], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route answering every failure in Anthropic's error shape, never with a traceback."""

    @functools.wraps(fn)
    async def route(request: Request) -> Response:
        state = request.app.state.server
        try:
            return await fn(request, state)
        except APIError as e:
            log.info("%s %s -> %d %s", request.method, request.url.path, e.status, e.message)
            return JSONResponse(error_body(e), status_code=e.status)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return JSONResponse(error_body(APIError(500, "internal server error")), 500)

    return route


def check_key(request: Request, state: Any) -> None:
    """``x-api-key`` (Anthropic's header) or ``Authorization: Bearer``."""
    if not state.api_keys:
        return
    key = request.headers.get("x-api-key")
    if key is None:
        key = bearer_key(request.headers.get("authorization", ""))
    if not key_matches(key, state.api_keys):
        what = "no API key given" if key is None else "incorrect API key"
        raise APIError(401, f"{what} (send 'x-api-key: KEY')")


def prepare(
    engine: Any,
    req: MessagesRequest,
    defaults: SpeculativeDefaults = DEFAULTS,
    stream_tokens: Callable[..., TokenStream] | None = None,
    reasoning: tuple[str, int] = ("auto", -1),
) -> tuple[TokenStream, int, Calls | None, Splitter | None]:
    """The request's token stream, its prompt's token count, its tools and its reasoning
    splitter (runs in a thread); ``defaults``: the server's speculative decoding options;
    ``stream_tokens``: what makes the stream (default: the engine's own); ``reasoning``: the
    server's reasoning format and budget (:mod:`.thinking`)."""
    tools = req.openai_tools()
    calls = None
    if tools is not None:
        choice = req.tool_choice.type if req.tool_choice else "auto"
        named = req.tool_choice.name if choice == "tool" and req.tool_choice else None
        if choice == "tool" and not named:
            raise APIError(400, "tool_choice of type tool needs a name", param="tool_choice")
        calls = calls_for(engine, tools, choice == "any", named, "tool_choice.name")
    try:
        kw = template_kwargs(None, reasoning[1])
        if (req.thinking or {}).get("type") == "disabled":
            kw["enable_thinking"] = False
        prompt = engine.format_chat(template_messages(req), tools=tools, template_kwargs=kw)
    except ChatTemplateError as e:
        raise APIError(400, str(e), param="messages") from None
    except PowerInferError as e:
        raise from_engine(e, "messages") from None
    think = None
    if calls is None or not calls.prefix:
        think = splitter_for(engine.loaded.chat_template, prompt, reasoning[0])
    if calls is not None:
        prompt = with_call(prompt, calls.prefix)
    spec = speculative_kwargs(engine, req.speculative, req.draft_max, defaults)
    try:
        make = stream_tokens or engine.stream_tokens
        steps = make(
            prompt,
            max_new_tokens=req.max_tokens,
            temperature=req.temperature,
            top_k=req.top_k or 0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            stop=req.stop_sequences,
            grammar=None if calls is None else calls.grammar,
            **spec,
        )
    except GrammarError as e:
        raise APIError(400, str(e), param="tools") from None
    except PowerInferError as e:
        raise from_engine(e, "messages") from None
    return steps, len(engine.tokenizer.encode(prompt)), calls, think


def tool_use(call: ToolCall) -> dict[str, Any]:
    """A call as Anthropic's ``tool_use`` block."""
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"),
            "name": call.name, "input": call.arguments}  # fmt: skip


def message(
    rid: str,
    model: str,
    text: str | None,
    done: Done | None,
    inputs: int,
    calls: list[ToolCall] = (),  # type: ignore[assignment]
    reasoning: str = "",
) -> dict:
    """A ``message`` object: whole (``done`` given, with llama-server's ``timings``:
    :mod:`.timings`) or as ``message_start`` opens it; the ``reasoning`` is a ``thinking``
    block before the text."""
    content = blocks(reasoning, text)
    content += [tool_use(c) for c in calls]
    reason = None if done is None else STOP_REASONS.get(done.finish_reason, "end_turn")
    if calls:
        reason = "tool_use"
    extra = {} if done is None else {"timings": timings(done)}
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None if done is None else done.stop_sequence,
        "usage": {
            "input_tokens": inputs,
            "output_tokens": 0 if done is None else done.completion_tokens,
        },
        **extra,
    }


async def events(
    job: Job,
    rid: str,
    model: str,
    inputs: int,
    watcher: asyncio.Task,
    calls: Calls | None,
    think: Splitter | None = None,
) -> AsyncIterator[bytes]:
    """The streamed answer in Anthropic's events: a ``thinking`` block (the reasoning) and a
    text block, each opened at its first text, then one ``tool_use`` block per call (its
    input in one ``input_json_delta``)."""
    out = BlockStream()

    def deltas(text: str, end: bool = False) -> list[bytes]:
        reasoning, text = split_piece(think, calls, text, end)
        return out.delta("thinking", reasoning) + out.delta("text", text)

    try:
        yield event("message_start", {"message": message(rid, model, None, None, inputs)})
        yield event("ping", {})
        while True:
            item = await job.events.get()
            if isinstance(item, Done):
                break
            for b in deltas(item.text):
                yield b
        if item.error is not None:
            yield event("error", {"error": error_body(failure(item))["error"]})
            return
        for b in deltas("", end=True):
            yield b
        made: list[ToolCall] = []
        if calls is not None:
            rest, made = calls.finish()
            for b in out.delta("text", rest):
                yield b
        for b in out.close():
            yield b
        for b in tool_blocks(made, out.index):
            yield b
        whole = message(rid, model, None, item, inputs, made)
        delta = {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
        body = {"delta": delta, "usage": whole["usage"], "timings": whole["timings"]}
        yield event("message_delta", body)
        yield event("message_stop", {})
    finally:
        watcher.cancel()
        job.cancel()


def tool_blocks(made: list[ToolCall], index: int) -> list[bytes]:
    """The streamed ``tool_use`` blocks, numbered after block ``index``."""
    out = []
    for call in made:
        index += 1
        block = {**tool_use(call), "input": {}}
        out.append(event("content_block_start", {"index": index, "content_block": block}))
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call.arguments)}
        out.append(event("content_block_delta", {"index": index, "delta": delta}))
        out.append(event("content_block_stop", {"index": index}))
    return out


@anthropic_route
async def messages(request: Request, state: Any) -> Response:
    check_key(request, state)
    req = parse_body(await request.body(), MessagesRequest)
    rid = f"msg_{state.worker.next_id()}"
    reasoning = (state.reasoning_format, state.reasoning_budget)
    steps, inputs, calls, think = await anyio.to_thread.run_sync(
        prepare, state.engine, req, state.speculative, state.stream_tokens(rid), reasoning
    )
    job, watcher = start_job(request, state.worker, rid, steps)
    if req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(
            events(job, rid, state.model_id, inputs, watcher, calls, think),
            media_type="text/event-stream",
            headers=headers,
        )
    text, _, done = await collect_answer(job, watcher)
    reasoning = ""
    if think is not None:
        reasoning, text = split_with(think, text)
    made: list[ToolCall] = []
    if calls is not None:
        text, made = calls.parse(text)
    body = message(rid, state.model_id, text, done, done.prompt_tokens, made, reasoning)
    return JSONResponse(body)


@anthropic_route
async def count_tokens(request: Request, state: Any) -> Response:
    check_key(request, state)
    req = parse_body(await request.body(), CountRequest)
    engine = state.engine

    def count() -> int:
        try:
            prompt = engine.format_chat(template_messages(req), tools=req.openai_tools())
            return len(engine.tokenizer.encode(prompt))
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        except PowerInferError as e:
            raise from_engine(e, "messages") from None

    return JSONResponse({"input_tokens": await anyio.to_thread.run_sync(count)})
