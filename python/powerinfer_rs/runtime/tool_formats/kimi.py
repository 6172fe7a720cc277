"""Kimi-K2's calls, in special tokens (its template's text)::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    {...}<|tool_call_end|><|tool_calls_section_end|>

The id ``functions.NAME:IDX`` names the function; our own call ids are given instead (the
template numbers past calls itself)."""

from __future__ import annotations

import re
from typing import Any

from .base import ToolFormat, json_forcer, lit
from .call import ToolCall, function_specs, json_object

SECTION_BEGIN = "<|tool_calls_section_begin|>"
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARGS = "<|tool_call_argument_begin|>"
MARKERS = (SECTION_BEGIN, CALL_BEGIN)
_B, _A, _E = (re.escape(t) for t in (CALL_BEGIN, ARGS, CALL_END))
_CALL = re.compile(_B + r"\s*(?:functions\.)?([^:<\s]+)(?::\d+)?\s*" + _A + r"(.*?)(?:" + _E
                   + r"|$)", re.S)  # fmt: skip


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` of Kimi-K2 calls, or None."""
    names = {f.get("name") for f in function_specs(tools)}
    found = list(_CALL.finditer(text))
    calls = []
    for m in found:
        args = json_object(m.group(2))
        if m.group(1) not in names or args is None:
            return None
        calls.append(ToolCall(m.group(1), args))
    if not calls:
        return None
    starts = [at for at in (text.find(SECTION_BEGIN), found[0].start()) if at >= 0]
    return text[: min(starts)].strip(), calls


FORMAT = ToolFormat(
    "kimi-k2", MARKERS, parse,
    json_forcer(SECTION_BEGIN + CALL_BEGIN + "functions.", lambda n: f"{lit(n + ':0')} {ARGS}"),
)  # fmt: skip
