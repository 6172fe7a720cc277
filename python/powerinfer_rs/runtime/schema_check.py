"""Whether a JSON schema has a finite instance at all, checked before any constrained generation.

A schema such as ``{"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}``
(an object that must hold itself) or ``{"$ref": "#"}`` describes no finite JSON value. The
grammar engine (llguidance) does not see it when compiling: it grows its parser until a limit
("Too many items") after the first token, or allows nothing at all, so the answer is an error in
the middle of a stream or empty text. :func:`finite_problem` finds such schemas first.

The analysis is the least fixed point of "has a finite instance" over the schema's local
references (``#``, ``#/$defs/...``): every reference starts as "none" and is re-evaluated until
nothing changes. A schema has one when every part an instance must contain has one: its
``allOf`` members, one of its ``anyOf``/``oneOf`` members, and for one of its types the
``required`` properties (objects) or the first ``minItems`` items and ``contains`` (arrays).
The check is sound but not complete: it refuses only schemas that certainly have no finite
instance (keywords it does not model, such as ``not``, ``if``, ``patternProperties`` or remote
references, count as satisfiable), so a valid schema is never refused; contradictions of
single keywords (``minLength`` above ``maxLength``, ``false``) are llguidance's to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

#: JSON types when a schema names none.
ALL_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class _Unknown:
    """A reference the analysis cannot follow (remote, an anchor, a missing pointer)."""


UNKNOWN = _Unknown()


def resolve(root: Any, ref: Any) -> Any:
    """The part of ``root`` a local ``$ref`` points to, or :data:`UNKNOWN`."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return UNKNOWN
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return UNKNOWN
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return UNKNOWN
    return node


class _Finite:
    """One evaluation pass: ``why(schema, path)`` is None when ``schema`` has a finite instance
    (given what is known of the references), else the path of the part that has none."""

    def __init__(self, root: Any, known: dict[str, bool]):
        self.root = root
        self.known = known
        self.refs: set[str] = set()  # local references met in this pass

    def why(self, s: Any, path: str) -> str | None:
        if s is False:
            return path
        if not isinstance(s, Mapping):
            return None
        ref = s.get("$ref")
        if ref is not None and resolve(self.root, ref) is not UNKNOWN:
            self.refs.add(ref)
            if not self.known.get(ref, False):
                return f"{path} ($ref {ref!r})"
        for i, sub in enumerate(_list(s.get("allOf"))):
            bad = self.why(sub, f"{path}/allOf/{i}")
            if bad is not None:
                return bad
        for key in ("anyOf", "oneOf"):
            subs = _list(s.get(key))
            if subs:
                bads = [self.why(sub, f"{path}/{key}/{i}") for i, sub in enumerate(subs)]
                if all(b is not None for b in bads):
                    return bads[0]
        if "enum" in s or "const" in s:
            return None
        types = s.get("type", ALL_TYPES)
        types = [types] if isinstance(types, str) else _list(types)
        bads = [self._type_why(t, s, path) for t in types]
        if bads and all(b is not None for b in bads):
            return bads[0]
        return None

    def _type_why(self, t: Any, s: Mapping, path: str) -> str | None:
        if t == "object":
            props = s.get("properties")
            props = props if isinstance(props, Mapping) else {}
            for name in _list(s.get("required")):
                if name in props:
                    bad = self.why(props[name], f"{path}/properties/{name}")
                elif "patternProperties" not in s and "additionalProperties" in s:
                    bad = self.why(s["additionalProperties"], f"{path}/additionalProperties")
                else:
                    bad = None
                if bad is not None:
                    return bad
        elif t == "array":
            n = s.get("minItems", 0)
            n = n if isinstance(n, int) and not isinstance(n, bool) else 0
            items = s.get("items")
            prefix = _list(s.get("prefixItems")) or (items if isinstance(items, list) else [])
            rest = s.get("additionalItems") if isinstance(items, list) else items
            for i, sub in enumerate(prefix[:n]):
                bad = self.why(sub, f"{path}/prefixItems/{i}")
                if bad is not None:
                    return bad
            if n > len(prefix) and rest is not None:
                bad = self.why(rest, f"{path}/items")
                if bad is not None:
                    return bad
            if "contains" in s and s.get("minContains", 1) != 0:
                return self.why(s["contains"], f"{path}/contains")
        return None


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def no_finite_instance(schema: Any) -> str | None:
    """None when ``schema`` may have a finite instance; else the path (a JSON pointer) of the
    part every instance would have to contain and that has none.

    References start as having none and are set to having one when their target is shown to
    (given what is known so far) until nothing changes: the least fixed point, at most one
    pass over the schema per reference."""
    known: dict[str, bool] = {}
    check = _Finite(schema, known)
    try:
        check.why(schema, "#")  # collects the references
        changed, seen = True, 0
        while changed or len(check.refs) > seen:  # a pass may meet new references
            changed, seen = False, len(check.refs)
            for ref in sorted(check.refs):
                if not known.get(ref) and check.why(resolve(schema, ref), ref) is None:
                    known[ref] = changed = True
        return check.why(schema, "#")
    except RecursionError:  # nested past Python's stack: llguidance's to judge
        return None


def finite_problem(schema: Any, where: str) -> str | None:
    """What is wrong with a JSON schema that has no finite instance (naming ``where`` and the
    part that recurses with no way out), or None."""
    bad = no_finite_instance(schema)
    if bad is None:
        return None
    return (
        f"{where}: this JSON schema has no finite instance: every value must contain a value "
        f"of {bad}, which has none (a required property, minItems, allOf or $ref that recurses "
        "with no way out)"
    )
