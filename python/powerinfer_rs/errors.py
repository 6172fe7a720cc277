"""The one exception hierarchy of powerinfer-rs.

Every error the package raises on bad input is a :class:`PowerInferError`. The Rust extension
raises these same classes (it looks them up here), so ``except PowerInferError`` catches both
sides. Subclasses also derive from the matching built-in (``ValueError``, ``OSError``, ...) so
generic handlers keep working.
"""

from __future__ import annotations


class PowerInferError(Exception):
    """Base class of every powerinfer-rs error."""


class ModelFileError(PowerInferError, ValueError):
    """A model file or directory is missing, truncated or malformed."""


class UnsupportedError(PowerInferError, ValueError):
    """An architecture, weight format or feature the engine does not implement."""


class ShapeError(PowerInferError, ValueError):
    """Tensor shapes or config values do not fit together."""


class TokenError(PowerInferError, ValueError):
    """A token id outside the vocabulary."""


class ContextOverflowError(PowerInferError, ValueError):
    """More tokens than the context window holds."""


class PlanError(PowerInferError, ValueError):
    """A plan or neuron table made for another model, or inconsistent with it."""


class VramBudgetError(PowerInferError, MemoryError):
    """A placement that does not fit the VRAM budget."""


class CudaError(PowerInferError, RuntimeError):
    """A CUDA driver, NVRTC or kernel launch error, or no GPU where one was asked for."""


class InternalError(PowerInferError, RuntimeError):
    """A bug: something the engine should never do. Please report it."""


__all__ = [
    "PowerInferError",
    "ModelFileError",
    "UnsupportedError",
    "ShapeError",
    "TokenError",
    "ContextOverflowError",
    "PlanError",
    "VramBudgetError",
    "CudaError",
    "InternalError",
]
