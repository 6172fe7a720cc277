"""Reasoning in the server's answers (:mod:`..runtime.reasoning`): whether a request's answer
is split, and the split as OpenAI's ``reasoning_content`` (llama.cpp's and DeepSeek's field)."""

from __future__ import annotations

from typing import Any

from ..runtime.reasoning import CLOSE, FORMATS, Splitter, forced_open, splitter_of, template_thinks
from .errors import APIError

#: Template variables the server sets itself: ``chat_template_kwargs`` may not name them.
RESERVED = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")


def check_format(fmt: str) -> str:
    """``--reasoning-format``: ``auto`` (split for a ``<think>`` or harmony template) or
    ``none``."""
    if fmt not in FORMATS:
        raise ValueError(f"reasoning format must be one of {FORMATS}, got {fmt!r}")
    return fmt


def splitter_for(template: str | None, prompt: str, fmt: str) -> Splitter | None:
    """The splitter of an answer to ``prompt`` (rendered from ``template``), or None when
    the answer stays whole: ``fmt`` ``none``, or a template that does not think."""
    if fmt == "none" or not isinstance(prompt, str) or not template_thinks(template):
        return None
    return splitter_of(template, prompt)


def split_piece(
    think: Splitter | None, calls: Any, text: str, end: bool = False
) -> tuple[str, str]:
    """``(reasoning, text)`` of a streamed piece of the answer: split by ``think`` (``end``:
    the last piece, the splitter flushed), then the text held back by ``calls``' stream
    (:class:`~.responses.Calls`, or None) where it may start a tool call."""
    reasoning = ""
    if think is not None:
        reasoning, text = think.push(text)
        if end:
            r, c = think.finish()
            reasoning, text = reasoning + r, text + c
    if calls is not None and text:
        text = calls.stream.push(text)
    return reasoning, text


def with_call(prompt: str, prefix: str) -> str:
    """``prompt`` followed by a forced call's ``prefix``; a think block the prompt left open
    (DeepSeek-R1's ``<think>\n``) is closed first: the call is the answer, not reasoning."""
    if prefix and forced_open(prompt):
        prompt += CLOSE + "\n\n"
    return prompt + prefix


def template_kwargs(req: Any, budget: int = -1) -> dict[str, Any]:
    """What a chat request passes to the template: its ``chat_template_kwargs``, and
    ``reasoning_effort`` (gpt-oss templates read it; others ignore it). ``budget`` 0
    (``--reasoning-budget 0``) renders with ``enable_thinking`` false unless the request
    says. A request's kwargs naming a variable the server sets (:data:`RESERVED`) is a 400."""
    out: dict[str, Any] = {}
    if budget == 0:
        out["enable_thinking"] = False
    given = getattr(req, "chat_template_kwargs", None) or {}
    taken = sorted(set(given) & set(RESERVED))
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {taken}: the server sets them",
                       param="chat_template_kwargs")  # fmt: skip
    out.update(given)
    effort = getattr(req, "reasoning_effort", None)
    if effort is not None:
        out["reasoning_effort"] = effort
    return out
