"""The body of ``POST /v1/responses`` (OpenAI's Responses API) as a pydantic model, and its
translation into the chat request the chat route runs (:class:`~.schemas.ChatRequest`): the
``input`` items as chat messages, the flat function tools as chat tools, ``text.format`` as
``response_format``, ``reasoning.effort`` as the template's ``reasoning_effort``.

Input items understood: messages (``role`` user, system, developer (as system) or assistant;
``content`` a string or ``input_text`` / ``output_text`` parts), ``function_call`` (an earlier
call, joined to the assistant turn before it) and ``function_call_output`` (its result, a
``tool`` message); a ``reasoning`` item's text (its ``reasoning_text`` content, else its
summary) is the ``reasoning_content`` of the assistant turn after it, for the templates that
read it (:mod:`~..runtime.reasoning_history`; dropped where no assistant turn follows).
Anything else (images, files, other tools' calls) is a 400 naming it."""

# ruff: noqa: UP007, UP045 (pydantic evaluates these annotations at run time; Python 3.9
# cannot evaluate `X | Y`)
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from .errors import APIError
from .schemas import DraftMax, Lenient, NonNegInt, SpeculativeMode

#: Input message roles, as the chat template names them.
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
#: Content part types whose ``text`` is a message's text.
TEXT_PARTS = ("input_text", "output_text", "text")
#: ``include`` values accepted: our reasoning is returned as plain text, never encrypted, so
#: asking for its encrypted form (Codex does, with ``store: false``) asks for nothing.
INCLUDABLE = ("reasoning.encrypted_content",)


class Part(BaseModel):
    """One part of an input message's content."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: Optional[str] = None


class InputItem(BaseModel):
    """One item of ``input``: a message (``type`` "message" or left out), a ``function_call``,
    a ``function_call_output`` or a ``reasoning`` item."""

    model_config = ConfigDict(extra="allow")
    type: Optional[str] = None
    role: Optional[str] = None
    content: Union[str, list[Part], None] = None
    call_id: Optional[str] = None
    name: Optional[str] = None
    arguments: Optional[str] = None
    output: Union[str, list[Part], None] = None


class ResponsesTool(BaseModel):
    """A tool in the Responses API's flat shape (only ``function`` tools are served)."""

    model_config = ConfigDict(extra="allow")
    type: str
    name: Optional[str] = None
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class TextConfig(Lenient):
    """``text``: its ``format`` (text, json_object or json_schema); ``verbosity`` is a hint to
    OpenAI's models that this server takes and ignores (the model's length is its own)."""

    format: Optional[dict[str, Any]] = None
    verbosity: Optional[str] = None


