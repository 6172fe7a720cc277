"""Per-layer activation thresholds for ``sparsity="threshold"`` (CATS/TEAL style), on disk.

``python -m powerinfer_rs.calibrate`` writes the file; ``Engine.from_pretrained(M,
sparsity="threshold", thresholds=T)`` and ``python -m powerinfer_rs.profile --thresholds T``
read it. A neuron of layer ``i`` counts as active for a token when ``|act(gate)·up| >=
thresholds[i]``; the engine skips the others. The file is JSON::

    {
      "format": "powerinfer-rs-thresholds/1",
      "model_fingerprint": "...",        # LoadedModel.fingerprint of the calibrated model
      "activation": "silu",              # the model's FFN activation
      "target_sparsity": 0.5,            # share of (token, neuron) pairs meant to be inactive
      "thresholds": [0.031, ...],        # one float per layer
      "measured_sparsity": [0.49, ...],  # per layer, measured after calibration
      "corpus": ["notes.txt"],           # what it was calibrated on
      "tokens": 4096                     # calibration tokens
    }

Only ``thresholds`` is required (the engine reads ``thresholds`` and ``model_fingerprint``);
other keys are kept as they are in :attr:`ThresholdFile.extra`. ``powerinfer-rs thresholds T``
(or ``python -m powerinfer_rs.formats.thresholds T``) prints a file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, PlanError, PowerInferError
from ..loading.regular_file import regular_file
from .threshold_json import (
    ThresholdRecord,
    calibration_record,
    check_threshold,
    json_number,
    read_json,
    write_json_atomically,
)

FORMAT = "powerinfer-rs-thresholds/1"
_KNOWN = (
    "format",
    "model_fingerprint",
    "activation",
    "target_sparsity",
    "thresholds",
    "measured_sparsity",
    "corpus",
    "tokens",
)


@dataclass
class ThresholdFile(ThresholdRecord):
    """The contents of a threshold file."""

    FORMAT = FORMAT

    thresholds: list[float]
    model_fingerprint: str | None = None
    activation: str | None = None
    target_sparsity: float | None = None
    measured_sparsity: list[float] | None = None
    corpus: list[str] = field(default_factory=list)
    tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def _check_values(self, source: str) -> None:
        for i, t in enumerate(self.thresholds):
            check_threshold(t, f"{source}: threshold of layer {i}")

    def _check_rest(self, source: str) -> None:
        if self.measured_sparsity is not None and len(self.measured_sparsity) != self.n_layers:
            raise PlanError(
                f"{source}: {len(self.measured_sparsity)} measured_sparsity values for "
                f"{self.n_layers} layers"
            )

    def _layers_differ(self, source: str, n: int) -> str:
        return f"{source}: {self.n_layers} thresholds for a {n}-layer model"

    def _json_fields(self) -> dict[str, Any]:
        measured = self.measured_sparsity
        return {
            "activation": self.activation,
            "target_sparsity": self.target_sparsity,
            "thresholds": [float(t) for t in self.thresholds],
            "measured_sparsity": None if measured is None else [float(s) for s in measured],
        }


def save_thresholds(path: str | os.PathLike[str], tf: ThresholdFile) -> Path:
    """Validate and write ``tf`` as JSON (atomically); returns the path."""
    tf.validate(os.fspath(path))
    return write_json_atomically(path, tf.to_json())


def _float_list(v: Any, what: str, source: str) -> list[float]:
    if not isinstance(v, list):
        raise ModelFileError(f"{source}: '{what}' must be a list of numbers")
    return [json_number(x, what, source) for x in v]


def load_thresholds(path: str | os.PathLike[str], model: Any = None) -> ThresholdFile:
    """Read a threshold file; with ``model`` (a LoadedModel) also check it fits
    (:class:`PlanError` for another model's file). Malformed files raise
    :class:`ModelFileError`."""
    source = regular_file(path)
    doc = read_json(source)
    if not isinstance(doc, dict) or "thresholds" not in doc:
        raise ModelFileError(f"{source}: not a threshold file (no 'thresholds' list)")
    fmt = doc.get("format")
    if fmt is not None and fmt != FORMAT:
        raise ModelFileError(f"{source}: format {fmt!r}, expected {FORMAT!r}")
    measured = doc.get("measured_sparsity")
    target = doc.get("target_sparsity")
    if target is not None:
        target = json_number(target, "target_sparsity", source)
    corpus, tokens = calibration_record(doc, source)
    fp = doc.get("model_fingerprint")
    tf = ThresholdFile(
        thresholds=_float_list(doc["thresholds"], "thresholds", source),
        model_fingerprint=str(fp) if fp else None,
        activation=doc.get("activation"),
        target_sparsity=target,
        measured_sparsity=None
        if measured is None
        else _float_list(measured, "measured_sparsity", source),
        corpus=corpus,
        tokens=tokens,
        extra={k: v for k, v in doc.items() if k not in _KNOWN},
    )
    tf.validate(source)
    if model is not None:
        tf.check_model(model, source)
    return tf


def thresholds_for(source: Sequence[float] | str | os.PathLike[str], model: Any) -> list[float]:
    """Per-layer thresholds for ``model`` (a LoadedModel) from a threshold file (see
    :func:`load_thresholds`) or a list of numbers; :class:`PlanError` when they do not fit."""
    if isinstance(source, (str, os.PathLike)):
        return load_thresholds(source, model).thresholds
    try:
        values = [float(v) for v in source]
    except (TypeError, ValueError) as e:
        raise PlanError(f"thresholds must be numbers: {e}") from e
    ThresholdFile(thresholds=values).check_model(model)
    return values


def format_table(tf: ThresholdFile) -> str:
    """Per-layer table of a threshold file."""
    lines = [f"{'layer':>5} | {'threshold':>10} | {'measured sparsity':>17}"]
    lines.append("-" * len(lines[0]))
    for i, t in enumerate(tf.thresholds):
        m = "-" if tf.measured_sparsity is None else f"{tf.measured_sparsity[i]:.3f}"
        lines.append(f"{i:>5} | {t:>10.4g} | {m:>17}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``powerinfer-rs thresholds FILE``: print a threshold file."""
    ap = argparse.ArgumentParser(
        prog="powerinfer-rs thresholds",
        description="Print a threshold file written by `python -m powerinfer_rs.calibrate`: "
        "its model, target sparsity and the per-layer thresholds on |act(gate)·up|.",
    )
    ap.add_argument("file", help="the threshold file (JSON)")
    ap.add_argument("--model", help="also check the file fits this model (GGUF or HF dir)")
    a = ap.parse_args(argv)
    try:
        model = None
        if a.model:
            from ..loading import load_model

            model = load_model(a.model)
        tf = load_thresholds(a.file, model)
    except PowerInferError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model fingerprint: {tf.model_fingerprint or '-'} ({tf.activation or '?'})")
    print(f"target sparsity  : {tf.target_sparsity}")
    print(f"calibrated on    : {tf.tokens} tokens of {', '.join(tf.corpus) or '?'}")
    print(format_table(tf))
    return 0


__all__ = [
    "FORMAT",
    "ThresholdFile",
    "format_table",
    "load_thresholds",
    "save_thresholds",
    "thresholds_for",
]

if __name__ == "__main__":
    sys.exit(main())
