"""gpt-oss's harmony output split into reasoning, answer and calls, as llama.cpp's gpt-oss
handler does: after the generation prompt (``<|start|>assistant``) the model writes messages
``[<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ <|constrain|>json]<|message|>TEXT``
ended by ``<|end|>``, ``<|call|>`` or ``<|return|>`` (or by the end of the answer: those that
end generation are not in the text). The ``analysis`` channel is the reasoning; ``final``
(and a ``commentary`` without a recipient, a preamble to the user) is the answer; a message to
``functions.NAME`` is a call, passed on whole in the answer as the template writes one
(:func:`~.tool_formats.harmony.call_text`) for the tool-call parser to read.

:class:`HarmonySplitter` has :class:`~.reasoning.ReasoningSplitter`'s interface, so the
server's streams and :func:`~.reasoning.reply_of` use it the same way; each push looks only at
the text since the last one (and a few held characters), so it is cheap per token."""

from __future__ import annotations

import re

from .tool_formats.call import partial_suffix
from .tool_formats.harmony import ENDS, MESSAGE, call_text

_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_LONGEST_END = max(len(e) for e in ENDS)
#: A header longer than this (no ``<|message|>`` yet) is not one: the text is plain.
LONGEST_HEADER = 256


def _may_be_header(head: str) -> bool:
    """Whether the text after a message (whitespace dropped) can still be a header."""
    return any(head.startswith(p) or p.startswith(head) for p in ("<|", "to="))


class HarmonySplitter:
    """Routes streamed harmony text to reasoning or content (calls go to the content whole,
    once ended). States: ``header`` (before a ``<|message|>``), ``body`` (inside a message of
    ``kind`` reasoning, content or call) and ``plain`` (text that is not harmony: all
    content)."""

    opened = False  # as ReasoningSplitter's: a harmony answer never starts inside a block

    def __init__(self) -> None:
        self.state = "header"
        self.buf = ""
        self.kind = "content"
        self.recipient = ""
        self.scanned = 0  # how much of a held call body has been searched for its end

    def fresh(self) -> HarmonySplitter:
        """A new splitter of the same kind (for a whole answer)."""
        return HarmonySplitter()

    def push(self, text: str) -> tuple[str, str]:
        """Take ``text``; return the reasoning and content deltas now certain."""
        self.buf += text
        out = {"reasoning": [], "content": []}
        while self._step(out):
            pass
        return "".join(out["reasoning"]), "".join(out["content"])

    def _step(self, out: dict[str, list[str]]) -> bool:
        """One move of the state machine; whether to go on."""
        if self.state == "plain":
            out["content"].append(self.buf)
            self.buf = ""
            return False
        if self.state == "header":
            at = self.buf.find(MESSAGE)
            if at < 0:
                head = self.buf.lstrip()
                if head and (not _may_be_header(head) or len(head) > LONGEST_HEADER):
                    self.state = "plain"
                    return True
                return False
            self._open(self.buf[:at])
            self.buf = self.buf[at + len(MESSAGE) :]
            return True
        return self._body(out)

    def _open(self, header: str) -> None:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self.recipient = recipient.group(1) if recipient else ""
        if self.recipient:
            self.kind = "call"
        elif channel is not None and channel.group(1) == "analysis":
            self.kind = "reasoning"
        else:
            self.kind = "content"
        self.state, self.scanned = "body", 0

    def _body(self, out: dict[str, list[str]]) -> bool:
        start = max(0, self.scanned - _LONGEST_END)
        ends = [(at, e) for e in ENDS if (at := self.buf.find(e, start)) >= 0]
        if not ends:
            if self.kind == "call":  # held whole until it ends
                self.scanned = len(self.buf)
                return False
            n = len(self.buf) - partial_suffix(self.buf, ENDS)
            out[self.kind].append(self.buf[:n])
            self.buf = self.buf[n:]
            return False
        at, end = min(ends)
        body, self.buf = self.buf[:at], self.buf[at + len(end) :]
        if self.kind == "call":
            out["content"].append(call_text(self.recipient, body))
        else:
            out[self.kind].append(body)
        self.state = "header"
        return True

    def finish(self) -> tuple[str, str]:
        """The answer's end: the held text of an unended message (a call cut off is passed on
        without its end); an unfinished header is dropped."""
        rest, self.buf = self.buf, ""
        if self.state == "plain" or (self.state == "header" and not _may_be_header(rest.lstrip())):
            return "", rest
        if self.state == "header":
            return "", ""
        if self.kind == "call":
            return "", call_text(self.recipient, rest, ended=False)
        return (rest, "") if self.kind == "reasoning" else ("", rest)
