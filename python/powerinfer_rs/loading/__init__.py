"""Model loading: GGUF files and Hugging Face directories -> :class:`LoadedModel`.

``load_model(path)`` picks the loader from what ``path`` is (a hub id is fetched first).
Weights come back as raw, memory-mapped byte views (:class:`TensorData`) under canonical llama
tensor names.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFileError
from .gguf_loader import load_gguf
from .hf_loader import load_hf_dir
from .hub import resolve_model
from .types import (
    BLOCK_LAYOUT,
    SUPPORTED_DTYPES,
    LoadedModel,
    ModelConfig,
    TensorData,
    expected_shapes,
    row_bytes,
)


def load_model(path: str | os.PathLike[str]) -> LoadedModel:
    """Load a model from a ``.gguf`` file (the first shard of a split one), a Hugging Face
    model directory, or a hub id ``org/repo[:QUANT]`` that is not a local path (fetched into
    the HF cache: :func:`~.hub.resolve_model`)."""
    p = Path(resolve_model(path))
    try:
        is_dir, is_file = p.is_dir(), p.is_file()
    except OSError as e:  # e.g. a directory on the way that this user may not enter
        raise ModelFileError(f"{p}: cannot read ({e.strerror or e})") from None
    if is_dir:
        return load_hf_dir(p)
    if is_file:
        try:
            with open(p, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ModelFileError(f"{p}: cannot read ({e.strerror or e})") from None
        if magic == b"GGUF" or p.suffix.lower() == ".gguf":
            return load_gguf(p)
        raise ModelFileError(
            f"{p}: neither a GGUF file nor a Hugging Face model directory (config.json + "
            "*.safetensors)"
        )
    raise ModelFileError(f"{p}: no such file or directory")


__all__ = [
    "BLOCK_LAYOUT",
    "SUPPORTED_DTYPES",
    "LoadedModel",
    "ModelConfig",
    "TensorData",
    "expected_shapes",
    "load_gguf",
    "load_hf_dir",
    "load_model",
    "resolve_model",
    "row_bytes",
]
