"""The check every reader of a file a user names makes first: the path can be encoded for the
file system (a lone surrogate such as ``"\\ud800"`` cannot) and names a regular file, not a
FIFO (opening one for reading waits for a writer, forever when none comes), a device or a
socket. The engine's Rust readers make the same check (``powerinfer_core::files``)."""

from __future__ import annotations

import os
import stat

from ..errors import ModelFileError, PowerInferError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISDIR, "a directory"),
)


def regular_file(
    path: str | os.PathLike[str], error: type[PowerInferError] = ModelFileError
) -> str:
    """``os.fspath(path)`` after checking it: ``error`` (a ModelFileError unless the caller's
    file kind has its own class) for a path the file system cannot encode or for something
    other than a regular file (after following links). A path that does not exist or cannot be
    stat'ed is returned as it is: the caller's open says so in its own words."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except (UnicodeEncodeError, ValueError) as e:  # a lone surrogate; a NUL byte
        raise error(f"{p!r}: the path cannot be encoded for the file system ({e})") from None
    except OSError:
        return p
    for test, what in _KINDS:
        if test(st.st_mode):
            raise error(f"{p}: not a regular file ({what})")
    return p
