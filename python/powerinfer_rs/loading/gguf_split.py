"""Split GGUF files (``name-00001-of-00003.gguf``, ...), opened as llama.cpp opens them.

What llama.cpp's ``gguf-split`` and gguf-py's writer (``GGUFWriter(split_max_tensors=...,
split_max_size=...)``, behind ``convert_hf_to_gguf.py --split-max-tensors``) write: every
shard is a complete GGUF file holding some of the tensors, named ``"%s-%05d-of-%05d.gguf"``
(prefix, shard number from 1, shard count: llama.cpp's ``llama_split_path``). Each carries
``split.no`` (u16, from 0), ``split.count`` (u16) and ``split.tensors.count`` (i32, the tensors
of all shards); the model's other keys are in the first shard only.

llama.cpp's loader (``llama_model_loader``): the file given must be shard 0; the others are
found by name from its prefix (``llama_split_prefix``); each must say it is shard ``i``; no
tensor may be in two shards; the shards together hold ``split.tensors.count`` tensors. Here
each of those is a :class:`ModelFileError` naming the shard file, and a shard's
``split.count`` must also agree with the first's. A file without ``split.count`` (or with 1)
is one file, whatever its name.

Tensor data stays in its own shard's memory map: :meth:`GGUFModelFiles.data_of` gives the
shard's ``np.memmap``, so a tensor is a view of the file it lives in, never a copy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError
from .gguf_file import GGUFFile, GGUFTensorInfo

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
#: The end of a shard's name: ``-NNNNN-of-MMMMM.gguf`` (llama.cpp's ``llama_split_path``).
SHARD_NAME = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def split_path(prefix: str, no: int, count: int) -> str:
    """The path of shard ``no`` (from 0) of ``count``: llama.cpp's ``llama_split_path``."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def split_prefix(path: str, no: int, count: int) -> str | None:
    """The prefix of ``path`` if it is named as shard ``no`` (from 0) of ``count``, else None:
    llama.cpp's ``llama_split_prefix``."""
    postfix = f"-{no + 1:05d}-of-{count:05d}.gguf"
    if len(path) > len(postfix) and path.endswith(postfix):
        return path[: -len(postfix)]
    return None


def shard_of_name(path: str | os.PathLike[str]) -> tuple[str, int, int] | None:
    """``(prefix, no from 0, count)`` when ``path``'s name says it is a shard of a split file
    of more than one shard, else None. By name only: :class:`GGUFModelFiles` checks the keys."""
    p = os.fspath(path)
    m = SHARD_NAME.search(p)
    if m is None or int(m.group(2)) < 2 or not 1 <= int(m.group(1)) <= int(m.group(2)):
        return None
    return p[: m.start()], int(m.group(1)) - 1, int(m.group(2))


def _split_int(gf: GGUFFile, key: str, default: int | None = None) -> int:
    v = gf.metadata.get(key, default)
    if v is None:
        raise ModelFileError(f"{gf.path}: a shard of a split GGUF without the key {key!r}")
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ModelFileError(f"{gf.path}: {key} must be a non-negative integer, got {v!r}")
    return v


class GGUFModelFiles:
    """One model's GGUF files: a single file, or every shard of a split one.

    :attr:`path` is the file given (the first shard), :attr:`shards` the parsed files in shard
    order, :attr:`metadata` the first shard's keys (the model's), :attr:`tensors` every shard's
    tensor infos in shard order, each knowing its shard (:attr:`GGUFTensorInfo.shard`).
    ``path`` may be a :class:`GGUFFile` already parsed (PowerInfer's files are never split).
    """

    def __init__(self, path: str | os.PathLike[str] | GGUFFile) -> None:
        first = path if isinstance(path, GGUFFile) else GGUFFile(path)
        self.path = first.path
        self.shards: list[GGUFFile] = [first]
        count = _split_int(first, SPLIT_COUNT, 1)
        if count > 1:
            self._open_rest(first, count)
        self.metadata: dict[str, Any] = first.metadata
        self.tensors: list[GGUFTensorInfo] = []
        owner: dict[str, str] = {}
        for i, shard in enumerate(self.shards):
            for t in shard.tensors:
                if t.name in owner:
                    raise ModelFileError(
                        f"{shard.path}: tensor {t.name!r} is also in {owner[t.name]} "
                        "(a tensor may be in one shard only)"
                    )
                owner[t.name] = shard.path
                t.shard = i
                self.tensors.append(t)
        if count > 1:
            want = _split_int(first, SPLIT_TENSORS_COUNT)
            if want != len(self.tensors):
                raise ModelFileError(
                    f"{self.path}: {SPLIT_TENSORS_COUNT} says {want} tensors, its {count} shards "
                    f"hold {len(self.tensors)} (a shard of another split, or a corrupt one?)"
                )

    def _open_rest(self, first: GGUFFile, count: int) -> None:
        """Find and parse shards 1.. of ``count`` by the first shard's name, checking each."""
        no = _split_int(first, SPLIT_NO)
        if no != 0:
            prefix = split_prefix(self.path, no, count)
            first_path = split_path(prefix, 0, count) if prefix else "its shard 1"
            raise ModelFileError(
                f"{self.path}: shard {no + 1} of {count} of a split GGUF; open the first shard, "
                f"{first_path}, which finds the others"
            )
        prefix = split_prefix(self.path, 0, count)
        if prefix is None:
            raise ModelFileError(
                f"{self.path}: the first of {count} shards of a split GGUF, but not named "
                f"'<name>-00001-of-{count:05d}.gguf', so its other shards cannot be found "
                "(rename the shards as gguf-split names them)"
            )
        for i in range(1, count):
            p = split_path(prefix, i, count)
            if not os.path.exists(p):
                raise ModelFileError(
                    f"{p}: shard {i + 1} of {count} of {self.path} is missing (download every "
                    f"shard into {Path(p).parent or '.'})"
                )
            shard = GGUFFile(p)
            got_no, got_count = _split_int(shard, SPLIT_NO), _split_int(shard, SPLIT_COUNT)
            if (got_no, got_count) != (i, count):
                raise ModelFileError(
                    f"{p}: says it is shard {got_no + 1} of {got_count}, but is named shard "
                    f"{i + 1} of {count} of {self.path} (shards of different splits mixed?)"
                )
            self.shards.append(shard)

    @property
    def paths(self) -> list[str]:
        """Every file of the model, in shard order."""
        return [s.path for s in self.shards]

    def data_of(self, t: GGUFTensorInfo) -> np.memmap:
        """The memory map of the shard holding ``t`` (its :attr:`~GGUFTensorInfo.offset` is
        into it)."""
        return self.shards[t.shard].data

    def path_of(self, t: GGUFTensorInfo) -> str:
        """The file holding ``t``."""
        return self.shards[t.shard].path

    def __repr__(self) -> str:
        return f"GGUFModelFiles({self.path!r}, shards={len(self.shards)})"


def model_file_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The files a GGUF model at ``path`` is read from, without parsing more than needed:
    ``[path]``, or every shard when ``path`` is named as the first of a split and its header
    says so."""
    p = Path(path)
    named = shard_of_name(p)
    if named is None or named[1] != 0:
        return [p]
    try:
        files = GGUFModelFiles(p)
    except ModelFileError:
        return [p]  # the loader says what is wrong
    return [Path(x) for x in files.paths]
