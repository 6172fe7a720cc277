"""Constrained output that starts after the reasoning, as llama.cpp's: a thinking model asked
for JSON (``json_schema``, ``response_format``, ``grammar``, ``regex``) thinks freely inside
``<think>…</think>`` and the grammar binds the answer after ``</think>``. Without this the
grammar would bind the first token and forbid the reasoning the model was trained to write.

:class:`AfterReasoning` wraps a :class:`~.constrain.Constraint` with the same methods. Where the
prompt left a think block open (:func:`~.reasoning.forced_open`, ``"open"``) the output is free
until ``</think>``; where the template thinks but the prompt did not open a block
(``"allowed"``), the first token is the grammar's or the ``<think>`` token (when the vocabulary
has one, as Qwen3's, DeepSeek-R1's and GLM's do), which opens a free block. Text the token that
ends the block carries after ``</think>`` goes to the grammar (whitespace dropped, as the
reasoning split drops it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .constrain import Constraint, GrammarError
from .reasoning import CLOSE, OPEN

#: The values of ``stream_tokens(reasoning=...)``.
REASONING_STARTS = ("open", "allowed")
#: Tokens looked back at for ``</think>`` (each token is at least one character).
_WINDOW = len(CLOSE)


class AfterReasoning:
    """``inner`` applied after the output's think block (see the module)."""

    def __init__(self, inner: Constraint, tokenizer: Any, start: str):
        if start not in REASONING_STARTS:
            raise GrammarError(f"reasoning must be one of {REASONING_STARTS}, got {start!r}")
        self.inner, self.tokenizer = inner, tokenizer
        opener = tokenizer.token_to_id(OPEN)
        #: The tokens that open a think block at the first step ("allowed").
        self.open_ids = [] if opener is None else [opener]
        #: "start" (the first token decides), "thinking" (free) or "bound" (the grammar's).
        self.state = "thinking" if start == "open" else "start" if self.open_ids else "bound"
        self._ids: list[int] = []  # the think block's tokens so far

    @property
    def done(self) -> bool:
        """The grammar is complete (never inside the reasoning)."""
        return self.state == "bound" and self.inner.done

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with what may come next: all of them inside the reasoning; at the first
        step the grammar's tokens and the ``<think>`` token; after, the grammar's."""
        if self.state == "thinking":
            return logits
        out = self.inner.mask(logits)
        if self.state == "start":
            out[self.open_ids] = np.asarray(logits, dtype=np.float32)[self.open_ids]
        return out

    def consume(self, token: int) -> None:
        """Advance past ``token``; the grammar consumes it once the reasoning is over."""
        if self.state == "bound":
            self.inner.consume(token)
        elif self.state == "start":
            if token in self.open_ids:
                self.state = "thinking"
            else:
                self.state = "bound"
                self.inner.consume(token)
        else:
            self._ids.append(token)
            rest = self._after_close(self._ids)
            if rest is not None:
                self.state = "bound"
                self._ids = []
                self._bind(rest)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` (a speculative draft) may follow: inside the reasoning, up to
        the token that closes it (the grammar has not seen what comes after)."""
        if self.state == "bound":
            return self.inner.valid_prefix(tokens)
        if self.state == "start":
            return 0
        ids = list(self._ids)
        for i, t in enumerate(tokens):
            ids.append(int(t))
            if self._after_close(ids) is not None:
                return i + 1
        return len(tokens)

    def _after_close(self, ids: list[int]) -> str | None:
        """The text after ``</think>`` when the last token completed the tag, else None."""
        tail = self.tokenizer.decode(ids[-_WINDOW:])
        at = tail.rfind(CLOSE)
        if at < 0:
            return None
        return tail[at + len(CLOSE) :]

    def _bind(self, rest: str) -> None:
        """Give the grammar the text the closing token carried after the tag."""
        rest = rest.lstrip()
        if not rest:
            return
        for t in self.tokenizer.encode(rest, add_bos=False, special=False):
            self.inner.consume(t)  # a GrammarError when the grammar refuses it
