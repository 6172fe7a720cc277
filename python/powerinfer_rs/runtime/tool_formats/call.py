"""A parsed tool call and the small helpers every family's parser shares: the given tools'
names and schemas, typing an XML-written argument by its schema, JSON read leniently."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

_ids = itertools.count(1)


@dataclass
class ToolCall:
    """One call: the function's name, its arguments and an id for the tool's answer."""

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"call_{next(_ids):08d}"

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """As an OpenAI ``tool_calls`` entry (``index`` for a streamed delta)."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }
        if index is not None:
            out = {"index": index, **out}
        return out


def function_specs(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function`` part of each OpenAI tool."""
    return [t.get("function", t) for t in tools]


def schemas_of(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each given tool's parameter schema by name (``{}`` where it has none)."""
    out = {}
    for f in function_specs(tools):
        params = f.get("parameters")
        out[f.get("name")] = params if isinstance(params, dict) else {}
    return out


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object (whitespace around it allowed), else None."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _is_string(schema: Any) -> bool:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        return kind == ["string"] or (set(kind) <= {"string", "null"} and "string" in kind)
    return kind == "string"


def typed_value(raw: str, schema: Any) -> Any:
    """An argument the model wrote as text (Qwen3-Coder's ``<parameter>``, GLM's
    ``<arg_value>``) as its schema types it: a string stays as written; anything else is read
    as JSON (``True``/``False`` as Jinja prints Python's booleans too), the text kept where
    it is not JSON."""
    if _is_string(schema):
        return raw
    text = raw.strip()
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return raw


def partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that is a proper start of one of
    ``markers`` (text to hold back while streaming: it may begin one). Only the last
    ``len(marker) - 1`` characters are looked at, from each place the marker's first
    character occurs there (usually none), so a call costs a ``find`` per marker."""
    keep = 0
    for marker in markers:
        if len(marker) - 1 <= keep:
            continue
        at = text.find(marker[0], max(0, len(text) - len(marker) + 1))
        while at >= 0:
            if marker.startswith(text[at:]):
                keep = max(keep, len(text) - at)
                break
            at = text.find(marker[0], at + 1)
    return keep
