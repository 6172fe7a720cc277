"""A chat template given in place of the model's (llama.cpp's ``--chat-template-file``): for a
file whose template is broken, missing or not the one wanted. Read and compiled when the engine
is made, so a bad template fails at startup, not at the first request; the reasoning and
tool-call parsers then follow the template given, as they follow the model's."""

from __future__ import annotations

import dataclasses
import os

from ..errors import ModelFileError
from ..loading import LoadedModel
from .chat import compile_template


def read_chat_template(path: str | os.PathLike[str]) -> str:
    """The Jinja template in the file ``path`` (UTF-8), checked to compile.
    :class:`ModelFileError` naming the file when it cannot be read, is not UTF-8, is empty or
    does not compile."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise ModelFileError(
            f"chat template file {os.fspath(path)!r} is not UTF-8 text: {e}"
        ) from e
    except OSError as e:
        raise ModelFileError(
            f"chat template file {os.fspath(path)!r} cannot be read: {e.strerror or e}"
        ) from e
    return _checked(text, f"chat template file {os.fspath(path)!r}")


def with_chat_template(loaded: LoadedModel, template: str) -> LoadedModel:
    """``loaded`` with ``template`` (Jinja text) as its chat template; the weights and
    tokenizer are shared, not copied. :class:`ModelFileError` for a template that is not a
    non-empty string or does not compile."""
    if not isinstance(template, str):
        raise ModelFileError(
            "chat_template must be the template's Jinja text (a str), got "
            f"{type(template).__name__}"
        )
    return dataclasses.replace(loaded, chat_template=_checked(template, "chat_template"))


def _checked(text: str, what: str) -> str:
    if not text.strip():
        raise ModelFileError(f"{what} is empty")
    try:
        compile_template(text)
    except ModelFileError as e:
        raise ModelFileError(f"{what} does not compile: {e.__cause__ or e}") from e
    return text
