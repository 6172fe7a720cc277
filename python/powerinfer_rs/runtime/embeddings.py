"""Text embeddings from a model's final hidden states (after the output norm, the rows the
output head reads: ``_core.Session.feed_hidden``), pooled to one vector per input and
L2-normalized, as llama-server's ``/v1/embeddings`` returns them.

Pooling follows the GGUF's ``{arch}.pooling_type`` (llama.cpp's enum: 0 none, 1 mean, 2 cls,
3 last, 4 rank). A file that does not say, or says none (a generative model such as
SmolLM2), pools by ``mean``: llama.cpp reads both as "none" (one vector per token), which its
server refuses on ``/v1/embeddings`` unless started with ``--pooling``; mean over the tokens is
the usual choice for a decoder used as an encoder. ``rank`` (a reranker's head) is refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError, TokenError, UnsupportedError

#: llama.cpp's ``llama_pooling_type`` values as names.
POOLING_TYPES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
#: The poolings this engine computes.
POOLINGS = ("mean", "cls", "last")
#: The pooling of a model that does not name one (or names none).
DEFAULT_POOLING = "mean"


def model_pooling(pooling_type: int | None) -> str:
    """The pooling of a model whose file gives ``pooling_type`` (None: it gives none)."""
    name = POOLING_TYPES.get(pooling_type if pooling_type is not None else 0)
    if name is None:
        raise UnsupportedError(f"pooling_type {pooling_type} is not one of {POOLING_TYPES}")
    return DEFAULT_POOLING if name == "none" else name


def check_pooling(pooling: str) -> str:
    if pooling not in POOLINGS:
        raise UnsupportedError(
            f"pooling {pooling!r} is not supported: give one of {list(POOLINGS)}"
            + (" (rank is a reranker's head, not an embedding)" if pooling == "rank" else "")
        )
    return pooling


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """One vector (float64) of the per-token hidden states ``hidden`` (tokens × dim): their
    mean, the first token's (``cls``) or the last token's."""
    rows = np.asarray(hidden, dtype=np.float64)
    if pooling == "mean":
        return rows.mean(axis=0)
    if pooling == "cls":
        return rows[0].copy()
    if pooling == "last":
        return rows[-1].copy()
    raise UnsupportedError(f"pooling {pooling!r} is not one of {list(POOLINGS)}")


def l2_normalized(v: np.ndarray) -> np.ndarray:
    """``v`` scaled to unit Euclidean length (a zero vector stays zero, as llama.cpp's)."""
    norm = float(np.sqrt(np.dot(v, v)))
    return v / norm if norm > 0 else v


def token_lists(engine: Any, inputs: Any) -> list[list[int]]:
    """``inputs`` (a string, a list of strings, or a list of token-id lists) as token ids, each
    text encoded as the model's tokenizer does by default (with its BOS where it adds one).
    Nothing to embed, an empty text and a bad type are errors naming the input."""
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, Sequence) or isinstance(inputs, (bytes, bytearray)):
        raise ShapeError(f"embed() takes a string or a list, got {type(inputs).__name__}")
    if len(inputs) == 0:
        raise ShapeError("embed() needs at least one input")
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            if not item:
                raise ShapeError(f"input {i} is an empty string")
            ids = engine.tokenizer.encode(item)
        elif isinstance(item, Sequence) and not isinstance(item, (bytes, bytearray)):
            if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in item):
                raise TokenError(f"input {i}: token ids must be integers")
            ids = [int(t) for t in item]
        else:
            raise ShapeError(f"input {i} is a {type(item).__name__}, not a string or token ids")
        if not ids:
            raise ShapeError(f"input {i} has no tokens")
        out.append(ids)
    return out


def embed_ids(feed_hidden: Any, ids: list[list[int]], pooling: str, normalize: bool) -> np.ndarray:
    """Float32 embeddings (len(ids) × dim): each token list through ``feed_hidden`` (a fresh
    context each, so an input's vector never depends on the others), pooled, normalized."""
    check_pooling(pooling)
    rows = []
    for one in ids:
        v = pool(feed_hidden(one), pooling)
        rows.append(l2_normalized(v) if normalize else v)
    return np.asarray(rows, dtype=np.float32)
