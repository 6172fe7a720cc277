"""DeepSeek's calls, in special tokens. R1 (and V3)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``. One parser reads both
(what follows the separator tells: JSON, or a name and a fenced block). Their templates
render no tools, so the tools are described in the system prompt (:data:`PROMPT_R1`,
:data:`PROMPT_V31`) in the format the template writes past calls in."""

from __future__ import annotations

import json
import re
from typing import Any

from .base import ToolFormat, json_forcer, lit
from .call import ToolCall, function_specs, json_object

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALL_BEGIN)
_B, _S, _E = (re.escape(t) for t in (CALL_BEGIN, SEP, CALL_END))
_CALL = re.compile(_B + r"(.*?)" + _S + r"(.*?)(?:" + _E + r"|(?=" + _B + r")|$)", re.S)
_FENCED = re.compile(r"\s*([^\n`]+?)\s*\n\s*```(?:json)?\s*(.*?)\s*(?:```\s*)?$", re.S)


def _one(head: str, body: str, names: set[str]) -> ToolCall | None:
    if body.lstrip().startswith("{"):  # V3.1: the name before the separator
        name, args = head.strip(), json_object(body.strip())
    else:  # R1: the call's type before it, the name and a fenced JSON block after
        m = _FENCED.match(body)
        if m is None:
            return None
        name, args = m.group(1), json_object(m.group(2))
    if name not in names or args is None:
        return None
    return ToolCall(name, args)


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` of DeepSeek calls (either variant), or None."""
    names = {f.get("name") for f in function_specs(tools)}
    found = list(_CALL.finditer(text))
    calls = [_one(m.group(1), m.group(2), names) for m in found]
    if not calls or not all(calls):
        return None
    starts = [at for at in (text.find(CALLS_BEGIN), found[0].start()) if at >= 0]
    return text[: min(starts)].strip(), calls  # type: ignore[return-value]


_EXAMPLE_R1 = (f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}example_function_name\n```json\n"
               f'{{"arg1": "some_value"}}\n```{CALL_END}{CALLS_END}')  # fmt: skip
_EXAMPLE_V31 = f'{CALLS_BEGIN}{CALL_BEGIN}example_function_name{SEP}{{"arg1": "some_value"}}' \
               f"{CALL_END}{CALLS_END}"  # fmt: skip
_INTRO = "You can call the following functions to answer the user (as JSON schemas):\n"
PROMPT_R1 = _INTRO + "{tools}\n\nTo call them, answer exactly in this syntax:\n" + _EXAMPLE_R1
PROMPT_V31 = _INTRO + "{tools}\n\nTo call them, answer exactly in this syntax:\n" + _EXAMPLE_V31


def history(m: dict[str, Any]) -> dict[str, Any]:
    """A past call message as DeepSeek's templates take it: arguments as JSON text."""
    calls = [{**c, "function": {**c["function"],
                                "arguments": json.dumps(c["function"]["arguments"])}}
             for c in m["tool_calls"]]  # fmt: skip
    return {**m, "tool_calls": calls}


_OPEN = CALLS_BEGIN + CALL_BEGIN
R1 = ToolFormat(
    "deepseek-r1", MARKERS, parse,
    json_forcer(_OPEN + "function" + SEP, lambda n: lit(n + "\n```json\n"), lit("\n```")),
    PROMPT_R1, history=history,
)  # fmt: skip
V31 = ToolFormat("deepseek-v3.1", MARKERS, parse, json_forcer(_OPEN, lambda n: f"{lit(n)} {SEP}"),
                 PROMPT_V31, history=history)  # fmt: skip
