"""Auto-fit under concurrency and interruption (issue 71): two preparations of one model into
one cache, started together, both answer and only one prepares (the other waits on the key's
lock, then reuses the result); a preparation killed mid-way leaves nothing that a later run
takes for a prepared directory, and the next run prepares again and clears what it left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_autofit import fast_gpu, synth

from powerinfer_rs.runtime import autofit

BUDGET = "2MiB"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("autofit-concurrency")
    return synth(root, "silu"), fast_gpu(root)


def prepare_cmd(model: str, hw: str) -> list[str]:
    return [sys.executable, "-m", "powerinfer_rs", "prepare", "--model", model,
            "--vram-budget", BUDGET, "--device", "gpu-sim", "--hardware", hw, "-q"]  # fmt: skip


def env_with_cache(cache: Path) -> dict[str, str]:
    return {**os.environ, "POWERINFER_RS_CACHE": str(cache)}


def entries(cache: Path) -> list[Path]:
    root = cache / "prepared"
    return sorted(root.iterdir()) if root.is_dir() else []


def test_two_preparations_at_once_both_answer_and_one_prepares(model, tmp_path):
    path, hw = model
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen(
            prepare_cmd(path, hw),
            env=env_with_cache(cache),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    results = [(p.returncode, *o) for p, o in zip(procs, outputs)]
    for code, _out, err in results:
        assert code == 0, err
    (d,) = entries(cache)  # one prepared directory, no working directory left
    assert (d / autofit.MANIFEST).is_file()
    assert all(out.startswith(f"{d}:") for _, out, _ in results), results
    prepared = [err for _, _, err in results if "prepared in" in err]
    assert len(prepared) == 1, [err for _, _, err in results]
    # The other one either waited for the lock or found the result already there.
    other = next(err for _, _, err in results if "prepared in" not in err)
    assert "digest" not in other and "Error" not in other, other


@pytest.mark.parametrize("stage_file", ["thresholds.json", "profile"])
def test_a_preparation_killed_mid_way_is_prepared_again(model, tmp_path, stage_file, capsys,
                                                         monkeypatch):  # fmt: skip
    """Killed (SIGKILL: no cleanup runs) once its working directory holds ``stage_file``: the
    cache has no directory for the key, only the dead run's working directory, which the next
    preparation removes as it prepares again."""
    path, hw = model
    cache = tmp_path / "cache"
    for _attempt in range(3):  # the stages are fast: retry until the kill lands mid-way
        proc = subprocess.Popen(prepare_cmd(path, hw), env=env_with_cache(cache),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 120:
            if any((w / stage_file).exists() for w in entries(cache) if autofit.PART in w.name):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=60)
        if proc.returncode == -signal.SIGKILL:
            break
        for e in entries(cache):  # it finished first: start again from an empty cache
            subprocess.run(["rm", "-rf", str(e)], check=True)
    assert proc.returncode == -signal.SIGKILL, "never killed mid-way"
    left = entries(cache)
    assert left and all(autofit.PART in e.name for e in left), left
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(cache))
    p = autofit.prepare(path, BUDGET, device="gpu-sim", hardware=hw, quiet=True)
    err = capsys.readouterr().err
    assert "prepared in" in err and "digest" not in err, err
    assert entries(cache) == [p.dir] and (p.dir / autofit.MANIFEST).is_file()
