"""The streamed answer of ``POST /v1/responses`` in OpenAI's events, each with its
``sequence_number``: ``response.created`` and ``response.in_progress``; per output item
``response.output_item.added``, its content part (``response.content_part.added``), the
deltas (``response.reasoning_text.delta`` for the reasoning, ``response.output_text.delta``
for the message, ``response.function_call_arguments.delta`` for a call), their ``.done``
events, ``response.content_part.done`` and ``response.output_item.done``; then
``response.completed`` (``response.incomplete`` when the token limit cut the answer,
``response.failed`` when the engine failed), as OpenAI ends its streams."""

from __future__ import annotations

import json
from typing import Any

from ..runtime.tools import ToolCall
from .responses_output import (
    Envelope,
    call_item,
    item_status,
    message_item,
    reasoning_item,
    text_part,
)
from .worker import Done


class EventStream:
    """Numbers the events and opens, fills and closes the text-like items (reasoning, then
    the message) in order; :attr:`items` holds every finished item, in output order."""

    def __init__(self, env: Envelope):
        self.env = env
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.kind: str | None = None  # the open item's: "reasoning" or "message"
        self.text = ""
        #: The last event's ``response`` object, once :meth:`finish` made it.
        self.final: dict[str, Any] | None = None

    def event(self, kind: str, **body: Any) -> bytes:
        data = json.dumps({"type": kind, "sequence_number": self.seq, **body}, ensure_ascii=False)
        self.seq += 1
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def start(self) -> list[bytes]:
        snapshot = self.env.body("in_progress", [])
        return [self.event("response.created", response=snapshot),
                self.event("response.in_progress", response=snapshot)]  # fmt: skip

    def _ids(self) -> tuple[int, str]:
        prefix = "rs" if self.kind == "reasoning" else "msg"
        return len(self.items), f"{prefix}_{self.env.id.removeprefix('resp_')}"

    def delta(self, kind: str, text: str) -> list[bytes]:
        """Events adding ``text`` to an item of ``kind``: the open one, or a new one after
        closing it."""
        if not text:
            return []
        out = []
        if self.kind != kind:
            out += self.close()
            out += self._open(kind)
        index, item_id = self._ids()
        self.text += text
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if kind == "reasoning":
            out.append(self.event("response.reasoning_text.delta", delta=text, **where))
        else:
            out.append(self.event("response.output_text.delta", delta=text, logprobs=[], **where))
        return out

    def _open(self, kind: str) -> list[bytes]:
        self.kind, self.text = kind, ""
        index, item_id = self._ids()
        if kind == "reasoning":
            item = reasoning_item(item_id, "", "in_progress")
            part = {"type": "reasoning_text", "text": ""}
        else:
            item, part = message_item(item_id, None, "in_progress"), text_part("")
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [self.event("response.output_item.added", output_index=index, item=item),
                self.event("response.content_part.added", part=part, **where)]  # fmt: skip

    def close(self, status: str = "completed") -> list[bytes]:
        """The open item's closing events (none when no item is open)."""
        if self.kind is None:
            return []
        index, item_id = self._ids()
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        text = self.text
        if self.kind == "reasoning":
            item = reasoning_item(item_id, text)
            part = item["content"][0]
            out = [self.event("response.reasoning_text.done", text=text, **where)]
        else:
            item, part = message_item(item_id, text, status), text_part(text)
            out = [self.event("response.output_text.done", text=text, logprobs=[], **where)]
        out.append(self.event("response.content_part.done", part=part, **where))
        out.append(self.event("response.output_item.done", output_index=index, item=item))
        self.items.append(item)
        self.kind = None
        return out

    def calls(self, made: list[ToolCall]) -> list[bytes]:
        """Each call as a ``function_call`` item, its arguments in one delta."""
        out = []
        for call in made:
            index, item = len(self.items), call_item(call)
            where = {"item_id": item["id"], "output_index": index}
            out.append(self.event("response.output_item.added", output_index=index,
                                  item=call_item(call, arguments="")))  # fmt: skip
            out.append(self.event("response.function_call_arguments.delta",
                                  delta=item["arguments"], **where))  # fmt: skip
            done = {"arguments": item["arguments"], "name": call.name, **where}
            out.append(self.event("response.function_call_arguments.done", **done))
            out.append(self.event("response.output_item.done", output_index=index, item=item))
            self.items.append(item)
        return out

    def finish(self, done: Done, made: list[ToolCall], reasoning_tokens: int) -> list[bytes]:
        """The closing events: the open item closed, an empty message when the answer had no
        text and no call, the calls, and the response's last event."""
        status = "completed" if made else item_status(done)
        out = self.close(status)
        if not made and not any(i["type"] == "message" for i in self.items):
            out += self._open("message") + self.close(status)
        out += self.calls(made)
        body = self.final = self.env.body(status, self.items, done, reasoning_tokens)
        out.append(self.event(f"response.{status}", response=body))
        return out

    def failed(self, message: str) -> bytes:
        """``response.failed``: the engine failed on the way."""
        error = {"code": "server_error", "message": message}
        return self.event("response.failed", response=self.env.body("failed", self.items,
                                                                    error=error))  # fmt: skip
