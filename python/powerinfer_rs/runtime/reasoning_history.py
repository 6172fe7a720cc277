"""Reasoning in past assistant messages, as the chat templates take it back.

A past assistant turn's reasoning travels in the message's ``reasoning_content`` (OpenAI chat
as llama.cpp and DeepSeek write it; the server puts Anthropic ``thinking`` blocks and Responses
``reasoning`` items there too). Templates that read it get it: Qwen3's and GLM-4.6's read
``reasoning_content`` (and show it only for the turns after the last user message, as the
models were trained); gpt-oss's harmony template reads ``thinking`` instead, so there it is
copied to ``thinking``, and a call message's ``content`` is removed (the template takes one or
the other, and refuses both), as llama.cpp's gpt-oss handling does. Templates that read
neither drop it, as they always did.
"""

from __future__ import annotations

from typing import Any

from .reasoning import HARMONY


def past_reasoning(messages: list[Any], template: str | None) -> list[Any]:
    """``messages`` with each assistant's string ``reasoning_content`` where ``template``
    reads it (see the module's docs); messages without it are passed as they are."""
    if HARMONY not in (template or ""):
        return messages
    return [_harmony(m) for m in messages]


def _harmony(m: Any) -> Any:
    if not isinstance(m, dict) or m.get("role") != "assistant":
        return m
    reasoning = m.get("reasoning_content")
    if not isinstance(reasoning, str) or not reasoning or "thinking" in m:
        return m
    out = {k: v for k, v in m.items() if k != "reasoning_content"}
    out["thinking"] = reasoning
    if out.get("tool_calls"):
        out.pop("content", None)
    return out
