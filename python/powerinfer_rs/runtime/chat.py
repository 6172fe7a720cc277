"""Chat prompts: render a model's Jinja chat template the way HF ``apply_chat_template`` does.

Templates run in a sandboxed Jinja environment with ``trim_blocks`` and ``lstrip_blocks`` on,
the ``raise_exception`` and ``strftime_now`` helpers and a ``tojson`` filter that keeps
non-ASCII text, as in ``transformers``. A model without a template gets ChatML.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import ModelFileError, PowerInferError
from .tokenizer import unencodable

#: ChatML, used when a model ships no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(PowerInferError, ValueError):
    """The messages do not fit the template (the template called ``raise_exception``), they
    are not a list of ``{"role": str, "content": str}`` mappings, they or the template's other
    arguments hold a string that is not text (a lone surrogate), or their tool calls and
    results do not add up (:func:`~.tools.check_tool_history`). ``param`` names the argument
    at fault when known (``messages[2].tool_call_id``)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def check_text_args(value: Any, where: str) -> None:
    """Refuse (:class:`ChatTemplateError` naming the place) a string in ``value`` (nested dicts
    and lists) that is not text: a lone surrogate, which the tokenizer cannot take."""
    problem = unencodable(value, where)
    if problem is not None:
        path = problem.rsplit(" holds the lone surrogate", 1)[0].removesuffix(" (a key)")
        raise ChatTemplateError(problem, param=path)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """``template`` compiled in the sandbox (cached); :class:`ModelFileError` when it does not
    compile (the Jinja error its cause)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ModelFileError(f"the model's chat template does not compile: {e}") from e


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i} is not a mapping")
        if not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"message {i} has no string 'role'")
        if "content" in m and not isinstance(m["content"], (str, list, type(None))):
            raise ChatTemplateError(f"message {i}: 'content' must be a string")
        check_text_args(m, f"messages[{i}]")
        out.append(dict(m))
    return out


def format_chat(
    template: str | None,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """Render ``messages`` with ``template`` (ChatML when ``None``) into the prompt text.

    ``extra`` keyword arguments are passed to the template (e.g. ``tools``). Raises
    :class:`ModelFileError` for a template that does not compile and
    :class:`ChatTemplateError` when the template rejects the conversation.
    """
    msgs = _check_messages(messages)
    for name, value in extra.items():
        check_text_args(value, name)
    tpl = compile_template(template if template is not None else CHATML_TEMPLATE)
    try:
        return tpl.render(
            messages=msgs,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except PowerInferError:
        raise
    except jinja2.TemplateError as e:
        raise ModelFileError(f"the model's chat template failed: {e}") from e
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise ChatTemplateError(f"the chat template could not render these messages: {e}") from e


def fit_conversation(
    messages: list[dict[str, Any]], fits: Callable[[list[dict[str, Any]]], bool]
) -> tuple[list[dict[str, Any]], int]:
    """Drop the oldest turns of ``messages`` until ``fits(messages)``: a leading system message
    and the last message are kept; a turn is a message and the assistant replies after it.
    Returns ``(messages, turns dropped)``; the result may still not fit (only the system and
    last messages left)."""
    msgs = list(messages)
    first = 1 if msgs and msgs[0].get("role") == "system" else 0
    dropped = 0
    while not fits(msgs) and len(msgs) - first > 1:
        del msgs[first]
        while len(msgs) - first > 1 and msgs[first].get("role") == "assistant":
            del msgs[first]
        dropped += 1
    return msgs, dropped
