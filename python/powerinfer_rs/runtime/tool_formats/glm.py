"""GLM-4.5/4.6's XML calls (its template's text)::

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

The template writes a string value as it is and any other value as JSON, so a value is typed
by the tool's schema (:func:`~.call.typed_value`)."""

from __future__ import annotations

import re
from typing import Any

from ..constrain import Grammar
from .base import ToolFormat, lit, one_call
from .call import ToolCall
from .xml_args import xml_arguments, xml_calls

MARKERS = ("<tool_call>",)
_CALL = re.compile(r"<tool_call>\s*([^\n<]*?)\s*(?=<arg_key>|</tool_call>|\n)(.*?)</tool_call>",
                   re.S)  # fmt: skip
_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)(?:</arg_value>|$)", re.S)


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` of GLM calls, or None (a ``<tool_call>`` holding JSON is a Hermes
    call: left to the JSON family). A call must be closed: one cut off (by ``max_tokens``)
    could miss arguments."""
    found = list(_CALL.finditer(text))
    calls = xml_calls(found, tools, _ARG)
    if not calls:
        return None
    return text[: found[0].start()].strip(), calls


def force(tools: list[dict[str, Any]], named: str | None) -> tuple[str, Grammar]:
    """A call started ``<tool_call>`` (and the name, for a named one); its arguments
    constrained to the schema's keys and value types."""

    def build(i: int, f: dict[str, Any], any_tool: bool) -> tuple[str, list[str]]:
        args, rules = xml_arguments(i, f, ("<arg_key>", "</arg_key>\n<arg_value>",
                                           "</arg_value>\n"))  # fmt: skip
        head = lit(f["name"] + "\n") + " " if any_tool else ""
        return f"{head}{args} {lit('</tool_call>')}", rules

    prefix = "<tool_call>" if named is None else f"<tool_call>{named}\n"
    return prefix, one_call(tools, named, build)


FORMAT = ToolFormat("glm-4.5", MARKERS, parse, force)
