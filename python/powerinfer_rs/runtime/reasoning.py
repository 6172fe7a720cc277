"""Reasoning kept apart from the answer for ``<think>`` models (DeepSeek-R1 distills, Qwen3,
GLM) and gpt-oss (its harmony ``analysis`` channel: :mod:`.harmony`), as llama.cpp's
``--reasoning-format auto`` does.

A model's output is split into ``(reasoning, content)``: the text inside ``<think>…</think>``
is the reasoning, the rest the answer. A *forced-open* template ends the prompt with
``<think>\\n`` (Qwen3 with ``enable_thinking``, DeepSeek-R1's), so the output starts inside the
reasoning and only ``</think>`` appears. :class:`ReasoningSplitter` does the same split
incrementally for streams and never emits part of a tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .harmony import HarmonySplitter

OPEN = "<think>"
#: What marks a harmony (gpt-oss) template.
HARMONY = "<|channel|>"
CLOSE = "</think>"

#: The values ``--reasoning-format`` takes.
FORMATS = ("auto", "none")


def template_thinks(template: str | None) -> bool:
    """Whether a chat template is a thinking one: a ``<think>`` template (its text names the
    tag) or a harmony one (gpt-oss: it names ``<|channel|>``)."""
    return template is not None and (OPEN in template or HARMONY in template)


def splitter_of(template: str | None, prompt: str) -> Splitter:
    """A fresh splitter for an answer to ``prompt`` rendered from a thinking ``template``:
    harmony's, or a ``<think>`` one (opened when the prompt left a block open)."""
    if template is not None and HARMONY in template:
        return HarmonySplitter()
    return ReasoningSplitter(opened=forced_open(prompt))


def forced_open(prompt: str) -> bool:
    """Whether the rendered ``prompt`` ends inside a think block: its last ``<think>`` is not
    closed after it (whitespace after the tag allowed)."""
    at = prompt.rfind(OPEN)
    return at >= 0 and CLOSE not in prompt[at:] and not prompt[at + len(OPEN) :].strip()


def _strip_lead(text: str) -> str:
    return text.lstrip("\n")


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str]:
    """``(reasoning, content)`` of a whole answer. ``opened``: the prompt left a think block
    open (:func:`forced_open`), so the text up to ``</think>`` is reasoning; an answer cut off
    before it is all reasoning. Without it, a leading ``<think>`` (after whitespace) opens the
    block; text with no think block is all content."""
    s = ReasoningSplitter(opened)
    r1, c1 = s.push(text)
    r2, c2 = s.finish()
    return r1 + r2, c1 + c2


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ReasoningSplitter:
    """Routes streamed text to reasoning or content. :meth:`push` returns the
    ``(reasoning, content)`` deltas that can be shown now; a possible partial tag
    (``</thi``) is held back until the next text resolves it. States: ``start`` (before any
    text: a ``<think>`` may open, whitespace is held), ``think`` (inside), ``content``."""

    opened: bool = False

    def __post_init__(self) -> None:
        self.state = "think" if self.opened else "start"
        self.buf = ""
        self.lead = True  # the newline right after a tag is not shown

    def fresh(self) -> ReasoningSplitter:
        """A new splitter of the same kind (for a whole answer)."""
        return ReasoningSplitter(self.opened)

    def push(self, text: str) -> tuple[str, str]:
        """Take ``text``; return the reasoning and content deltas now certain."""
        self.buf += text
        reasoning, content = "", ""
        while True:
            if self.state == "start":
                if not self._start():
                    break
            elif self.state == "think":
                out, more = self._think()
                reasoning += out
                if not more:
                    break
            else:
                content += self._content()
                break
        return reasoning, content

    def _start(self) -> bool:
        """Before the answer: a ``<think>`` opens the block; anything else is content.
        Returns whether to go on (False: waiting for more text)."""
        head = self.buf.lstrip()
        if head.startswith(OPEN):
            self.buf = head[len(OPEN) :]
            self.state = "think"
            return True
        if OPEN.startswith(head):  # empty, whitespace or a partial tag: wait
            return False
        self.state, self.lead = "content", False
        return True

    def _think(self) -> tuple[str, bool]:
        """Inside the block: the reasoning shown now and whether the block closed."""
        if self.lead:
            self.buf = _strip_lead(self.buf)
            if not self.buf:
                return "", False
            self.lead = False
        at = self.buf.find(CLOSE)
        if at >= 0:
            out, self.buf = self.buf[:at], self.buf[at + len(CLOSE) :]
            self.state, self.lead = "content", True
            return out.rstrip("\n"), True
        out = self.buf[: len(self.buf) - _partial_suffix(self.buf, CLOSE)]
        out = out.rstrip("\n")  # newlines before the tag are not reasoning: held
        self.buf = self.buf[len(out) :]
        return out, False

    def _content(self) -> str:
        """After the block: everything, but the newlines right after ``</think>``."""
        out, self.buf = self.buf, ""
        if self.lead:
            out = _strip_lead(out)
            self.lead = not out
        return out

    def finish(self) -> tuple[str, str]:
        """The answer's end: what was held back, as reasoning (an unclosed block, its trailing
        newlines dropped) or content."""
        rest, self.buf = self.buf, ""
        if self.state == "think":
            if rest.startswith(CLOSE[: len(rest)]) and rest:  # a cut-off closing tag
                return "", ""
            return rest.rstrip("\n"), ""
        return "", rest


#: Either splitter: both have ``push``, ``finish`` and ``fresh``.
Splitter = Union[ReasoningSplitter, HarmonySplitter]


class ChatReply(str):
    """What :meth:`~.engine.Engine.chat` returns: the answer (the string itself, the
    reasoning left out) with the ``reasoning`` apart (``""`` when the model did not think or
    the template is not a ``<think>`` one), so callers that take a string keep working."""

    reasoning: str

    def __new__(cls, content: str, reasoning: str = "") -> ChatReply:
        out = super().__new__(cls, content)
        out.reasoning = reasoning
        return out

    @property
    def content(self) -> str:
        """The answer as a plain string."""
        return str(self)


def reply_of(template: str | None, prompt: str, text: str, fmt: str = "auto") -> ChatReply:
    """The :class:`ChatReply` of ``text`` generated after ``prompt`` (rendered from
    ``template``): split when ``fmt`` is ``auto`` and the template thinks."""
    if fmt == "none" or not template_thinks(template):
        return ChatReply(text)
    s = splitter_of(template, prompt)
    r1, c1 = s.push(text)
    r2, c2 = s.finish()
    return ChatReply(c1 + c2, r1 + r2)


def reasoning_start(template: str | None, prompt: str, fmt: str = "auto") -> str | None:
    """Where a constraint on the answer to ``prompt`` (rendered from ``template``) starts
    (``stream_tokens(reasoning=...)``): "harmony" for a harmony template (the grammar opens
    the final channel after any analysis, whatever ``fmt``: it is the model's format, not the
    split; :mod:`.harmony_constraint`), "open" when the prompt left a think block open,
    "allowed" when the template thinks (the model may open one), None when the answer is not
    split (``fmt`` none, or no ``<think>`` template): from the first token."""
    if template is not None and HARMONY in template:
        return "harmony"
    if fmt == "none" or template is None or OPEN not in template:
        return None
    return "open" if forced_open(prompt) else "allowed"
