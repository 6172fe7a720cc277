"""The output constraint an OpenAI request asks for: ``response_format`` (OpenAI's, with
llama.cpp's ``{"type": "json_object", "schema": S}``), or llama.cpp's body fields
``json_schema`` (a schema) and ``grammar`` (GBNF, run by llguidance through its own GBNF
converter: :meth:`~..runtime.constrain.Grammar.compile`). At most one of them may ask for
something; two are a 400 naming the second."""

from __future__ import annotations

from typing import Any

from ..runtime.constrain import Grammar, closed_schema
from .errors import APIError


def _format_grammar(req: Any) -> Grammar | None:
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return Grammar("json_schema", rf.object_schema if rf.object_schema is not None else True)
    if rf.json_schema is None:
        raise APIError(400, "response_format.json_schema is required for type json_schema",
                       param="response_format.json_schema")  # fmt: skip
    schema = rf.json_schema.json_schema
    return Grammar("json_schema", closed_schema(schema) if rf.json_schema.strict else schema)


def response_grammar(req: Any) -> tuple[Grammar | None, str]:
    """``(the constraint, the field that gave it)`` of a chat or completion request (None:
    plain text; the field then "response_format")."""
    given: list[tuple[str, Grammar]] = []
    g = _format_grammar(req)
    if g is not None:
        given.append(("response_format", g))
    if req.json_schema is not None:
        given.append(("json_schema", Grammar("json_schema", req.json_schema)))
    if req.grammar is not None:
        given.append(("grammar", Grammar("gbnf", req.grammar)))
    if len(given) > 1:
        names = [n for n, _ in given]
        raise APIError(
            400,
            f"give one of response_format, json_schema and grammar, not {' and '.join(names)}",
            param=names[1],
        )
    if not given:
        return None, "response_format"
    return given[0][1], given[0][0]
