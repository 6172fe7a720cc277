"""Constrained decoding: only tokens a grammar allows are sampled, so the output parses.

The grammar engine is llguidance (a maintained Rust library, the one llama.cpp and vLLM use;
its wheel is a Rust extension): JSON schemas (``response_format``, tool arguments), its
Lark-like grammars (which embed JSON schemas with ``%json``) and regular expressions. The
token mask is computed in its Rust code, with the GIL released, in a thread of its own while
the engine runs the forward pass of the token just taken (:class:`Constraint` is asked for the
next mask as soon as a token is consumed), so the two overlap.

Chosen over outlines-core because llguidance computes masks lazily over a token trie (about a
millisecond on a 49k vocabulary, no precompiled index per schema: a new schema costs nothing
up front), takes the Lark/JSON-schema/regex inputs this API exposes, and reports the schema
features it cannot express by name (they become 400s in the server).
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lazy import optional_import
from ..errors import UnsupportedError
from .schema_check import finite_problem
from .tokenizer import unencodable

#: What installs the grammar engine.
GRAMMAR_EXTRA = "pip install 'powerinfer-rs[grammar]'"

_tokenizers: dict[int, Any] = {}
_lock = threading.Lock()
#: The thread the masks are computed in (llguidance releases the GIL), shared by every
#: generation: the forward passes run meanwhile in the engine's own threads.
_POOL = ThreadPoolExecutor(1, thread_name_prefix="grammar")


class GrammarError(UnsupportedError):
    """A schema or grammar the grammar engine cannot use (the message says which part)."""


def _llg() -> Any:
    return optional_import("llguidance", "constrained decoding", GRAMMAR_EXTRA)


def ll_tokenizer(tokenizer: Any, n_vocab: int) -> Any:
    """llguidance's view of ``tokenizer`` (built once per tokenizer: about 0.4 s for 49k
    tokens)."""
    key = id(tokenizer)
    with _lock:
        hit = _tokenizers.get(key)
        if hit is None or hit[0] is not tokenizer:
            llg = _llg()
            eos = tokenizer.eos_ids[0] if tokenizer.eos_ids else None
            llt = llg.LLTokenizer(tokenizer.inner.to_str(), n_vocab=n_vocab, eos_token=eos)
            hit = _tokenizers[key] = (tokenizer, llt)
        return hit[1]


@dataclass(frozen=True)
class Grammar:
    """A constraint as given: ``kind`` "json_schema" (``value`` a schema dict, or True for any
    JSON object), "lark", "gbnf" (llama.cpp's grammar format, converted to Lark by
    llguidance's own converter, which passes Lark text starting ``%llguidance`` or
    ``start:`` through as llama.cpp's llguidance build does) or "regex" (``value`` the
    text)."""

    kind: str
    value: Any

    @property
    def argument(self) -> str:
        """The generation argument that gives a constraint of this kind."""
        return {"lark": "grammar", "gbnf": "grammar"}.get(self.kind, self.kind)

    def compile(self) -> str:
        """llguidance's grammar text; a :class:`GrammarError` naming the argument for text that
        is not text (a lone surrogate) and for a JSON schema with no finite instance."""
        llg = _llg()
        problem = unencodable(self.value, self.argument)
        if problem is not None:
            raise GrammarError(problem)
        if self.kind == "json_schema":
            schema = {"type": "object"} if self.value is True else self.value
            problem = finite_problem(schema, self.argument)
            if problem is not None:
                raise GrammarError(problem)
            return llg.LLMatcher.grammar_from_json_schema(compact(schema))
        if self.kind == "lark":
            return llg.LLMatcher.grammar_from_lark(self.value)
        if self.kind == "gbnf":
            return llg.LLMatcher.grammar_from_lark(gbnf_as_lark(self.value))
        if self.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(self.value)
        raise GrammarError(f"unknown grammar kind {self.kind!r}")


def gbnf_as_lark(text: str) -> str:
    """GBNF ``text`` as llguidance's Lark (its converter, ``llguidance.gbnf_to_lark``); text it
    cannot read is a :class:`GrammarError` saying where."""
    conv = optional_import("llguidance.gbnf_to_lark", "GBNF grammars", GRAMMAR_EXTRA)
    try:
        return conv.any_to_lark(text)
    except Exception as e:  # the converter raises its own error, and others on odd input
        raise GrammarError(f"grammar: not a GBNF grammar the engine can read: {e}") from None


def grammar_of(json_schema: Any = None, grammar: Any = None, regex: Any = None) -> Grammar | None:
    """The one constraint the generation arguments give (None: none); more than one is a
    :class:`GrammarError`."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("lark", grammar),
                                 ("regex", regex)) if v is not None]  # fmt: skip
    if len(given) > 1:
        raise GrammarError(f"give one of json_schema, grammar, regex, not {[k for k, _ in given]}")
    if not given:
        return None
    kind, value = given[0]
    if kind == "json_schema" and not (value is True or isinstance(value, dict)):
        raise GrammarError(
            f"json_schema must be a JSON schema (a dict), got {type(value).__name__}"
        )
    if kind != "json_schema" and not isinstance(value, str):
        raise GrammarError(f"{'grammar' if kind == 'lark' else kind} must be a string")
    return Grammar(kind, value)


