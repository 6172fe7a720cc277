"""What ``POST /v1/responses`` answers: the output items (``reasoning`` with ``reasoning_text``
content, ``message`` with ``output_text``, ``function_call``), the ``response`` object around
them, its usage, and the bounded store that ``previous_response_id`` and
``GET /v1/responses/{id}`` read."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..runtime.tools import ToolCall
from .errors import APIError
from .worker import Done

#: Responses kept for ``previous_response_id`` (the oldest forgotten first).
STORE_LIMIT = 512


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content,
            "status": status}  # fmt: skip


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message``; ``text`` None: as ``output_item.added`` opens it (no parts)."""
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def call_item(call: ToolCall, arguments: str | None = None) -> dict[str, Any]:
    """A ``function_call`` item; ``arguments`` "": as ``output_item.added`` opens it."""
    args = json.dumps(call.arguments) if arguments is None else arguments
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"),
            "call_id": call.id, "name": call.name, "arguments": args,
            "status": "completed" if arguments is None else "in_progress"}  # fmt: skip


def output_items(
    rid: str, reasoning: str, text: str, calls: list[ToolCall], done: Done
) -> list[dict[str, Any]]:
    """The whole answer's items: the reasoning (when there is any), the message (when it has
    text, or when there are no calls), the calls."""
    out = []
    if reasoning:
        out.append(reasoning_item(f"rs_{rid}", reasoning))
    if text or not calls:
        out.append(message_item(f"msg_{rid}", text, item_status(done)))
    return out + [call_item(c) for c in calls]


def item_status(done: Done) -> str:
    """``completed``, or ``incomplete`` for an answer cut off by the token limit."""
    return "incomplete" if done.finish_reason in ("length", "context") else "completed"


def usage(done: Done, reasoning_tokens: int) -> dict[str, Any]:
    """The Responses API's usage: prompt tokens (those served from the prefix cache as
    ``cached_tokens``; nothing is counted as written to it), generated tokens (the
    reasoning's, as its text re-tokenized, within them)."""
    cached = done.stats.cached_tokens if done.stats is not None else 0
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens,
                                                          done.completion_tokens)},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }  # fmt: skip


@dataclass
class Envelope:
    """The fields of one response's ``response`` object that do not depend on its answer: the
    request's settings echoed back as OpenAI echoes them."""

    id: str
    model: str
    settings: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        done: Done | None = None,
        reasoning_tokens: int = 0,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The ``response`` object with ``status`` (in_progress, completed, incomplete,
        failed) and ``output``; ``done`` gives its usage."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": None if done is None else usage(done, reasoning_tokens),
            **self.settings,
        }


def response_status(done: Done, calls: list[ToolCall]) -> str:
    """``completed``, or ``incomplete`` when the token limit cut the answer (and no call
    came out of it)."""
    return "completed" if calls else item_status(done)


def history_turn(text: str, calls: list[ToolCall], reasoning: str = "") -> dict[str, Any]:
    """The answer as the assistant message a later turn's history holds; its ``reasoning``
    as ``reasoning_content``, for the templates that read it
    (:mod:`~..runtime.reasoning_history`)."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [c.openai() for c in calls]
    if reasoning:
        msg["reasoning_content"] = reasoning
    return msg


class ResponseStore:
    """The last :data:`STORE_LIMIT` stored responses, in memory for the server's life: each
    one's conversation (the chat messages it was answered from, then its answer, for
    ``previous_response_id``) and its ``response`` object (``GET /v1/responses/{id}``)."""

    def __init__(self, limit: int = STORE_LIMIT):
        self.limit = limit
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, history: list[dict[str, Any]], body: dict[str, Any]) -> None:
        with self._lock:
            self._items[rid] = (history, body)
            self._items.move_to_end(rid)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def _get(self, rid: str, param: str | None, status: int):
        with self._lock:
            hit = self._items.get(rid)
        if hit is None:
            what = "Previous response" if param else "Response"
            raise APIError(status, f"{what} with id '{rid}' not found.", param=param,
                           code="previous_response_not_found" if param else None)  # fmt: skip
        return hit

    def history(self, rid: str) -> list[dict[str, Any]]:
        """The conversation ``previous_response_id`` continues; an unknown (or forgotten) id
        is a 400 naming the field, as OpenAI answers."""
        return list(self._get(rid, "previous_response_id", 400)[0])

    def body(self, rid: str) -> dict[str, Any]:
        """A stored ``response`` object; an unknown id is a 404."""
        return self._get(rid, None, 404)[1]

    def __len__(self) -> int:
        return len(self._items)
