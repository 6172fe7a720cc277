"""The server's API keys: read from ``--api-key`` (repeatable, or a comma list) and
``--api-key-file`` (one key a line, ``#`` comments), and checked in constant time
(:func:`hmac.compare_digest`) against every listed key."""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from pathlib import Path


class APIKeyFileError(ValueError):
    """An ``--api-key-file`` that is missing, unreadable or lists no key."""


def split_keys(values: Iterable[str | None]) -> list[str]:
    """The keys in ``values`` (each one key or a comma list), blanks dropped, in order."""
    keys: list[str] = []
    for value in values:
        if value is None:
            continue
        keys += [k.strip() for k in value.split(",") if k.strip()]
    return keys


def read_key_file(path: str | Path) -> list[str]:
    """The keys in ``path``: one a line, blank lines and ``#`` comments skipped; a file that
    cannot be read or lists no key is an :class:`APIKeyFileError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise APIKeyFileError(f"--api-key-file {path}: cannot read it ({e})") from None
    keys = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    keys = [k for k in keys if k]
    if not keys:
        raise APIKeyFileError(f"--api-key-file {path}: lists no key")
    return keys


def normalise_keys(api_key: str | Sequence[str] | None) -> tuple[str, ...]:
    """``create_app``'s ``api_key`` (one key, a comma list, a list of keys or None) as the
    tuple of keys (empty: no key is asked for)."""
    if api_key is None:
        return ()
    values = [api_key] if isinstance(api_key, str) else list(api_key)
    return tuple(split_keys(values))


def key_matches(given: str | None, keys: Sequence[str]) -> bool:
    """Whether ``given`` is one of ``keys``; every key is compared (in constant time), so the
    time taken does not tell which one, or how much of one, matched."""
    if given is None:
        return False
    raw = given.encode("utf-8", "surrogateescape")
    found = False
    for key in keys:
        found |= hmac.compare_digest(raw, key.encode("utf-8", "surrogateescape"))
    return found


def bearer_key(authorization: str) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, None for another scheme or none."""
    scheme, _, key = authorization.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else None