class Constraint:
    """A grammar applied to one generation: :meth:`mask` the logits of each step, then
    :meth:`consume` the sampled token (which starts the next mask's computation at once)."""

    def __init__(self, grammar: Grammar, tokenizer: Any, n_vocab: int):
        llg = _llg()
        self._lln = optional_import("llguidance.numpy", "constrained decoding", GRAMMAR_EXTRA)
        llt = ll_tokenizer(tokenizer, n_vocab)
        text = grammar.compile()
        problem = llg.LLMatcher.validate_grammar(text, llt)
        if problem:
            raise GrammarError(
                f"the grammar engine cannot use this {grammar.kind}: {brief(problem)}"
            )
        self.matcher = llg.LLMatcher(llt, text)
        if self.matcher.is_error():
            raise GrammarError(f"{grammar.argument}: {brief(self.matcher.get_error())}")
        self.n_vocab = n_vocab
        self.done = False
        self._bits = self._lln.allocate_token_bitmask(1, llt.vocab_size)
        # The first mask here, not in the pool: a grammar that allows nothing at all (a schema
        # that is only a reference to itself) fails now, before generation, not as an empty
        # answer. It costs about a millisecond of the first step's overlap.
        self._fill()
        if self.matcher.is_error():
            raise GrammarError(
                f"{grammar.argument} admits no text at all (the grammar engine stopped at "
                f"once: {brief(self.matcher.get_error())})"
            )
        self._next: Future | None = None

    def _fill(self) -> None:
        self._lln.fill_next_token_bitmask(self.matcher, self._bits, 0)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with every token the grammar does not allow next at -inf (a copy)."""
        if self._next is not None:
            self._next.result()
            self._next = None
        out = np.array(logits, dtype=np.float32, copy=True).reshape(1, -1)
        self._lln.apply_token_bitmask_inplace(out, self._bits)
        return out[0]

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens``, in a row from here, the grammar allows (speculative drafts
        are cut there before they are verified). The matcher is not advanced: llguidance's
        ``validate_tokens`` only looks, so nothing needs rolling back."""
        if self._next is not None:
            self._next.result()
            self._next = None
        return int(self.matcher.validate_tokens([int(t) for t in tokens]))

    def consume(self, token: int) -> None:
        """Advance past ``token`` and start computing the next mask (the matcher is not
        touched again until :meth:`mask` has waited for it)."""
        if not self.matcher.consume_token(token):
            raise GrammarError(
                f"token {token} is not allowed here: {brief(self.matcher.get_error())}"
            )
        #: The grammar is complete and allows nothing more.
        self.done = self.matcher.is_stopped()
        if not self.done:
            self._next = _POOL.submit(self._fill)


#: llguidance's JSON options: one fixed layout (", " and ": " between items, no newlines),
#: since free whitespace lets a small model write blank lines until ``max_tokens``.
COMPACT = {"whitespace_flexible": False}


def compact(schema: Any) -> Any:
    """``schema`` with llguidance's fixed-whitespace option, unless it sets its own."""
    if isinstance(schema, dict) and "x-guidance" not in schema:
        return {**schema, "x-guidance": COMPACT}
    return schema


def closed_schema(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that does not say
    (OpenAI's strict mode: only the listed properties; a bare schema would let a small model
    add properties forever)."""
    if isinstance(schema, list):
        return [closed_schema(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_schema(v) for k, v in schema.items()}
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def brief(error: str) -> str:
    """An llguidance error without the parser state and grammar it appends."""
    return error.split("\n<state>", 1)[0].split("\n<grammar>", 1)[0].strip()


def check_tool_schemas(tools: list[dict[str, Any]], where: str = "tools") -> None:
    """Refuse tools whose parameters no call could satisfy: a string that is not text or a
    schema with no finite instance (:class:`GrammarError` naming ``tools[i]``)."""
    for i, t in enumerate(tools):
        f = t.get("function", t) if isinstance(t, dict) else {}
        params = f.get("parameters") if isinstance(f, dict) else None
        at = f"{where}[{i}] ({f.get('name')!r})"
        problem = unencodable(params, at)
        if problem is not None:
            raise GrammarError(problem)
        problem = finite_problem(params, at) if isinstance(params, dict) else None
        if problem is not None:
            raise GrammarError(problem)


def tool_call_grammar(tools: list[dict[str, Any]], named: str | None) -> Grammar:
    """The rest of a Hermes-style call after the prompt's prefix: the arguments of ``named``
    (after ``<tool_call>{"name": "X", "arguments": ``), or, with ``named`` None, a tool's name
    and its arguments (after ``<tool_call>{"name": "``); arguments as its parameter schema."""
    check_tool_schemas(tools)
    fns = [t.get("function", t) for t in tools]
    rules, alts = [], []
    for i, f in enumerate(fns):
        schema = compact(closed_schema(f.get("parameters") or {"type": "object"}))
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
        if named is None:
            head = json.dumps(f["name"] + '", "arguments": ')
            alts.append(f"{head} args_{i}")
        elif f["name"] == named:
            alts.append(f"args_{i}")
    body = " | ".join(f"({a})" for a in alts)
    return Grammar("lark", f'start: ({body}) "}}</tool_call>"\n' + "\n".join(rules))
