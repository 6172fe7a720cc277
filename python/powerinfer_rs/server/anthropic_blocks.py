"""The text-like content blocks of an Anthropic ``/v1/messages`` answer: ``thinking`` (the
reasoning of a ``<think>`` model, :mod:`..runtime.reasoning`) before ``text``, whole or as
stream events (``content_block_start``, ``thinking_delta`` / ``text_delta``,
``content_block_stop``), as Anthropic's API sends them."""

from __future__ import annotations

import json
from typing import Any


def event(kind: str, body: dict[str, Any]) -> bytes:
    """One server-sent event of Anthropic's stream."""
    data = json.dumps({"type": kind, **body}, ensure_ascii=False)
    return f"event: {kind}\ndata: {data}\n\n".encode()


def blocks(reasoning: str, text: str | None) -> list[dict[str, Any]]:
    """The whole answer's blocks: a ``thinking`` block (when there is reasoning), a ``text``
    block (when there is text). Our thinking is not signed: ``signature`` is empty."""
    out: list[dict[str, Any]] = []
    if reasoning:
        out.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text:
        out.append({"type": "text", "text": text})
    return out


class BlockStream:
    """Opens, fills and closes the streamed blocks in order; :attr:`index` is the last block
    opened (-1: none yet), so the ``tool_use`` blocks after them number on from it."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None  # the open block's type

    def delta(self, kind: str, text: str) -> list[bytes]:
        """Events adding ``text`` to a block of ``kind`` (``thinking`` or ``text``): the open
        one, or a new one after closing it."""
        if not text:
            return []
        out = []
        if self.kind != kind:
            out += self.close()
            self.index += 1
            self.kind = kind
            start = {"type": kind, kind: ""}
            if kind == "thinking":
                start["signature"] = ""
            out.append(event("content_block_start", {"index": self.index, "content_block": start}))
        delta = {"type": f"{kind}_delta", kind: text}
        out.append(event("content_block_delta", {"index": self.index, "delta": delta}))
        return out

    def close(self) -> list[bytes]:
        """The open block's stop event (none when no block is open)."""
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"index": self.index})]
