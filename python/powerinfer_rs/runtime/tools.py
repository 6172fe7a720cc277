"""Tool calls: putting OpenAI-style ``tools`` into a prompt and reading the model's calls back.

Prompt: a chat template that uses a ``tools`` variable (Qwen 2.5/3, Llama 3.1+, Mistral, Hermes
and others) gets the tools and renders them its own way. A template without one (SmolLM2's,
plain ChatML) gets :data:`FALLBACK_PROMPT` in the system message, asking for Hermes-style calls
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``); earlier calls and results in the
history are then written the same way (results as ``<tool_response>`` in a user turn).

Output: :func:`parse_tool_calls` reads the calls in the template's family (:mod:`.tool_formats`:
Qwen3-Coder and GLM XML, DeepSeek R1/V3.1, Kimi-K2, gpt-oss harmony), and the JSON conventions
(Hermes/Qwen ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama 3) for any template. A call must
name one of the given tools and carry an object of arguments; anything else stays text.
:class:`ToolCallStream` does the same while streaming: text before a call is shown at once, a
call is held back until the answer ends. A template of a known family that renders no tools
(DeepSeek's) gets the tools described in its family's syntax in the system message.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .tool_formats import ToolCall, ToolFormat, format_of, function_specs
from .tool_formats.call import partial_suffix
from .tool_formats.json_calls import GENERIC

#: The system prompt a template without tool support gets (the tools' JSON follows).
FALLBACK_PROMPT = (
    "You can call functions. To call one, answer with a line\n"
    '<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "for each call and nothing else; the results come back in <tool_response> tags. "
    "The functions:\n"
)


def template_takes_tools(template: str | None) -> bool:
    """Whether a chat template reads a ``tools`` variable."""
    return template is not None and re.search(r"\btools\b", template) is not None


def tool_format(template: str | None) -> ToolFormat:
    """The tool-call family of a chat template (:func:`.tool_formats.format_of`)."""
    return format_of(template, template_takes_tools(template))


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
    history whose calls and results do not add up is refused (:func:`check_tool_history`).
    Past calls stay structured (``tool_calls`` with arguments as objects) for a template that
    renders them; else they are written as Hermes calls."""
    check_tool_history(messages)
    renders = template_takes_tools(template)
    fmt = format_of(template, renders)
    prompt = fmt.prompt  # a family's own words for its tools
    native = renders or bool(prompt)
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
                m = fmt.past_calls(m)
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
    if renders:
        return out, {"tools": tools}
    spec = "\n".join(json.dumps(f) for f in function_specs(tools))
    intro = prompt.replace("{tools}", spec) if prompt else FALLBACK_PROMPT + spec
    if out and out[0].get("role") == "system":
        out[0] = {
            "role": "system",
            "content": f"{out[0].get('content') or ''}\n\n{intro}",
        }
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out, {}


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]], fmt: ToolFormat = GENERIC
) -> tuple[str, list[ToolCall]]:
    """``(content, calls)``: the text before the first call and the calls ``text`` makes of
    ``tools`` in family ``fmt`` or a JSON convention (see the module doc); ``(text, [])``
    when it makes none."""
    for family in (fmt, GENERIC) if fmt is not GENERIC else (GENERIC,):
        got = family.parse(text, tools)
        if got is not None:
            return got
    return text, []


class ToolCallStream:
    """Streamed text with tools: :meth:`push` returns what can be shown as content now (text
    before any call marker of family ``fmt`` or the JSON conventions, and never the start of
    one); :meth:`finish` parses the whole answer and returns ``(content still to show,
    calls)``. Each push looks only at the text not shown yet (a few characters: what may
    start a marker), and at nothing once a call began, so its cost per token is constant."""

    def __init__(self, tools: list[dict[str, Any]], fmt: ToolFormat = GENERIC):
        self.tools = tools
        self.fmt = fmt
        self.markers = tuple(dict.fromkeys(fmt.markers + GENERIC.markers))
        self.parts: list[str] = []
        self.rest = ""  # the text after what was shown, until a call begins
        self.shown = 0
        self.holding = False

    def push(self, piece: str) -> str:
        """Take ``piece``; return the content that can be shown now."""
        if self.holding:
            self.parts.append(piece)
            return ""
        rest = self.rest + piece
        if self.shown == 0 and not rest.strip():
            self.rest = rest
            return ""
        if self.shown == 0 and self.fmt.holds_json and rest.lstrip().startswith("{"):
            return self._hold(rest, 0)  # perhaps a Llama 3 call: wait for the whole answer
        for marker in self.markers:
            at = rest.find(marker)
            if at >= 0:
                return self._hold(rest, at)
        n = len(rest) - partial_suffix(rest, self.markers)
        self.rest = rest[n:]
        return self._shown(rest[:n])

    def _hold(self, rest: str, at: int) -> str:
        self.holding = True
        self.rest = ""
        shown = self._shown(rest[:at])
        self.parts.append(rest[at:])
        return shown

    def _shown(self, text: str) -> str:
        self.parts.append(text)
        self.shown += len(text)
        return text

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The answer's end: the content not shown yet and the calls."""
        text = "".join(self.parts) + self.rest
        content, calls = parse_tool_calls(text, self.tools, self.fmt)
        if not calls:
            return text[self.shown :], []
        return content[self.shown :] if len(content) > self.shown else "", calls
