"""Deferred imports. Packages whose names load on first use (PEP 562), so that importing a package
does not import every module in it (the file-format modules and the libraries that use them can
then import each other's pieces without cycles), and the optional dependencies of the
``powerinfer-rs[plan]`` extra (highspy, matplotlib) and of the ``server`` extra, imported only
where they are needed."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from .errors import UnsupportedError

#: What installs the optional dependencies.
PLAN_EXTRA = "pip install 'powerinfer-rs[plan]'"


def lazy_exports(
    package: str, exports: dict[str, list[str]]
) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``: each name in ``exports[module]`` is read
    from ``package.module`` when first asked for, then kept in the package."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return sorted(where), __getattr__


def optional_import(name: str, purpose: str, extra: str = PLAN_EXTRA) -> Any:
    """Import module ``name`` of an optional dependency, or raise :class:`UnsupportedError`
    saying ``purpose`` needs it and how to install it (``extra``)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        top = name.split(".")[0]
        raise UnsupportedError(f"{purpose} needs {top} ({e}): {extra}") from None
