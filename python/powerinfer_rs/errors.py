"""The one exception hierarchy of powerinfer-rs.

The classes are declared once, in the Rust extension (``crates/py/src/exceptions.rs``), and
re-exported here: every error the package raises on bad input, from Python or from Rust, is a
:class:`PowerInferError`. Each subclass also derives from the matching built-in (``ValueError``,
``MemoryError``, ``RuntimeError``) so generic handlers keep working.

* :class:`ModelFileError` - a model file or directory is missing, truncated or malformed;
* :class:`UnsupportedError` - an architecture, format or feature the engine does not implement;
* :class:`ShapeError` - shapes, sizes or config values that do not fit together;
* :class:`TokenError` - a token id outside the vocabulary, or text no tokenizer can take (a
  string holding a lone surrogate such as ``"\\ud800"``, named by argument);
* :class:`ContextOverflowError` - more tokens than the context holds;
* :class:`PlanError` - a plan, threshold or predictor file made for another model;
* :class:`VramBudgetError` - a placement that does not fit the VRAM budget;
* :class:`HubError` - a model asked for by hub id (``org/repo[:QUANT]``) that cannot be had:
  a missing or gated repo, no file (or two) for the tag, offline without a cached copy;
* :class:`CudaError` - a CUDA driver, NVRTC or launch error, or no GPU where one was asked for;
* :class:`InternalError` - a bug (a caught Rust panic included).
"""

from __future__ import annotations

from ._core import (
    ContextOverflowError,
    CudaError,
    HubError,
    InternalError,
    ModelFileError,
    PlanError,
    PowerInferError,
    ShapeError,
    TokenError,
    UnsupportedError,
    VramBudgetError,
)

__all__ = [
    "PowerInferError",
    "ModelFileError",
    "UnsupportedError",
    "ShapeError",
    "TokenError",
    "ContextOverflowError",
    "PlanError",
    "VramBudgetError",
    "HubError",
    "CudaError",
    "InternalError",
]
