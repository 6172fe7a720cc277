"""The package's version: the installed distribution's, or from a source tree the extension's
own. Its own module, so that what reports it (the CLI's ``--version``, auto-fit's cache key)
need not import the package's ``__init__`` (which imports the engine)."""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("powerinfer-rs")
except _metadata.PackageNotFoundError:
    from ._core import __version__  # noqa: F401 (this module's one name)
