"""Turning a growing list of token ids into text pieces as they become final, and stopping on
stop strings without ever printing part of one; the per-token stream (:class:`TokenStream`)."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable


class IncrementalDecoder:
    """Emits the new text each added token completes.

    Byte-level tokenizers can split one character over several tokens; a piece is held back
    while the decoded text ends in an incomplete character (U+FFFD), and only a short window of
    recent tokens is re-decoded each step, so the cost per token stays constant.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # ids before this index are emitted and out of the window
        self._read = 0  # ids before this index produced text already emitted

    def add(self, token_id: int) -> str:
        """Add one token; return the text that is now final (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        full_text = self._decode(self._ids[self._prefix :])
        if full_text.endswith("\ufffd") or len(full_text) <= len(prefix_text):
            return ""
        piece = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        return piece


class StopMatcher:
    """Holds back text that may be the start of a stop string; reports when one appears."""

    def __init__(self, stops: Sequence[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        #: The stop string that ended the text (the earliest in it), once ``stopped``.
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Add text; return what is safe to show. Sets ``stopped`` when a stop string is seen
        (the text before it is returned, the stop string and anything after are dropped)."""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [(i, s) for i, s in ((buf.find(s), s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            at, self.matched = min(hits, key=lambda h: h[0])
            return buf[:at]
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """Text still held back when generation ends without a stop."""
        out, self._held = self._held, ""
        return out


@dataclass
class TokenStep:
    """One sampled token of :meth:`~.engine.Engine.stream_tokens`.

    ``text`` is the text this token made final: it may be empty (part of a character, or text
    held back while it may begin a stop string) and may carry text of earlier tokens. The last
    step of a stream may have ``token=None``: held-back text released at the end.
    ``logprob``/``top_logprobs`` are set when log-probabilities were asked for: log p of the
    token and the likeliest ``(id, log p)`` pairs, under the model's raw distribution.
    """

    token: int | None
    text: str
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


class TokenStream(Iterator[TokenStep]):
    """The iterator :meth:`~.engine.Engine.stream_tokens` returns: :class:`TokenStep` items,
    and ``stats`` (this call's :class:`~.generation.GenerationStats`; ``finish_reason`` is set
    when the stream ends). ``close()`` stops the generation before its next forward pass;
    ``cancel()``, from any thread, also stops a step that is running a long prompt's prefill in
    chunks (a slot's, :mod:`.slots`) at its next chunk (the step then raises
    :class:`GenerationCancelled`)."""

    def __init__(
        self,
        steps: Generator[TokenStep, None, None],
        stats: Any,
        on_cancel: Callable[[], None] | None = None,
    ):
        self._steps = steps
        self.stats = stats
        #: Called by :meth:`cancel` (None: nothing to stop between forward passes).
        self.on_cancel = on_cancel

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> TokenStep:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def cancel(self) -> None:
        """Ask the generation to stop (thread-safe); :meth:`close` it afterwards."""
        if self.on_cancel is not None:
            self.on_cancel()


class GenerationCancelled(Exception):
    """A step stopped inside its prefill because its stream was cancelled."""
