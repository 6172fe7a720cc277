"""Resuming a training run: what an earlier run for the same output left (its finished file and
its ``out.parts/`` folder), shared by the dense layers' pipeline (:mod:`.pipeline`) and the
experts' (:mod:`.experts`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ModelFileError, ShapeError
from ..formats.predictors import load_predictors
from .model import PredictorSet

#: The file in a parts folder that records the settings its units were trained with.
SETTINGS_NAME = "settings.json"


def resume_units(
    out: Path,
    settings: dict,
    matches: Callable[[Any], bool],
    pattern: str,
    take: Callable[[PredictorSet], dict],
    say: Callable[[str], None],
    what: str,
) -> tuple[dict, dict | None, bool]:
    """What an earlier run for ``out`` left: the units (``take`` of each set) of the finished
    file and of the parts folder ``out.parts`` (files matching ``pattern``) whose settings
    ``matches``, the finished file's metadata where it matched (else None), and whether the
    parts folder was kept. A parts folder of other settings is removed; the folder is then
    (re)made with ``settings`` recorded. Unreadable files are said and retrained."""
    parts = out.with_name(out.name + ".parts")
    done: dict = {}
    prev_meta = None
    if out.is_file():
        try:
            prev = load_predictors(out)
            if matches(prev.metadata.get("settings", {})):
                done.update(take(prev))
                prev_meta = prev.metadata
            else:
                say(f"{out}: made with other settings; its {what} are retrained")
        except (ModelFileError, ShapeError) as e:
            say(f"{out}: unreadable ({e}); starting over")
    kept = False
    if parts.is_dir():
        try:
            old = json.loads((parts / SETTINGS_NAME).read_text())
        except (OSError, ValueError, RecursionError):
            old = {}
        if isinstance(old, dict) and matches(old):
            kept = True
            for f in sorted(parts.glob(pattern)):
                try:
                    done.update(take(load_predictors(f)))
                except (ModelFileError, ShapeError):
                    say(f"{f}: unreadable partial file; retraining what it held")
        else:
            shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    (parts / SETTINGS_NAME).write_text(json.dumps(settings, indent=1))
    return done, prev_meta, kept
