"""Arguments written as XML-ish key/value pairs (Qwen3-Coder's ``<parameter=K>``, GLM's
``<arg_key>``/``<arg_value>``): read back typed by the tool's schema, and constrained to the
keys the schema names, each value as its type."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .base import lit, schema_text
from .call import ToolCall, schemas_of, typed_value


def xml_calls(
    found: list[re.Match[str]],
    tools: list[dict[str, Any]],
    arg: re.Pattern[str],
    raw: Callable[[str], str] = lambda v: v,
) -> list[ToolCall] | None:
    """The calls of ``found`` (each match: the name in group 1, the body in group 2), their
    arguments the ``arg`` matches of the body (key in group 1, value in group 2, cleaned by
    ``raw``) typed by the tool's schema; None when a name is no tool's."""
    schemas = schemas_of(tools)
    calls = []
    for m in found:
        name = m.group(1).strip()
        if name not in schemas:
            return None
        props = schemas[name].get("properties") or {}
        args = {}
        for a in arg.finditer(m.group(2)):
            key = a.group(1).strip()
            args[key] = typed_value(raw(a.group(2)), props.get(key))
        calls.append(ToolCall(name, args))
    return calls


def value_rule(rule: str, schema: Any, json_tail: str) -> str:
    """The Lark rule for one value: text without ``<`` for a string (or a value of no declared
    type), a boolean as JSON or as Jinja prints Python's (``True``: Qwen3-Coder's template
    writes them so), else JSON of ``schema``; a non-string followed by ``json_tail``."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind in (None, "string"):
        return f"{rule}: /[^<]*/"
    tail = f" {lit(json_tail)}" if json_tail else ""
    if kind == "boolean":
        return f'{rule}: ("true" | "false" | "True" | "False"){tail}'
    return f"{rule}: %json {schema_text(schema)}{tail}"


def xml_arguments(
    i: int, f: dict[str, Any], pair: tuple[str, str, str], json_tail: str = ""
) -> tuple[str, list[str]]:
    """The Lark sequence of function ``f``'s arguments, each written ``open KEY mid VALUE
    close`` (``pair``): required ones in the schema's order, then the optional ones, each
    optional; and the value rules it uses."""
    schema = f.get("parameters") or {}
    props = schema.get("properties") or {}
    required = [k for k in props if k in (schema.get("required") or [])]
    optional = [k for k in props if k not in required]
    parts, rules = [], []
    for j, key in enumerate(required + optional):
        rule = f"v_{i}_{j}"
        rules.append(value_rule(rule, props[key], json_tail))
        item = f"{lit(pair[0] + key + pair[1])} {rule} {lit(pair[2])}"
        parts.append(item if key in required else f"({item})?")
    return " ".join(parts), rules
