"""gpt-oss's harmony calls: a message to a function, in its header's recipient::

    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>

as the template writes past calls, or as the model writes them after the generation prompt
(``<|start|>assistant``), the recipient after the channel::

    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

The reasoning (``analysis``) and the answer (``final``) are split by
:class:`~..harmony.HarmonySplitter`, which passes such calls on in the first form."""

from __future__ import annotations

import re
from typing import Any

from .base import ToolFormat, json_forcer, lit
from .call import ToolCall, function_specs, json_object

MESSAGE = "<|message|>"
ENDS = ("<|call|>", "<|end|>", "<|return|>")
#: Where a call's message starts in the text the splitter passes on, or in raw output.
MARKERS = ("<|start|>assistant to=", "to=functions.")
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


def call_text(recipient: str, body: str, ended: bool = True) -> str:
    """A call message as the template writes one (``recipient`` ``functions.NAME``)."""
    end = "<|call|>" if ended else ""
    return f"<|start|>assistant to={recipient}<|channel|>commentary json{MESSAGE}{body}{end}"


def _body(text: str) -> str:
    cut = min((at for at in (text.find(e) for e in ENDS) if at >= 0), default=len(text))
    return text[:cut]


def parse(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]] | None:
    """``(content, calls)`` of the function messages in ``text``, or None. The content is the
    text before the first one's header."""
    names = {f.get("name") for f in function_specs(tools)}
    calls, first = [], -1
    pos = 0
    while True:
        at = text.find(MESSAGE, pos)
        if at < 0:
            break
        start = max(text.rfind("<|start|>", pos, at), text.rfind("<|end|>", pos, at), pos)
        header = text[start:at]
        body_end = at + len(MESSAGE)
        body = _body(text[body_end:])
        pos = body_end + len(body)
        m = _RECIPIENT.search(header)
        if m is None:
            continue
        args = json_object(body)
        if m.group(1) not in names or args is None:
            return None
        calls.append(ToolCall(m.group(1), args))
        if first < 0:
            first = start
    if not calls:
        return None
    return text[:first].strip(), calls


FORMAT = ToolFormat(
    "gpt-oss", MARKERS, parse,
    json_forcer("<|channel|>commentary to=functions.",
                lambda n: f"{lit(n + ' ')} <|constrain|> {lit('json')} {MESSAGE}"),
)  # fmt: skip
