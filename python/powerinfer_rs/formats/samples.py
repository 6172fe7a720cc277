"""Predictor training samples: per layer, (predictor input ``x``, active mask) pairs on disk.

The profiler runs the model densely and, for every token and layer, hands the FFN input ``x``
(``float32[n, dim]``) and which of the ``ffn`` neurons fired (``bool[n, ffn]``) to a
:class:`SampleWriter`. The writer keeps at most ``shard_rows`` rows per layer in memory and
flushes full shards, so memory stays bounded however long the corpus is::

    DIR/samples/meta.json                         format, shapes, rows and shards per layer
    DIR/samples/layer_{i:03d}/shard_{k:05d}.npz   x: float16 [rows, dim]
                                                  mask: uint8 [rows, ceil(ffn / 8)]
                                                        (np.packbits along axis 1, big bit order)

Readers: :func:`iter_samples` (batches, streaming) and :func:`load_samples` (one array pair).
Every malformed file ends in :class:`~powerinfer_rs.errors.ModelFileError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError, ShapeError
from ..loading.torch_pt import ZIP_ERRORS

FORMAT = "powerinfer-rs-samples/1"
META_NAME = "meta.json"
#: Largest layer count or width a samples folder may declare (far beyond any model).
MAX_DIM = 1 << 40
_SHARD_RE = re.compile(r"^shard_(\d{5,})\.npz$")


def samples_dir(root: str | os.PathLike[str]) -> Path:
    """The samples folder of a profile directory ``root`` (``root/samples``); ``root`` itself
    when it already is one (holds ``meta.json`` of this format)."""
    p = Path(root)
    if (p / "samples" / META_NAME).is_file() or not (p / META_NAME).is_file():
        return p / "samples"
    return p


def layer_dir(sdir: Path, layer: int) -> Path:
    """``sdir/layer_{layer:03d}``."""
    return sdir / f"layer_{layer:03d}"


def shard_path(sdir: Path, layer: int, k: int) -> Path:
    """``sdir/layer_{layer:03d}/shard_{k:05d}.npz``."""
    return layer_dir(sdir, layer) / f"shard_{k:05d}.npz"


class SampleWriter:
    """Stream (x, mask) samples per layer into shards of ``shard_rows`` rows.

    ``SampleWriter(dir, n_layers, dim, ffn_dim)`` writes under ``dir/samples`` (an existing
    samples folder there is replaced). ``metadata`` (JSON-able) is stored in ``meta.json``,
    e.g. ``{"model_fingerprint": ..., "predictor_input": "ffn_norm"}``. Use as a context
    manager or call :meth:`close`; ``meta.json`` is rewritten after a flush at most once a
    second (and at the end), so a crashed run still leaves readable shards.

    Memory: rows wait in memory (x as float16, the mask packed) until a layer has
    ``shard_rows`` of them; with ``max_buffered`` (bytes) the fullest layers are also flushed
    early, as shorter shards, whenever more than that waits in all (the per-expert units of a
    mixture of experts: thousands of units, each filling slowly).
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        n_layers: int,
        dim: int,
        ffn_dim: int,
        shard_rows: int = 4096,
        *,
        metadata: dict[str, Any] | None = None,
        max_buffered: int | None = None,
    ) -> None:
        for name, v in (("n_layers", n_layers), ("dim", dim), ("ffn_dim", ffn_dim)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ShapeError(f"SampleWriter: {name} must be a positive integer, got {v!r}")
        if not isinstance(shard_rows, int) or shard_rows <= 0:
            raise ShapeError(f"SampleWriter: shard_rows must be positive, got {shard_rows!r}")
        if max_buffered is not None and max_buffered <= 0:
            raise ShapeError(f"SampleWriter: max_buffered must be positive, got {max_buffered!r}")
        self.root = Path(dir)
        self.dir = self.root / "samples"
        self.n_layers, self.dim, self.ffn_dim, self.shard_rows = n_layers, dim, ffn_dim, shard_rows
        self.metadata = dict(metadata or {})
        self.max_buffered = max_buffered
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self._x: list[list[np.ndarray]] = [[] for _ in range(n_layers)]
        self._m: list[list[np.ndarray]] = [[] for _ in range(n_layers)]
        self._fill = [0] * n_layers
        self._row_bytes = 2 * dim + (ffn_dim + 7) // 8
        self._buffered = 0
        self._meta_at = 0.0
        self.rows = [0] * n_layers
        self.shards = [0] * n_layers
        self.closed = False
        self._write_meta()

    @property
    def buffered_rows(self) -> list[int]:
        """Per layer, the samples held in memory, not yet in a shard (at most ``shard_rows``)."""
        return list(self._fill)

    @property
    def buffered_bytes(self) -> int:
        """The bytes of the samples held in memory (kept under ``max_buffered`` when given)."""
        return self._buffered

    # ----------------------------------------------------------------------------- writing
    def add(self, layer: int, x: np.ndarray, mask: np.ndarray) -> None:
        """Append ``n`` samples of ``layer``: ``x`` float ``[n, dim]``, ``mask`` ``[n, ffn]``
        (bool, or numbers where nonzero means active). 1-D inputs count as one sample."""
        if self.closed:
            raise ShapeError("SampleWriter: add() after close()")
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.n_layers:
            raise ShapeError(f"SampleWriter: layer {layer!r} outside [0, {self.n_layers})")
        x = np.asarray(x)
        mask = np.asarray(mask)
        if x.ndim == 1:
            x = x[None, :]
        if mask.ndim == 1:
            mask = mask[None, :]
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ShapeError(f"SampleWriter: x must be [n, {self.dim}], got {x.shape}")
        if mask.shape != (x.shape[0], self.ffn_dim):
            raise ShapeError(
                f"SampleWriter: mask must be [{x.shape[0]}, {self.ffn_dim}], got {mask.shape}"
            )
        layer = int(layer)
        x16 = np.array(x, dtype=np.float16)  # a copy: the caller's buffer may be reused
        packed = np.packbits(mask != 0, axis=1)
        pos, n = 0, x.shape[0]
        while pos < n:
            take = min(n - pos, self.shard_rows - self._fill[layer])
            self._x[layer].append(x16[pos : pos + take])
            self._m[layer].append(packed[pos : pos + take])
            self._fill[layer] += take
            self._buffered += take * self._row_bytes
            pos += take
            if self._fill[layer] == self.shard_rows:
                self._flush(layer)
        if self.max_buffered is not None and self._buffered > self.max_buffered:
            # The fullest layers go first, down to half the limit: few, long shards.
            for i in sorted(range(self.n_layers), key=lambda i: -self._fill[i]):
                if self._buffered <= self.max_buffered // 2:
                    break
                self._flush(i)

    def _flush(self, layer: int) -> None:
        fill = self._fill[layer]
        if fill == 0:
            return
        path = shard_path(self.dir, layer, self.shards[layer])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        with open(tmp, "wb") as f:
            np.savez(
                f,
                x=np.concatenate(self._x[layer]),
                mask=np.concatenate(self._m[layer]),
                ffn=np.int64(self.ffn_dim),
            )
        os.replace(tmp, path)
        self.rows[layer] += fill
        self.shards[layer] += 1
        self._x[layer], self._m[layer] = [], []
        self._fill[layer] = 0
        self._buffered -= fill * self._row_bytes
        if time.monotonic() - self._meta_at >= 1.0:
            self._write_meta()

    def flush(self) -> None:
        """Write every partly filled buffer as a (short) shard."""
        for layer in range(self.n_layers):
            self._flush(layer)
        self._write_meta()

    def close(self) -> None:
        """Flush what is buffered and write the final ``meta.json``; idempotent."""
        if self.closed:
            return
        self.flush()
        self._x = self._m = []
        self.closed = True
        self._write_meta()

    def _write_meta(self) -> None:
        meta = {
            "format": FORMAT,
            "n_layers": self.n_layers,
            "dim": self.dim,
            "ffn_dim": self.ffn_dim,
            "shard_rows": self.shard_rows,
            "rows": list(self.rows),
            "shards": list(self.shards),
            "complete": self.closed,
            "metadata": self.metadata,
        }
        tmp = self.dir / (META_NAME + ".part")
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.dir / META_NAME)
        self._meta_at = time.monotonic()

    def __enter__(self) -> SampleWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- reading
