"""``python -m powerinfer_rs.calibrate`` and ``python -m powerinfer_rs.evaluate`` on tiny
synthetic models, and the tools' command lines (--help, bad inputs -> exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.stages.calibrate import main as calibrate_main
from powerinfer_rs.stages.evaluate import main as evaluate_main
from powerinfer_rs.stages.profile import main as profile_main


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """Random lower-case 'words' (synthetic text: many distinct tokens)."""
    rng = np.random.default_rng(3)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    words = ["".join(rng.choice(letters, rng.integers(1, 8))) for _ in range(4000)]
    p = tmp_path_factory.mktemp("text") / "words.txt"
    p.write_text(" ".join(words) + ".\n", encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def silu_model(synth_gguf):
    return synth_gguf(activation="silu", dim=128, ffn=256)


@pytest.mark.parametrize("target", [0.3, 0.7])
def test_calibrate_reaches_the_target_sparsity(silu_model, text_file, tmp_path, capsys, target):
    out = tmp_path / "t.json"
    argv = ["--model", str(silu_model), "--corpus", str(text_file), "--sparsity", str(target),
            "--out", str(out), "--tokens", "1200", "--window", "200", "--threads", "1",
            "--quiet"]  # fmt: skip
    assert calibrate_main(argv) == 0
    printed = capsys.readouterr().out
    assert "perplexity dense" in printed and "threshold" in printed
    doc = json.loads(out.read_text())
    assert doc["format"] == "powerinfer-rs-thresholds/1"
    assert doc["target_sparsity"] == target and doc["activation"] == "silu"
    assert len(doc["thresholds"]) == 2 and all(t > 0 for t in doc["thresholds"])
    # measured in threshold mode on the held-out tail, by the engine's own counters
    assert doc["measured_on"].startswith("held-out")
    for s in doc["measured_sparsity"]:
        assert abs(s - target) <= 0.05, (s, target)
    for s in doc["calibration_sparsity"]:
        assert abs(s - target) <= 0.01
    assert doc["perplexity_threshold"] > 0 and doc["perplexity_dense"] > 0


def test_calibrate_function_and_value_sampler(silu_model):
    """The quantile from a bounded sample is close to the quantile from all values."""
    from powerinfer_rs.runtime.engine import Engine
    from powerinfer_rs.stages.args import ValueSampler
    from powerinfer_rs.stages.calibrate import calibrate_thresholds

    eng = Engine.from_pretrained(silu_model, threads=1)
    ids = list(np.random.default_rng(0).integers(3, 300, 400))
    full, _ = calibrate_thresholds(eng, ids, 0.5, window=100, progress=False)
    small, below = calibrate_thresholds(
        eng, ids, 0.5, window=100, sample_values=20000, progress=False
    )
    np.testing.assert_allclose(small, full, rtol=0.05)
    assert all(abs(b - 0.5) < 0.01 for b in below)
    s = ValueSampler(1, capacity=1000, seed=0)
    for k in range(20):
        s.add(0, np.arange(k * 500, (k + 1) * 500, dtype=np.float32))
    assert s.held[0].size == 1000 and s.seen[0] == 10000
    assert abs(s.quantile(0, 0.5) - 5000) < 600


def test_evaluate_modes_and_recall(synth_gguf, text_file, tmp_path, capsys):
    relu = synth_gguf(activation="relu", dim=128, ffn=256)
    prof = tmp_path / "prof"
    argv = ["--model", str(relu), "--corpus", str(text_file), "--tokens", "1500",
            "--out", str(prof), "--samples", "--no-plot", "--quiet"]  # fmt: skip
    assert profile_main(argv) == 0
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.predictors import TrainConfig, train_predictors

    cfg = TrainConfig()
    cfg.epochs = 4
    train_predictors(
        prof, tmp_path / "p.safetensors", model=load_model(relu), config=cfg, progress=False
    )
    capsys.readouterr()
    js = tmp_path / "ev.json"
    argv = ["--model", str(relu), "--predictors", str(tmp_path / "p.safetensors"),
            "--text", str(text_file), "--tokens", "400", "--window", "128",
            "--recall-tokens", "256", "--json", str(js), "--quiet"]  # fmt: skip
    assert evaluate_main(argv) == 0
    out = capsys.readouterr().out
    assert "exact-relu" in out and "predictor" in out and "recall" in out
    rep = json.loads(js.read_text())
    modes = {m["mode"]: m for m in rep["modes"]}
    assert set(modes) == {"dense", "exact-relu", "predictor"}
    # exact-relu is the dense function on a ReLU model
    assert modes["exact-relu"]["perplexity"] == pytest.approx(modes["dense"]["perplexity"], 1e-4)
    assert modes["dense"]["active_fraction"] == pytest.approx(
        modes["exact-relu"]["active_fraction"]
    )
    q = rep["predictor_quality"]
    assert len(q) == 2 and rep["predictor_semantics"] == "relu"
    for r in q:
        assert 0.0 <= r["precision"] <= 1.0 and r["recall"] > 0.5 and r["tokens"] == 256


def test_evaluate_threshold_mode(silu_model, text_file, tmp_path, capsys):
    t = tmp_path / "t.json"
    argv = ["--model", str(silu_model), "--corpus", str(text_file), "--sparsity", "0.5",
            "--out", str(t), "--tokens", "600", "--heldout-fraction", "0", "--quiet"]  # fmt: skip
    assert calibrate_main(argv) == 0
    js = tmp_path / "ev.json"
    argv = ["--model", str(silu_model), "--thresholds", str(t), "--text", str(text_file),
            "--tokens", "300", "--json", str(js), "--quiet"]  # fmt: skip
    assert evaluate_main(argv) == 0
    modes = {m["mode"]: m for m in json.loads(js.read_text())["modes"]}
    assert set(modes) == {"dense", "threshold"}
    assert modes["dense"]["active_fraction"] > 0.99
    assert abs(modes["threshold"]["active_fraction"] - 0.5) < 0.1


# ------------------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    "module, flags",
    [
        ("calibrate", ["--model", "--corpus", "--sparsity", "--out", "--tokens",
                       "--heldout-fraction", "--threads"]),
        ("profile", ["--model", "--corpus", "--tokens", "--out", "--thresholds", "--samples",
                     "--sample-tokens", "--window", "--threads"]),
        ("evaluate", ["--model", "--predictors", "--thresholds", "--text", "--tokens",
                      "--window"]),
        ("formats.thresholds", ["--model"]),
    ],
)  # fmt: skip
def test_help(module, flags, capsys):
    import importlib

    mod = importlib.import_module(f"powerinfer_rs.{module}")
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for f in flags:
        assert f in text, (module, f)


def test_bad_inputs_exit_2(silu_model, text_file, tmp_path, capsys):
    cases = [
        (calibrate_main, ["--model", str(tmp_path / "none.gguf"), "--corpus", str(text_file),
                          "--out", str(tmp_path / "t.json")]),
        (calibrate_main, ["--model", str(silu_model), "--corpus", str(tmp_path / "none.txt"),
                          "--out", str(tmp_path / "t.json")]),
        (evaluate_main, ["--model", str(silu_model), "--text", str(text_file),
                         "--thresholds", str(tmp_path / "none.json")]),
        (evaluate_main, ["--model", str(silu_model), "--text", str(text_file),
                         "--predictors", str(tmp_path / "none.safetensors")]),
    ]  # fmt: skip
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"thresholds": [0.1, 0.1], "model_fingerprint": "f" * 32}))
    cases.append((evaluate_main, ["--model", str(silu_model), "--text", str(text_file),
                                  "--thresholds", str(wrong)]))  # fmt: skip
    for fn, argv in cases:
        assert fn(argv + ["--quiet"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    for argv in (["--sparsity", "1.5"], ["--sparsity", "0.5", "--tokens", "0"]):
        with pytest.raises(SystemExit) as e:
            calibrate_main(["--model", "m", "--corpus", "c", "--out", "o", *argv])
        assert e.value.code == 2


def test_cli_subprocess_one_line_error(tmp_path):
    """As a real `python -m` process: exit 2, one line, no traceback."""
    import os

    import powerinfer_rs

    # The package this test imported (installed wheel in CI, ./python in development).
    env = {**os.environ, "PYTHONPATH": str(Path(powerinfer_rs.__path__[0]).parent)}
    r = subprocess.run(
        [sys.executable, "-m", "powerinfer_rs.profile", "--model", str(tmp_path / "x.gguf"),
         "--corpus", "c.txt", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "stage", ["calibrate", "profile", "train-predictors", "evaluate", "plan", "synth", "thresholds"]
)
def test_stages_are_subcommands(stage, capsys):
    """`powerinfer-rs <stage> ...` hands the rest of the command line to the stage's main."""
    from powerinfer_rs import cli

    with pytest.raises(SystemExit) as e:
        cli.main([stage, "--help"])
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out
    assert stage in cli.build_parser().format_help()
