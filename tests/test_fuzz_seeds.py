"""Every committed seed of every Python fuzz target (``fuzz/seeds/NAME``: valid files from our
writers, and ``regress-*`` inputs of past findings) replays through the target's check: the
valid ones load, none escapes as anything but a :class:`PowerInferError`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from powerinfer_rs.errors import InternalError, PowerInferError

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"


def _targets() -> list[Path]:
    return sorted((FUZZ / "targets").glob("fuzz_*.py"))


@pytest.mark.parametrize("target", _targets(), ids=lambda p: p.stem[len("fuzz_") :])
def test_fuzz_seeds_replay(target):
    """Every committed seed (valid files and past findings' inputs) of every Python target
    ends in a result or a PowerInferError (not an InternalError: that is a bug)."""
    spec = importlib.util.spec_from_file_location(f"_fuzz_{target.stem}", target)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    one_input = mod.load()
    seeds = sorted((FUZZ / "seeds" / target.stem[len("fuzz_") :]).iterdir())
    assert seeds, f"no seeds for {target.name}"
    valid = 0
    for seed in seeds:
        try:
            one_input(seed.read_bytes())
            valid += 1
        except InternalError:
            raise
        except PowerInferError:
            assert seed.name.startswith("regress-"), f"seed {seed.name} does not load"
    assert valid, "no seed loads"
