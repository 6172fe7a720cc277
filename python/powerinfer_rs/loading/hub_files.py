"""Which files of a hub repo a model id means: the tag-to-file choice of ``org/repo[:QUANT]``,
on a repo's file list alone (no client, no network), so it is tested on real repos' lists.

As llama.cpp's ``-hf org/repo[:quant]`` (``common/download.cpp``: ``find_best_model``,
``gguf_filename_is_model``, ``get_split_files``):

* the GGUF files are the candidates, less those whose name holds ``mmproj``, ``imatrix``,
  ``mtp-``, ``eagle3-``, ``dflash-`` or ``dspark-`` (projectors and draft heads); the shards of
  a split file (``-00001-of-00003.gguf``, ...) are one candidate, fetched together;
* a tag picks the file whose path holds it followed by ``.`` or ``-`` (``Q4_K_M-``, ``Q8_0.``),
  compared without case; no tag means ``Q4_K_M``, else ``Q8_0``, else the first GGUF file by
  path.

Where llama.cpp takes the first of several files a tag matches, two files are a
:class:`HubError` here, unless one's quant label (``Q4_K_XL`` beside ``UD-Q4_K_XL``) is the tag
itself; a tag that is a file's path or name (our addition, in place of llama.cpp's
``--hf-file``) picks that file. No file for the tag is a :class:`HubError` listing the quants
the repo has.

A repo without GGUF files but with ``config.json`` and ``*.safetensors`` at its top is a Hugging
Face model directory: its top-level configs, weights and tokenizer files are fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from ..errors import HubError
from .gguf_split import SHARD_NAME

#: The quants a repo id without a tag asks for, in order (llama.cpp's ``find_best_model``).
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
#: Names of GGUF files that are not a model (llama.cpp's ``gguf_filename_is_model``).
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
#: A quant label as GGUF publishers end file names with it: llama.cpp's types and the mixes of
#: its quantizer (``Q4_K_M``, ``IQ2_XXS``, ``TQ1_0``, ``MXFP4_MOE``), unsloth's dynamic ones
#: (``UD-Q4_K_XL``), the float types.
QUANT_LABEL = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|NVFP4|BF16|F16|"
    r"F32|FP16|FP32))(?![A-Za-z0-9])",
    re.IGNORECASE,
)
#: Top-level files of a safetensors repo the HF loader reads (configs, weights, tokenizer,
#: chat template).
HF_SUFFIXES = (".json", ".safetensors", ".jinja", ".model", ".txt")


@dataclass
class GGUFCandidate:
    """One model file of a repo: a single GGUF file, or every shard of a split one."""

    files: list[str] = field(default_factory=list)

    @property
    def first(self) -> str:
        """The file to open (the first shard)."""
        return self.files[0]

    @property
    def stem(self) -> str:
        """The path without ``.gguf`` and without a shard suffix."""
        m = SHARD_NAME.search(self.first)
        return self.first[: m.start()] if m else self.first[: -len(".gguf")]

    @property
    def label(self) -> str | None:
        """The quant label of the file name (its last one), upper case, or None."""
        found = QUANT_LABEL.findall(PurePosixPath(self.stem).name)
        return found[-1].upper() if found else None


def _is_model_gguf(path: str) -> bool:
    name = PurePosixPath(path).name.lower()
    return name.endswith(".gguf") and not any(w in name for w in NOT_MODELS)


def gguf_candidates(files: list[str]) -> list[GGUFCandidate]:
    """The GGUF models among ``files`` (repo paths), by path; a split's shards grouped under
    its first. A split whose list lacks shards is a :class:`HubError`."""
    singles: list[GGUFCandidate] = []
    splits: dict[tuple[str, int], dict[int, str]] = {}
    for f in sorted(set(files)):
        if not _is_model_gguf(f):
            continue
        m = SHARD_NAME.search(f)
        if m is None or int(m.group(2)) < 2:
            singles.append(GGUFCandidate([f]))
            continue
        splits.setdefault((f[: m.start()], int(m.group(2))), {})[int(m.group(1))] = f
    for (prefix, count), shards in splits.items():
        missing = [i for i in range(1, count + 1) if i not in shards]
        if missing:
            raise HubError(
                f"{prefix}: {len(shards)} of the {count} shards of this split GGUF are there "
                f"(missing: {', '.join(f'{i:05d}' for i in missing)})"
            )
        singles.append(GGUFCandidate([shards[i] for i in range(1, count + 1)]))
    return sorted(singles, key=lambda c: c.first)


def available_quants(cands: list[GGUFCandidate]) -> list[str]:
    """The quant labels of ``cands`` (the file names of those without one), sorted, once."""
    return sorted({c.label or PurePosixPath(c.first).name for c in cands})


def _matches(cands: list[GGUFCandidate], tag: str) -> list[GGUFCandidate]:
    """The candidates ``tag`` names: by path or file name; else those whose first file's path
    holds the tag followed by ``.`` or ``-`` (llama.cpp's ``tag[.-]``, without case), narrowed
    to those whose label is the tag when there are several."""
    low = tag.lower()
    by_name = [
        c
        for c in cands
        if low in (c.first.lower(), PurePosixPath(c.first).name.lower(), c.stem.lower())
    ]
    if by_name:
        return by_name
    pattern = re.compile(re.escape(tag) + "[.-]", re.IGNORECASE)
    found = [c for c in cands if pattern.search(c.first)]
    exact = [c for c in found if c.label == tag.upper()]
    return exact if len(found) > 1 and exact else found


def choose_gguf(repo: str, files: list[str], tag: str | None) -> list[str]:
    """The files (repo paths) ``repo:tag`` names among the repo's ``files``: one GGUF file or
    every shard of a split one, the file to open first. :class:`HubError` when the tag names
    none or two, or the repo has no GGUF file."""
    cands = gguf_candidates(files)
    if not cands:
        raise HubError(f"{repo}: no GGUF file in the repo")
    if tag is None:
        found = next((f for f in (_matches(cands, t) for t in DEFAULT_QUANTS) if f), [])
        if not found:
            return cands[0].files
        which = found[0].label or DEFAULT_QUANTS[0]
    else:
        found = _matches(cands, tag)
        which = tag
    if not found:
        raise HubError(
            f"{repo}: no GGUF file for the tag {tag!r}; the repo has "
            f"{', '.join(available_quants(cands))} (ask for one as {repo}:QUANT)"
        )
    if len(found) > 1:
        raise HubError(
            f"{repo}: the tag {which!r} matches {len(found)} files: "
            f"{', '.join(c.first for c in found)}; name one: {repo}:<its path, as listed>"
        )
    return found[0].files


def hf_model_files(files: list[str]) -> list[str] | None:
    """The files of a safetensors repo to fetch (top-level configs, weights, tokenizer and
    chat template), or None when the repo is not one (no ``config.json`` or no
    ``*.safetensors`` at its top)."""
    top = [f for f in files if "/" not in f]
    if "config.json" not in top or not any(f.endswith(".safetensors") for f in top):
        return None
    return sorted(f for f in top if f.endswith(HF_SUFFIXES))
