"""Limit BLAS threads around small matrix products.

Predictor training multiplies small matrices thousands of times; OpenBLAS splitting each one
over all cores costs more in synchronisation than it saves (30x slower on a busy 2-core
machine). :func:`blas_threads` caps the thread count for a block: through ``threadpoolctl``
when it is installed, else through the ``*_set_num_threads`` entry point of the OpenBLAS that
numpy loaded (found in ``/proc/self/maps``); anywhere that fails it does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_GETTERS = tuple(s.replace("set_", "get_") for s in _SETTERS)
_lib: tuple[object, object] | None | bool = None


def _openblas() -> tuple[object, object] | None:
    global _lib
    if _lib is None:
        _lib = False
        try:
            import numpy  # noqa: F401  (make sure numpy's BLAS is loaded)

            with open("/proc/self/maps") as f:
                paths = {ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln}
            for path in sorted(paths):
                lib = ctypes.CDLL(path)
                for s, g in zip(_SETTERS, _GETTERS):
                    if hasattr(lib, s) and hasattr(lib, g):
                        _lib = (getattr(lib, s), getattr(lib, g))
                        break
                if _lib:
                    break
        except (OSError, ValueError):
            _lib = False
    return _lib or None


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the block with at most ``n`` BLAS threads (best effort)."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-not-found]
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=n, user_api="blas"):
            yield
        return
    lib = _openblas()
    if lib is None:
        yield
        return
    setter, getter = lib
    try:
        old = int(getter())  # type: ignore[operator]
        setter(ctypes.c_int(n))  # type: ignore[operator]
    except (OSError, ValueError, ctypes.ArgumentError):
        yield
        return
    try:
        yield
    finally:
        setter(ctypes.c_int(old))  # type: ignore[operator]