class ReasoningConfig(Lenient):
    """``reasoning``: ``effort`` goes to the chat template as ``reasoning_effort`` (gpt-oss
    reads it), and ``none`` renders with ``enable_thinking`` false; ``summary`` is taken
    (the reasoning is returned whole, as ``reasoning_text`` content, not summarised)."""

    effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]] = None
    summary: Optional[Literal["auto", "concise", "detailed"]] = None


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``. Undeclared fields land in ``model_extra`` and are refused by name
    unless they are documented no-ops (:mod:`.fields`). ``seed``, ``top_k``, ``min_p``,
    ``speculative`` and ``draft_max`` are extensions, as on the chat route."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    input: Union[str, list[InputItem], None] = None
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    tools: Optional[list[ResponsesTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[Annotated[int, Field(ge=1)]] = None
    temperature: Optional[Annotated[float, Field(ge=0.0, le=2.0)]] = None
    top_p: Optional[Annotated[float, Field(gt=0.0, le=1.0)]] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    stream: bool = False
    stream_options: Optional[dict[str, Any]] = None  # include_obfuscation: nothing to hide
    store: bool = True
    metadata: Optional[dict[str, str]] = None
    include: Optional[list[str]] = None
    truncation: Optional[Literal["disabled"]] = None
    background: Optional[Literal[False]] = None
    seed: Optional[NonNegInt] = None
    top_k: NonNegInt = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    speculative: Optional[SpeculativeMode] = None
    draft_max: Optional[DraftMax] = None


def _text(content: Union[str, list[Part], None], where: str) -> str:
    """The text of a string or of text parts; any other part is a 400 naming it."""
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for i, p in enumerate(content):
        if p.type not in TEXT_PARTS or p.text is None:
            raise APIError(400, f"{where}[{i}]: '{p.type}' content is not supported by this "
                           "server (text only)", param=f"{where}[{i}].type")  # fmt: skip
        out.append(p.text)
    return "".join(out)


def reasoning_text(item: InputItem) -> str:
    """A ``reasoning`` item's text: its ``reasoning_text`` content parts, else its summary's
    ``summary_text`` parts (an ``encrypted_content`` is another server's: not read)."""
    parts = [p.text for p in item.content or [] if not isinstance(p, str) and p.text]
    if not parts:
        summary = (item.model_extra or {}).get("summary") or []
        parts = [p.get("text") or "" for p in summary if isinstance(p, dict)]
    return "\n".join(p for p in parts if p)


def input_messages(given: Union[str, list[InputItem], None]) -> list[dict[str, Any]]:
    """``input`` as chat messages (the dicts :class:`~.schemas.ChatMessage` takes): a string is
    one user message; ``function_call`` items join the assistant message before them (or
    start one), ``function_call_output`` items are ``tool`` messages."""
    if given is None:
        return []
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    out: list[dict[str, Any]] = []
    thought: list[str] = []  # reasoning items waiting for their assistant turn
    for i, item in enumerate(given):
        at = f"input[{i}]"
        kind = item.type or ("message" if item.role is not None else None)
        carried = ""  # the reasoning of the assistant turn this item starts
        if kind != "reasoning":
            carried, thought = "\n".join(t for t in thought if t), []
        if kind == "message":
            role = ROLES.get(item.role or "")
            if role is None:
                raise APIError(400, f"{at}.role: {item.role!r} is not one of {sorted(ROLES)}",
                               param=f"{at}.role")  # fmt: skip
            out.append({"role": role, "content": _text(item.content, f"{at}.content")})
            if role == "assistant" and carried:
                out[-1]["reasoning_content"] = carried
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise APIError(400, f"{at}: a function_call needs 'call_id' and 'name'",
                               param=at)  # fmt: skip
            fn = {"name": item.name, "arguments": item.arguments or "{}"}
            call = {"id": item.call_id, "type": "function", "function": fn}
            if not out or out[-1]["role"] != "assistant" or carried:
                out.append({"role": "assistant", "content": ""})
                if carried:
                    out[-1]["reasoning_content"] = carried
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not item.call_id:
                raise APIError(400, f"{at}: a function_call_output needs 'call_id'",
                               param=f"{at}.call_id")  # fmt: skip
            text = _text(item.output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
        elif kind == "reasoning":
            thought.append(reasoning_text(item))
        else:
            raise APIError(400, f"{at}: '{kind}' input items are not supported by this server",
                           param=f"{at}.type")  # fmt: skip
    return out


def chat_tools(tools: Optional[list[ResponsesTool]]) -> Optional[list[dict[str, Any]]]:
    """The flat function tools in the chat route's shape; any other tool type is a 400."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.type != "function":
            raise APIError(400, f"tools[{i}]: '{t.type}' tools are not supported by this server "
                           "(function tools only)", param=f"tools[{i}].type")  # fmt: skip
        fn = {"name": t.name, "description": t.description, "parameters": t.parameters,
              "strict": t.strict}  # fmt: skip
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


def chat_tool_choice(choice: Union[str, dict[str, Any], None]) -> Any:
    """``tool_choice`` in the chat route's shape: a mode, or ``{"type": "function", "name"}``
    as a named function; other kinds (hosted tools, allowed_tools) are a 400."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(400, f"tool_choice {choice!r} is not supported by this server (give none, "
                   "auto, required or {'type': 'function', 'name': ...})",
                   param="tool_choice")  # fmt: skip


def response_format(text: Optional[TextConfig]) -> Optional[dict[str, Any]]:
    """``text.format`` as the chat route's ``response_format``."""
    fmt = None if text is None else text.format
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format.schema is required for type json_schema",
                           param="text.format.schema")  # fmt: skip
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise APIError(400, f"text.format.type {fmt.get('type')!r} is not one of text, json_object, "
                   "json_schema", param="text.format.type")  # fmt: skip


def check_unsupported(req: ResponsesRequest) -> None:
    """Refuse what parses but asks for something not served: ``include`` values other than
    :data:`INCLUDABLE`."""
    for i, name in enumerate(req.include or []):
        if name not in INCLUDABLE:
            raise APIError(400, f"include[{i}]: {name!r} is not supported by this server "
                           f"(accepted: {list(INCLUDABLE)})", param="include")  # fmt: skip
