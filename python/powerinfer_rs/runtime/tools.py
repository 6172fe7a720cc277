"""Tool calls: putting OpenAI-style ``tools`` into a prompt and reading the model's calls back.

Prompt: a chat template that uses a ``tools`` variable (Qwen 2.5/3, Llama 3.1+, Mistral, Hermes
and others) gets the tools and renders them its own way. A template without one (SmolLM2's,
plain ChatML) gets :data:`FALLBACK_PROMPT` in the system message, asking for Hermes-style calls
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); earlier calls and results in the
history are then written the same way (results as ``<tool_response>`` in a user turn).

Output: :func:`parse_tool_calls` reads the conventions of the shipped templates:
- Hermes / Qwen: ``<tool_call>{json}</tool_call>``, one per call (a last one may be cut off by
  the end of the text);
- Mistral: ``[TOOL_CALLS]`` then a JSON list of calls;
- Llama 3.x: ``<|python_tag|>`` then JSON calls separated by ``;``, or the whole answer one JSON
  object ``{"name": ..., "parameters": {...}}``.
A call must name one of the given tools and carry a JSON object of arguments; anything else
stays text. :class:`ToolCallStream` does the same while streaming: text before a call is shown
at once, a call is held back until it is complete.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

#: The system prompt a template without tool support gets (the tools' JSON follows).
FALLBACK_PROMPT = (
    "You can call functions. To call one, answer with a line\n"
    '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "for each call and nothing else; the results come back in <tool_response> tags. "
    "The functions:\n"
)
#: What starts a call in each convention.
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")

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


def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template reads a ``tools`` variable."""
    return template is not None and re.search(r"\btools\b", template) is not None


