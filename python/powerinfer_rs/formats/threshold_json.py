"""What the threshold files of both modes (:mod:`.thresholds`, :mod:`.input_thresholds`)
share: their JSON read and written (atomically), their numbers checked, the calibration record
(corpus, tokens) read back, and the model they were calibrated for checked."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, PlanError
from ..loading.regular_file import regular_file


def write_json_atomically(path: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
    """Write ``doc`` as JSON to ``path`` through a ``.part`` file replaced at the end (its
    folder made when missing); returns the path. The threshold files of both modes use it."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".part")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)
    return p


def read_json(source: str) -> Any:
    """The JSON document of the threshold file ``source``; :class:`ModelFileError` when it
    is missing, unreadable or not JSON."""
    try:
        with open(regular_file(source), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelFileError(f"{source}: no such threshold file") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{source}: cannot read thresholds: {e}") from None


def json_number(x: Any, what: str, source: str) -> float:
    """A JSON number as a float; :class:`ModelFileError` for anything else, including an
    integer too large for a float."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ModelFileError(f"{source}: '{what}' holds {x!r:.80}, not a number")
    try:
        return float(x)
    except OverflowError:
        raise ModelFileError(f"{source}: '{what}' holds a number out of range") from None


def check_threshold(t: Any, what: str) -> None:
    """:class:`PlanError` unless the threshold ``t`` (``what``, for the message) is a finite
    number >= 0."""
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        raise PlanError(f"{what} is {t!r}, not a finite number")
    if t < 0:
        raise PlanError(f"{what} is negative ({t})")


def calibration_record(doc: Mapping[str, Any], source: str) -> tuple[list[str], int]:
    """The corpus names and the token count a threshold file records (none and 0 when it
    records none); :class:`ModelFileError` for malformed ones."""
    tokens = doc.get("tokens", 0)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ModelFileError(f"{source}: tokens {tokens!r} is not a count")
    corpus = doc.get("corpus") or []
    if not isinstance(corpus, list):
        raise ModelFileError(f"{source}: corpus must be a list of names")
    return [str(c) for c in corpus], tokens


class ThresholdRecord:
    """The checks both threshold files' dataclasses share (they hold ``thresholds``, one entry
    per layer, ``model_fingerprint`` and ``target_sparsity``): :meth:`validate` runs the common
    checks around the file's own (:meth:`_check_values`, :meth:`_check_rest`), and
    :meth:`check_model` checks the model it was calibrated for."""

    #: The file's name in messages when the caller gives none, and its format tag.
    SOURCE = "thresholds"
    FORMAT = ""
    thresholds: list
    model_fingerprint: str | None
    target_sparsity: float | None
    corpus: list[str]
    tokens: int
    extra: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to disk: the format tag and the fingerprint, the file's own
        fields (:meth:`_json_fields`), the calibration record, then the other keys kept."""
        doc: dict[str, Any] = {
            "format": self.FORMAT,
            "model_fingerprint": self.model_fingerprint,
            **self._json_fields(),
            "corpus": list(self.corpus),
            "tokens": int(self.tokens),
        }
        for k, v in self.extra.items():
            doc.setdefault(k, v)
        return doc

    def _json_fields(self) -> dict[str, Any]:
        """The file's own keys of :meth:`to_json`, in order."""
        return {}

    @property
    def n_layers(self) -> int:
        """Number of layers."""
        return len(self.thresholds)

    def validate(self, source: str | None = None) -> None:
        """Check types and ranges; :class:`PlanError` otherwise."""
        source = self.SOURCE if source is None else source
        if not self.thresholds:
            raise PlanError(f"{source}: no thresholds")
        self._check_values(source)
        if self.target_sparsity is not None and not 0.0 <= self.target_sparsity < 1.0:
            raise PlanError(f"{source}: target_sparsity {self.target_sparsity} not in [0, 1)")
        self._check_rest(source)

    def _check_values(self, source: str) -> None:
        """The file's own checks of its thresholds."""

    def _check_rest(self, source: str) -> None:
        """The file's own checks after the target's."""

    def _layers_differ(self, source: str, n: int) -> str:
        """The message for thresholds of :attr:`n_layers` layers given an ``n``-layer model."""
        return f"{source}: thresholds for {self.n_layers} layers, the model has {n}"

    def check_model(self, model: Any, source: str | None = None) -> None:
        """Raise :class:`PlanError` unless the file fits ``model`` (a LoadedModel): same
        fingerprint (when the file has one) and one entry per layer."""
        source = self.SOURCE if source is None else source
        fp = getattr(model, "fingerprint", None)
        if self.model_fingerprint and fp and self.model_fingerprint != fp:
            raise PlanError(
                f"{source} was calibrated for another model (fingerprint "
                f"{self.model_fingerprint}, this model {fp})"
            )
        n = model.config.n_layers
        if self.n_layers != n:
            raise PlanError(self._layers_differ(source, n))
