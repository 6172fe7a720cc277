"""Argument checks of the public :class:`~.engine.Engine` functions: each raises a typed error
naming the argument (:class:`ShapeError` for a number of the wrong type or range) instead of
the ``TypeError``/``ValueError`` numpy or the Rust bindings would raise further down."""

from __future__ import annotations

import math
import operator
import os
import warnings

from ..errors import ShapeError

#: ``threads`` above this many times the usable cores is capped to the cores (with a warning).
THREADS_CAP_FACTOR = 4


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int (bools and floats refused), at least ``minimum`` when given."""
    if isinstance(value, bool):
        raise ShapeError(f"{name} must be an integer, got {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ShapeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None
    if minimum is not None and n < minimum:
        raise ShapeError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_real(name: str, value: object) -> float:
    """``value`` as a finite float (ints, floats and numpy scalars; not bools or strings)."""
    if isinstance(value, (bool, str, bytes)):
        raise ShapeError(f"{name} must be a number, got {value!r}")
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ShapeError(f"{name} must be a number, got {type(value).__name__} {value!r}") from None
    if not math.isfinite(x):
        raise ShapeError(f"{name} must be finite, got {x}")
    return x


def check_seed(seed: object) -> int | None:
    """None or a non-negative int (what numpy's ``default_rng`` takes)."""
    if seed is None:
        return None
    return check_int("seed", seed, 0)


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: object) -> int:
    """``threads`` >= 0 (0 = one per core); more than :data:`THREADS_CAP_FACTOR` times the
    usable cores is capped to the cores with a ``RuntimeWarning`` (a pool of thousands of
    threads only slows decoding down, or fails to start)."""
    n = check_int("threads", threads)
    if n < 0:
        raise ShapeError(f"threads must be >= 0 (0 = one per core), got {n}")
    cores = usable_cores()
    if n > THREADS_CAP_FACTOR * cores:
        warnings.warn(
            f"threads={n} is far above the {cores} usable cores; using {cores}",
            RuntimeWarning,
            stacklevel=3,
        )
        n = cores
    return n
