"""What a tool-call family is (:class:`ToolFormat`), and the grammar helpers that constrain
a required call in a family's own text (the rest of it after the prompt's forced prefix)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..constrain import Grammar, check_tool_schemas, closed_schema
from .call import ToolCall, function_specs

#: A family's parser: ``(content, calls)`` of a whole answer, or None where it makes no call
#: in this family's syntax (the content is the text before the first call).
Parser = Callable[[str, list[dict[str, Any]]], "tuple[str, list[ToolCall]] | None"]
#: How a family forces a call: ``(prefix, grammar)`` for ``tools`` and the ``named`` one
#: (None: any of them); the prompt ends with ``prefix``, the answer continues as ``grammar``.
Forcer = Callable[[list[dict[str, Any]], "str | None"], "tuple[str, Grammar]"]


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool-call syntax: ``markers`` start a call (a stream holds its text back
    from there), ``parse`` reads the calls, ``force`` starts and constrains a required one
    (None: the family's calls are left to the model), ``prompt`` tells a template that
    renders no tools how to call them (DeepSeek's templates), ``holds_json`` (the generic
    family: Llama 3's bare-JSON answer) holds a stream that starts with ``{``; ``history``
    adapts a past assistant message with ``tool_calls`` (arguments as objects) to what the
    template expects (default :func:`text_content`; DeepSeek's join the arguments in as a
    JSON string and test the content for None)."""

    name: str
    markers: tuple[str, ...]
    parse: Parser
    force: Forcer | None = None
    prompt: str = ""
    holds_json: bool = False
    history: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def past_calls(self, m: dict[str, Any]) -> dict[str, Any]:
        """A past assistant message with ``tool_calls`` as this family's template takes it."""
        return (self.history or text_content)(m)


def text_content(m: dict[str, Any]) -> dict[str, Any]:
    """A past call message with its ``content`` as text, never None (OpenAI clients send
    null; GLM's template would print "None", gpt-oss's looks for tags in it)."""
    return {**m, "content": m.get("content") or ""}


def lit(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text)


#: llguidance's JSON layout for arguments: one fixed layout (free whitespace lets a small model
#: write blank lines forever), the one the templates write past calls in (``tojson``: ", "
#: and ": "), so a constrained call reads as the model was trained on.
TEMPLATE_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def schema_text(schema: Any) -> str:
    """``schema`` (closed as OpenAI's strict mode) as Lark's ``%json`` takes it, in
    :data:`TEMPLATE_JSON`'s layout unless it sets its own."""
    out = closed_schema(schema)
    if isinstance(out, dict) and "x-guidance" not in out:
        out = {**out, "x-guidance": TEMPLATE_JSON}
    return json.dumps(out)


def json_rule(i: int, f: dict[str, Any]) -> str:
    """The Lark rule ``args_i``: the arguments of function ``f`` as its (closed) schema."""
    return f"args_{i}: %json {schema_text(f.get('parameters') or {'type': 'object'})}"


def one_call(
    tools: list[dict[str, Any]],
    named: str | None,
    build: Callable[[int, dict[str, Any], bool], tuple[str, list[str]]],
) -> Grammar:
    """A Lark grammar for one call of ``named`` (or of any tool, None): ``build(i, f, any)``
    gives the Lark text of a call of function ``f`` (with its name when ``any``) and the rules
    it uses."""
    check_tool_schemas(tools)
    alts, rules = [], []
    for i, f in enumerate(function_specs(tools)):
        if named is not None and f.get("name") != named:
            continue
        alt, extra = build(i, f, named is None)
        alts.append(f"({alt})")
        rules += extra
    return Grammar("lark", "start: " + " | ".join(alts) + "\n" + "\n".join(rules))


def json_forcer(opening: str, head: Callable[[str], str], tail: str = "") -> Forcer:
    """A forcer for a family whose arguments are JSON. ``head(name)`` is the Lark text of a
    call's start after ``opening`` up to its arguments (literals and ``<special>`` tokens),
    ``tail`` the Lark text after them. A named call's prompt ends with ``opening`` and the text
    of its head, and the grammar is its arguments and tail; for any tool the prompt ends with
    ``opening`` and the grammar writes one of the heads, then that tool's arguments."""

    def force(tools: list[dict[str, Any]], named: str | None) -> tuple[str, Grammar]:
        def build(i: int, f: dict[str, Any], any_tool: bool) -> tuple[str, list[str]]:
            start = head(f["name"]) + " " if any_tool else ""
            return f"{start}args_{i} {tail}".strip(), [json_rule(i, f)]

        prefix = opening if named is None else opening + lark_text(head(named))
        return prefix, one_call(tools, named, build)

    return force


def lark_text(fragment: str) -> str:
    """The text a Lark sequence of string literals and ``<special>`` tokens matches (the
    ``head`` fragments of :func:`json_forcer`): literals decoded, tokens as written."""
    out, i = [], 0
    dec = json.JSONDecoder()
    while i < len(fragment):
        ch = fragment[i]
        if ch == '"':
            value, i = dec.raw_decode(fragment, i)
            out.append(value)
        elif ch == "<":
            end = fragment.index(">", i) + 1
            out.append(fragment[i:end])
            i = end
        else:
            i += 1
    return "".join(out)
