"""Qwen3-Coder's XML calls (its template's text)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is typed by the tool's schema (:func:`~.call.typed_value`: strings as written,
numbers, booleans, objects parsed). The model sometimes leaves out ``<tool_call>``: a bare
``<function=NAME>`` block is a call too."""

from __future__ import annotations

import re
from typing import Any

from ..constrain import Grammar
from .base import ToolFormat, lit, one_call
from .call import ToolCall
from .xml_args import xml_arguments, xml_calls

MARKERS = ("<tool_call>", "<function=")
_CALL = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def _value(raw: str) -> str:
    """A parameter's text without the one newline the template puts on each side."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` of Qwen3-Coder calls, or None. A call must be closed
    (``</function>``): one cut off (by ``max_tokens``) could miss arguments."""
    found = list(_CALL.finditer(text))
    calls = xml_calls(found, tools, _PARAM, _value)
    if not calls:
        return None
    start = found[0].start()
    opening = text.rfind("<tool_call>", 0, start)
    if opening >= 0 and not text[opening + len("<tool_call>") : start].strip():
        start = opening
    return text[:start].strip(), calls


def force(tools: list[dict[str, Any]], named: str | None) -> tuple[str, Grammar]:
    """A call started ``<tool_call>\\n<function=`` (and the name, for a named one); its
    parameters constrained to the schema's keys and value types."""

    def build(i: int, f: dict[str, Any], any_tool: bool) -> tuple[str, list[str]]:
        args, rules = xml_arguments(i, f, ("<parameter=", ">\n", "</parameter>\n"), "\n")
        head = lit(f["name"] + ">\n") + " " if any_tool else ""
        return f"{head}{args} {lit('</function>' + chr(10) + '</tool_call>')}", rules

    prefix = "<tool_call>\n<function="
    if named is not None:
        prefix += named + ">\n"
    return prefix, one_call(tools, named, build)


FORMAT = ToolFormat("qwen3-coder", MARKERS, parse, force)