def function_specs(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function`` part of each OpenAI tool."""
    return [t.get("function", t) for t in tools]


def _arguments(value: Any) -> dict[str, Any]:
    """A call's arguments as a dict (OpenAI history sends them as a JSON string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return {"_raw": value}
    return value if isinstance(value, dict) else {"_value": value}


def check_tool_history(messages: list[dict[str, Any]]) -> None:
    """Refuse a conversation whose tool calls and results do not add up, as OpenAI's API does
    (:class:`~.chat.ChatTemplateError` naming the message): every call of an assistant
    message has an ``id``; the ``tool`` messages right after it answer its calls, each by a
    ``tool_call_id`` among them, and every call is answered before the next other message
    (or the end of the conversation); a ``tool`` message anywhere else answers nothing."""
    from .chat import ChatTemplateError

    open_ids: list[str] | None = None  # the calls of the assistant message before this run
    pending: dict[str, int] = {}  # call id -> index of the message that made it
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        if m.get("role") == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or not cid:
                raise ChatTemplateError(
                    f"messages[{i}]: a 'tool' message needs its 'tool_call_id'",
                    param=f"messages[{i}].tool_call_id",
                )
            if open_ids is None:
                raise ChatTemplateError(
                    f"messages[{i}]: a 'tool' message must answer a call of the assistant "
                    "message right before it (one with 'tool_calls'); none precedes it",
                    param=f"messages[{i}].role",
                )
            if cid not in open_ids:
                raise ChatTemplateError(
                    f"messages[{i}].tool_call_id {cid!r} answers no call of the assistant "
                    f"message before it (its calls: {open_ids})",
                    param=f"messages[{i}].tool_call_id",
                )
            pending.pop(cid, None)
            continue
        _unanswered(pending)
        open_ids = None
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            open_ids = []
            for j, c in enumerate(calls if isinstance(calls, list) else []):
                cid = c.get("id") if isinstance(c, dict) else None
                if not isinstance(cid, str) or not cid:
                    raise ChatTemplateError(f"messages[{i}].tool_calls[{j}] has no 'id'",
                                            param=f"messages[{i}].tool_calls[{j}].id")  # fmt: skip
                open_ids.append(cid)
                pending[cid] = i
    _unanswered(pending)


def _unanswered(pending: dict[str, int]) -> None:
    if pending:
        from .chat import ChatTemplateError

        at = min(pending.values())
        raise ChatTemplateError(
            f"messages[{at}]: an assistant message with 'tool_calls' must be followed by 'tool' "
            f"messages answering each call; no answer to {sorted(pending)}",
            param=f"messages[{at}].tool_calls",
        )


def prompt_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template: str | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(messages, template variables)`` for a conversation with ``tools`` (None: none); a
    history whose calls and results do not add up is refused (:func:`check_tool_history`)."""
    check_tool_history(messages)
    native = template_takes_tools(template)
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if calls:
            fns = [
                {"name": c.get("function", c).get("name"),
                 "arguments": _arguments(c.get("function", c).get("arguments"))}
                for c in calls
            ]  # fmt: skip
            if native:
                m["tool_calls"] = [
                    {"type": "function", "id": c.get("id"), "function": f}
                    for c, f in zip(calls, fns)
                ]
            else:
                text = "\n".join(f"<tool_call>{json.dumps(f)}</tool_call>" for f in fns)
                m = {
                    "role": "assistant",
                    "content": ((m.get("content") or "") + "\n" + text).strip(),
                }
        elif m.get("role") == "tool" and not native:
            m = {
                "role": "user",
                "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
            }
        out.append(m)
    if not tools:
        return out, {}
    if native:
        return out, {"tools": tools}
    spec = "\n".join(json.dumps(f) for f in function_specs(tools))
    if out and out[0].get("role") == "system":
        out[0] = {
            "role": "system",
            "content": f"{out[0].get('content') or ''}\n\n{FALLBACK_PROMPT}{spec}",
        }
    else:
        out.insert(0, {"role": "system", "content": FALLBACK_PROMPT + spec})
    return out, {}


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


def _json_values(text: str) -> list[Any]:
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


def parse_tool_calls(text: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """``(content, calls)``: the text before the first call and the calls ``text`` makes of
    ``tools`` (see the module doc); ``(text, [])`` when it makes none."""
    names = {f.get("name") for f in function_specs(tools)}
    hermes = list(re.finditer(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S))
    if hermes:
        calls = [_call(v, names) for m in hermes for v in _json_values(m.group(1))[:1]]
        if calls and all(calls):
            return text[: hermes[0].start()].strip(), calls  # type: ignore[return-value]
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):
        at = text.find(marker)
        if at >= 0:
            values = _json_values(text[at + len(marker) :])
            if len(values) == 1 and isinstance(values[0], list):
                values = values[0]
            calls = [_call(v, names) for v in values]
            if calls and all(calls):
                return text[:at].strip(), calls  # type: ignore[return-value]
    stripped = text.strip()
    if stripped.startswith("{"):
        values = _json_values(stripped)
        calls = [_call(v, names) for v in values]
        if calls and all(calls):
            return "", calls  # type: ignore[return-value]
    return text, []


class ToolCallStream:
    """Streamed text with tools: :meth:`push` returns what can be shown as content now (text
    before any call marker, and never the start of one); :meth:`finish` parses the whole
    answer and returns ``(content still to show, calls)``."""

    def __init__(self, tools: list[dict[str, Any]]):
        self.tools = tools
        self.text = ""
        self.shown = 0
        self.holding = False

    def push(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        if not self.text[self.shown :].strip() and self.shown == 0:
            return ""
        if self.shown == 0 and self.text.lstrip().startswith("{"):
            self.holding = True  # perhaps a Llama 3 call: wait for the whole answer
            return ""
        rest = self.text[self.shown :]
        for marker in MARKERS:
            at = rest.find(marker)
            if at >= 0:
                self.holding = True
                return self._show(at)
        keep = 0
        for marker in MARKERS:
            for n in range(min(len(marker) - 1, len(rest)), 0, -1):
                if rest.endswith(marker[:n]):
                    keep = max(keep, n)
                    break
        return self._show(len(rest) - keep)

    def _show(self, n: int) -> str:
        out = self.text[self.shown : self.shown + n]
        self.shown += n
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = parse_tool_calls(self.text, self.tools)
        if not calls:
            return self.text[self.shown :], []
        return content[self.shown :] if len(content) > self.shown else "", calls
