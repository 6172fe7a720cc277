"""powerinfer-rs: fast local LLM inference exploiting activation locality (after PowerInfer).

A Rust core (the ``_core`` extension) runs the model; this package loads models (GGUF files and
Hugging Face directories), tokenizes, samples and drives generation::

    from powerinfer_rs import Engine
    engine = Engine.from_pretrained()          # the default model, fetched once into a cache
    print(engine.generate("The capital of France is", max_new_tokens=16, temperature=0))
"""

from __future__ import annotations

from . import errors
from ._version import __version__
from .errors import *  # noqa: F403 (the exception classes: errors.__all__)
from .runtime.engine import Engine, GenerationStats
from .runtime.slots import SlotPool

__all__ = ["Engine", "GenerationStats", "SlotPool", *errors.__all__, "__version__"]
