"""Pickle opcodes (protocol 2), as ``torch.save`` writes them: what :func:`~.torch_pt.save_pt`
builds its ``data.pkl`` from, and what a test writes a hand-made one with (a strided view, a
storage type ``save_pt`` never writes)."""

from __future__ import annotations

import struct


def unicode_op(s: str) -> bytes:
    """``BINUNICODE``: the string ``s``."""
    b = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(b)) + b


def int_op(v: int) -> bytes:
    """The shortest integer opcode holding ``v`` (``BININT1``, ``BININT2``, ``BININT``,
    ``LONG1``)."""
    if 0 <= v < 256:
        return b"K" + struct.pack("<B", v)
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = int(v).to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + struct.pack("<B", len(raw)) + raw


def global_op(module: str, name: str) -> bytes:
    """``GLOBAL``: ``module.name``."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tuple_op(items: list[bytes]) -> bytes:
    """``MARK`` ``items`` ``TUPLE``: the tuple of what ``items`` push."""
    return b"(" + b"".join(items) + b"t"
