"""Tool-call families: how each model family writes a call, chosen from its chat template as
llama.cpp's ``common/chat.cpp`` detects them (the template's own tokens), one file each:

- :mod:`.harmony` gpt-oss (``<|channel|>``), with :mod:`..harmony` for its reasoning;
- :mod:`.kimi` Kimi-K2 (``<|tool_calls_section_begin|>``);
- :mod:`.deepseek` DeepSeek R1 / V3 (a fenced JSON block after the name) and V3.1;
- :mod:`.glm` GLM-4.5/4.6 (``<arg_key>``/``<arg_value>``);
- :mod:`.qwen3_coder` Qwen3-Coder (``<function=`` / ``<parameter=``);
- :mod:`.json_calls` the JSON conventions (Hermes/Qwen ``<tool_call>``, Mistral
  ``[TOOL_CALLS]``, Llama 3), read for every template as a fallback.
"""

from __future__ import annotations

from . import deepseek, glm, harmony, kimi, qwen3_coder
from .base import ToolFormat
from .call import ToolCall, function_specs
from .json_calls import GENERIC, NATIVE_JSON

__all__ = ["ToolCall", "ToolFormat", "function_specs", "format_of", "FAMILIES"]

#: Every family, by name.
FAMILIES: dict[str, ToolFormat] = {
    f.name: f
    for f in (harmony.FORMAT, kimi.FORMAT, deepseek.R1, deepseek.V31, glm.FORMAT,
              qwen3_coder.FORMAT, GENERIC, NATIVE_JSON)
}  # fmt: skip


def format_of(template: str | None, takes_tools: bool = True) -> ToolFormat:
    """The family a chat template writes calls in (its own tokens tell, as llama.cpp's
    detection reads them); ``takes_tools``: whether it renders a ``tools`` variable (the
    generic family forces Hermes calls only where the template uses ``<tool_call>`` or
    renders no tools, so the fallback prompt asks for them)."""
    src = template or ""
    if "<|channel|>" in src:
        return harmony.FORMAT
    if "<|tool_calls_section_begin|>" in src and "<|tool_call_begin|>" in src:
        return kimi.FORMAT
    if deepseek.CALLS_BEGIN in src:
        return deepseek.R1 if "```json" in src else deepseek.V31
    if "<arg_key>" in src and "<arg_value>" in src:
        return glm.FORMAT
    if "<function=" in src and "<parameter=" in src:
        return qwen3_coder.FORMAT
    if takes_tools and "<tool_call>" not in src:
        return NATIVE_JSON
    return GENERIC