def read_meta(dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated ``meta.json`` of the samples under ``dir`` (a profile dir or the samples
    folder itself)."""
    sdir = samples_dir(dir)
    path = sdir / META_NAME
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFileError(f"{sdir}: no predictor samples here (missing {META_NAME})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{path}: unreadable: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a {FORMAT} metadata file")
    for key in ("n_layers", "dim", "ffn_dim"):
        v = meta.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_DIM:
            raise ModelFileError(f"{path}: {key} must be an integer in [1, {MAX_DIM}], got {v!r}")
    if not isinstance(meta.get("metadata", {}), dict):
        raise ModelFileError(f"{path}: metadata must be an object")
    meta["dir"] = str(sdir)
    return meta


def _shards(sdir: Path, layer: int) -> list[Path]:
    d = layer_dir(sdir, layer)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _SHARD_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def _read_shard(path: Path, dim: int, ffn: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            x = np.asarray(z["x"])
            packed = np.asarray(z["mask"])
            n_ffn = np.asarray(z["ffn"]) if "ffn" in z.files else np.int64(ffn)
    except (*ZIP_ERRORS, KeyError, MemoryError) as e:
        raise ModelFileError(f"{path}: malformed sample shard: {type(e).__name__}: {e}") from e
    if n_ffn.shape != () or n_ffn.dtype.kind not in "iu":
        raise ModelFileError(f"{path}: shard's ffn must be an integer scalar, got {n_ffn!r:.80}")
    rows = x.shape[0] if x.ndim == 2 else -1
    if (
        x.ndim != 2
        or x.shape[1] != dim
        or x.dtype.kind != "f"
        or n_ffn != ffn
        or packed.dtype != np.uint8
        or packed.shape != (rows, (ffn + 7) // 8)
    ):
        raise ModelFileError(
            f"{path}: shard shapes x{x.shape} {x.dtype}, mask{packed.shape} {packed.dtype} "
            f"do not fit dim={dim}, ffn={ffn}"
        )
    mask = np.unpackbits(packed, axis=1, count=ffn).astype(bool)
    return x.astype(np.float32), mask


def iter_samples(
    dir: str | os.PathLike[str], layer: int, batch: int = 4096, *, max_rows: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(x float32[b, dim], mask bool[b, ffn])`` batches of ``layer``, ``batch`` rows each
    (the last may be shorter), reading one shard at a time."""
    meta = read_meta(dir)
    if not 0 <= layer < meta["n_layers"]:
        raise ShapeError(f"layer {layer} outside [0, {meta['n_layers']})")
    if batch <= 0:
        raise ShapeError(f"batch must be positive, got {batch}")
    sdir = Path(meta["dir"])
    dim, ffn = meta["dim"], meta["ffn_dim"]
    left = max_rows if max_rows is not None else None
    xs: list[np.ndarray] = []
    ms: list[np.ndarray] = []
    have = 0
    for path in _shards(sdir, layer):
        if left is not None and left <= 0:
            break
        x, m = _read_shard(path, dim, ffn)
        if left is not None:
            x, m = x[:left], m[:left]
            left -= x.shape[0]
        xs.append(x)
        ms.append(m)
        have += x.shape[0]
        while have >= batch:
            xa, ma = np.concatenate(xs), np.concatenate(ms)
            yield xa[:batch], ma[:batch]
            xs, ms = [xa[batch:]], [ma[batch:]]
            have -= batch
    if have:
        yield np.concatenate(xs), np.concatenate(ms)


def load_samples(
    dir: str | os.PathLike[str], layer: int, max_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """All samples of ``layer`` (at most ``max_rows``) as ``(x float32[n, dim], mask bool[n,
    ffn])``."""
    meta = read_meta(dir)
    xs, ms = [], []
    for x, m in iter_samples(dir, layer, batch=1 << 30, max_rows=max_rows):
        xs.append(x)
        ms.append(m)
    if not xs:
        return (
            np.empty((0, meta["dim"]), np.float32),
            np.empty((0, meta["ffn_dim"]), bool),
        )
    return np.concatenate(xs), np.concatenate(ms)


__all__ = [
    "FORMAT",
    "SampleWriter",
    "iter_samples",
    "load_samples",
    "read_meta",
    "samples_dir",
]
