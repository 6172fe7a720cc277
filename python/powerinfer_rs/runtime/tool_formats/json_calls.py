"""The JSON families, read whatever the template (the generic family, and the fallback every
other family falls back to):

- Hermes / Qwen 2.5-3: ``<tool_call>{json}</tool_call>``, one per call (a last one may be cut
  off by the end of the text);
- Mistral: ``[TOOL_CALLS]`` then a JSON list of calls;
- Llama 3.x: ``<|python_tag|>`` then JSON calls separated by ``;``, or the whole answer one
  JSON object ``{"name": ..., "parameters": {...}}``.

A call must name one of the given tools and carry a JSON object of arguments."""

from __future__ import annotations

import json
import re
from typing import Any

from ..constrain import Grammar, tool_call_grammar
from .base import ToolFormat
from .call import ToolCall, function_specs

#: What starts a call in each convention.
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _call(obj: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], args) if isinstance(args, dict) else None


def json_values(text: str) -> list[Any]:
    """The JSON values at the start of ``text`` one after another (separated by whitespace,
    ``;`` or ``,``); stops at the first thing that is not one."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        try:
            value, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(value)


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` in one of the JSON conventions, or None."""
    names = {f.get("name") for f in function_specs(tools)}
    hermes = list(_HERMES.finditer(text))
    if hermes:
        calls = [_call(v, names) for m in hermes for v in json_values(m.group(1))[:1]]
        if calls and all(calls):
            return text[: hermes[0].start()].strip(), calls  # type: ignore[return-value]
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):
        at = text.find(marker)
        if at >= 0:
            values = json_values(text[at + len(marker) :])
            if len(values) == 1 and isinstance(values[0], list):
                values = values[0]
            calls = [_call(v, names) for v in values]
            if calls and all(calls):
                return text[:at].strip(), calls  # type: ignore[return-value]
    stripped = text.strip()
    if stripped.startswith("{"):
        calls = [_call(v, names) for v in json_values(stripped)]
        if calls and all(calls):
            return "", calls  # type: ignore[return-value]
    return None


def force_hermes(tools: list[dict[str, Any]], named: str | None) -> tuple[str, Grammar]:
    """A Hermes call started in the prompt: ``<tool_call>{"name": "`` (any tool) or the
    named tool's opening up to its arguments; the rest as :func:`~..constrain.tool_call_grammar`."""
    if named is not None:
        prefix = '<tool_call>{"name": ' + json.dumps(named) + ', "arguments": '
    else:
        prefix = '<tool_call>{"name": "'
    return prefix, tool_call_grammar(tools, named)


#: The generic family (no other family's template): JSON calls, Hermes calls forced.
GENERIC = ToolFormat("json", MARKERS, parse, force_hermes, holds_json=True)
#: A template that renders tools its own JSON way without ``<tool_call>`` (Llama 3.1,
#: Mistral): calls parsed, a required one left to the model.
NATIVE_JSON = ToolFormat("json-native", MARKERS, parse, None, holds_json=True)
