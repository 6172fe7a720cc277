"""Turning a growing list of token ids into text pieces as they become final, and stopping on
stop strings without ever printing part of one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable


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

    def push(self, text: str) -> str:
        """Add text; return what is safe to show. Sets ``stopped`` when a stop string is seen
        (the text before it is returned, the stop string and anything after are dropped)."""
        if not self._stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[: min(hits)]
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
