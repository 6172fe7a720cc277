"""Constrained output for gpt-oss's harmony format, as llama.cpp's gpt-oss handling builds it
(``common/chat-parsers/gpt-oss``'s response-format rule): after the generation prompt
(``<|start|>assistant``) the model may reason in ``analysis`` messages, freely, each closed
by ``<|end|><|start|>assistant``; then the grammar opens the ``final`` channel (optionally
with a ``<|constrain|>TYPE`` as harmony writes structured output) and the answer follows the
JSON schema::

    <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>{…}

``stream_tokens(reasoning="harmony")`` applies it to a ``json_schema`` constraint (other
kinds bind from the first token, as before); :func:`~.reasoning.reasoning_start` asks for it
where the template is a harmony one. The special tokens are named as tokens (llguidance's
``<|…|>`` references), so the vocabulary must have them (gpt-oss's has). A forced tool call
is started in its commentary header by the prompt instead (:mod:`.tool_formats.harmony`).
"""

from __future__ import annotations

import json

from .constrain import Grammar, GrammarError, compact
from .schema_check import finite_problem

#: The value of ``stream_tokens(reasoning=...)`` that asks for it.
HARMONY_START = "harmony"

_RULES = """start: analysis* final
analysis: <|channel|> "analysis" <|message|> THOUGHT <|end|> <|start|> "assistant"
THOUGHT: /(?s:.*)/
final: <|channel|> "final" constraint? <|message|> answer
constraint: " " <|constrain|>? /[A-Za-z0-9_-]+/
"""


def in_final_channel(grammar: Grammar) -> Grammar:
    """``grammar`` (a ``json_schema`` one; others are returned as they are) as the Lark
    grammar of the module's docs; a schema with no finite instance is the
    :class:`~.constrain.GrammarError` :meth:`~.constrain.Grammar.compile` gives."""
    if grammar.kind != "json_schema":
        return grammar
    schema = {"type": "object"} if grammar.value is True else grammar.value
    problem = finite_problem(schema, grammar.argument)
    if problem is not None:
        raise GrammarError(problem)
    return Grammar("lark", _RULES + f"answer: %json {json.dumps(compact(schema))}\n")
