"""Per-layer, per-site input thresholds for ``sparsity="input"`` (TEAL/WINA style), on disk.

``python -m powerinfer_rs.calibrate --mode input`` writes the file;
``Engine.from_pretrained(M, sparsity="input", thresholds=T)`` reads it. In layer ``i``, entry
``j`` of the input of a site's projections is dropped when its score is below
``thresholds[i][site]``: the score is ``|x_j|`` (``"teal"``) or ``|x_j|·‖W[:, j]‖``
(``"wina"``, the norm of column ``j`` over the site's matrices). The sites, in order:

- ``attn_in``: the attention's normed input (q, k, v);
- ``attn_out``: the attention's output (the output projection);
- ``ffn_in``: the FFN's normed input (gate, up);
- ``down_in``: the FFN's values ``act(gate)·up`` (down).

``output`` is the output head's input threshold (0: dense). The file is JSON::

    {
      "format": "powerinfer-rs-input-thresholds/1",
      "model_fingerprint": "...",
      "score": "teal",
      "target_sparsity": 0.4,
      "thresholds": [[0.11, 0.05, 0.09, 0.02], ...],   # per layer, per site
      "output": 0.0,
      "measured_sparsity": [[0.40, 0.41, 0.39, 0.40], ...],
      "corpus": ["notes.txt"], "tokens": 4096
    }

Other keys (the calibration's perplexity report) are kept in :attr:`InputThresholds.extra`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, PlanError
from ..loading.regular_file import regular_file
from . import threshold_json as tj

FORMAT = "powerinfer-rs-input-thresholds/1"
#: The sites of a layer, in the order of its thresholds.
SITES = ("attn_in", "attn_out", "ffn_in", "down_in")
#: The scores.
SCORES = ("teal", "wina")
_KNOWN = (
    "format",
    "model_fingerprint",
    "score",
    "target_sparsity",
    "thresholds",
    "output",
    "measured_sparsity",
    "corpus",
    "tokens",
)


@dataclass
class InputThresholds(tj.ThresholdRecord):
    """The contents of an input threshold file."""

    thresholds: list[list[float]]
    output: float = 0.0
    score: str = "teal"
    model_fingerprint: str | None = None
    target_sparsity: float | None = None
    measured_sparsity: list[list[float]] | None = None
    corpus: list[str] = field(default_factory=list)
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    SOURCE = "input thresholds"
    FORMAT = FORMAT

    def _check_values(self, source: str) -> None:
        if self.score not in SCORES:
            raise PlanError(f"{source}: score {self.score!r} (choose {', '.join(SCORES)})")
        for i, row in enumerate(self.thresholds):
            if len(row) != len(SITES):
                raise PlanError(
                    f"{source}: layer {i} has {len(row)} thresholds, want {len(SITES)} "
                    f"({', '.join(SITES)})"
                )
            for site, t in zip(SITES, row):
                tj.check_threshold(t, f"{source}: threshold of layer {i} {site}")
        tj.check_threshold(self.output, f"{source}: output threshold")

    def _json_fields(self) -> dict[str, Any]:
        rows = self.measured_sparsity
        return {
            "score": self.score,
            "target_sparsity": self.target_sparsity,
            "thresholds": [[float(t) for t in row] for row in self.thresholds],
            "output": float(self.output),
            "measured_sparsity": None if rows is None else [[float(v) for v in r] for r in rows],
        }


def save_input_thresholds(path: str | os.PathLike[str], tf: InputThresholds) -> Path:
    """Validate and write ``tf`` as JSON (atomically); returns the path."""
    tf.validate(os.fspath(path))
    return tj.write_json_atomically(path, tf.to_json())


def _from_doc(doc: Mapping[str, Any], source: str) -> InputThresholds:
    """The :class:`InputThresholds` of the file's document ``doc``, validated."""

    def number(x: Any, what: str) -> float:
        return tj.json_number(x, what, source)

    def rows(v: Any, what: str) -> list[list[float]]:
        if not isinstance(v, list) or not all(isinstance(r, list) for r in v):
            raise ModelFileError(f"{source}: '{what}' must be a list of per-layer lists")
        return [[number(x, what) for x in r] for r in v]

    corpus, tokens = tj.calibration_record(doc, source)
    target = doc.get("target_sparsity")
    measured = doc.get("measured_sparsity")
    score = doc.get("score", "teal")
    if not isinstance(score, str):
        raise ModelFileError(f"{source}: score {score!r:.80} is not a name")
    fp = doc.get("model_fingerprint")
    tf = InputThresholds(
        thresholds=rows(doc.get("thresholds"), "thresholds"),
        output=number(doc.get("output", 0.0), "output"),
        score=score,
        model_fingerprint=str(fp) if fp else None,
        target_sparsity=None if target is None else number(target, "target_sparsity"),
        measured_sparsity=None if measured is None else rows(measured, "measured_sparsity"),
        corpus=corpus,
        tokens=tokens,
        extra={k: v for k, v in doc.items() if k not in _KNOWN},
    )
    tf.validate(source)
    return tf


def load_input_thresholds(path: str | os.PathLike[str], model: Any = None) -> InputThresholds:
    """Read an input threshold file; with ``model`` also check it fits it. Malformed files
    raise :class:`ModelFileError`, another model's :class:`PlanError`."""
    source = os.fspath(path)
    doc = tj.read_json(source)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFileError(
            f"{source}: not an input threshold file (format {FORMAT!r}; "
            "python -m powerinfer_rs.calibrate --mode input writes one)"
        )
    tf = _from_doc(doc, source)
    if model is not None:
        tf.check_model(model, source)
    return tf


def is_input_thresholds(source: Any) -> bool:
    """Whether ``source`` (a path, an :class:`InputThresholds` or a mapping) holds input-mode
    thresholds rather than threshold mode's per-layer list (a path is peeked at, never raised
    on)."""
    if isinstance(source, InputThresholds):
        return True
    if isinstance(source, Mapping):
        return True
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(regular_file(source), encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # PowerInferError too
            return False
        return isinstance(doc, dict) and doc.get("format") == FORMAT
    return False


def input_thresholds_for(source: Any, model: Any) -> InputThresholds:
    """Input thresholds for ``model`` from a file, an :class:`InputThresholds` or a mapping
    with the file's keys (``thresholds``, optional ``output`` and ``score``)."""
    if isinstance(source, InputThresholds):
        tf = source
        tf.validate()
    elif isinstance(source, Mapping):
        tf = _from_doc(source, "input thresholds")
    elif isinstance(source, (str, os.PathLike)):
        return load_input_thresholds(source, model)
    else:
        raise PlanError(
            "sparsity='input' takes thresholds= as an input threshold file, an InputThresholds "
            f"or a mapping with 'thresholds' (per layer: {', '.join(SITES)}); got "
            f"{type(source).__name__}"
        )
    tf.check_model(model)
    return tf
