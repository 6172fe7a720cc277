"""``python -m powerinfer_rs.plan``: help, an end-to-end run, clean errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from powerinfer_rs.errors import PlanError
from powerinfer_rs.formats.plan import load_plan
from powerinfer_rs.formats.profile import synthetic_profile, write_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.stages.plan import main

TINY = dict(dim=64, ffn=256, layers=3, heads=4, kv_heads=2, vocab=300)


@pytest.fixture(scope="module")
def files(synth_gguf, tmp_path_factory):
    model_path = synth_gguf(dtype="Q8_0", **TINY)
    model = load_model(model_path)
    d = tmp_path_factory.mktemp("plan_cli")
    prof = synthetic_profile(3, 256, 1000, seed=0)
    write_profile(
        d / "prof",
        prof.counts,
        prof.tokens,
        model_fingerprint=model.fingerprint,
        corpus=["synthetic"],
    )
    return model_path, d / "prof", d, model


def test_help_as_module():
    import powerinfer_rs

    env = dict(os.environ)
    pkg_parent = str(Path(powerinfer_rs.__path__[0]).parent)
    env["PYTHONPATH"] = pkg_parent + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-m", "powerinfer_rs.plan", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for opt in (
        "--model",
        "--profile",
        "--vram-budget",
        "--hardware",
        "--context",
        "--objective",
        "--bucket",
        "--time-limit",
        "--out",
        "--plot",
    ):
        assert opt in out.stdout


@pytest.mark.parametrize("objective", ["mass", "time"])
def test_end_to_end(files, capsys, objective):
    model_path, prof, d, model = files
    out, png = d / f"PLAN-{objective}.safetensors", d / f"plan-{objective}.png"
    argv = [
        "--model",
        str(model_path),
        "--profile",
        str(prof),
        "--vram-budget",
        "400KiB",
        "--hardware",
        "rtx4090",
        "--context",
        "64",
        "--objective",
        objective,
        "--bucket",
        "32",
        "--min-neurons",
        "0",
        "--out",
        str(out),
    ]
    try:
        import matplotlib  # noqa: F401

        argv += ["--plot", str(png)]
    except ImportError:
        png = None
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "hot share" in text
    plan = load_plan(out, model, budget_bytes=400 * 1024)
    assert plan.objective == objective and plan.bucket == 32 and plan.context == 64
    assert plan.gpu_bytes <= 400 * 1024
    if objective == "mass":  # on a model this small, time says launches cost more than reads
        assert plan.gpu_bytes > 0
    if png is not None:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--vram-budget", "eight"], "cannot read"),
        (["--vram-budget", "8XB"], "unknown size unit"),
        (["--vram-budget", "-1"], "cannot read"),
        (["--vram-budget", "1TiB"], "exceeds"),
        (["--vram-budget", "1GiB", "--hardware", "cpu-only"], "no GPU"),
        (["--vram-budget", "0", "--hardware", "nope"], "unknown hardware"),
        (["--vram-budget", "0", "--context", "0"], "--context"),
    ],
)
def test_bad_input_is_one_line_exit_2(files, capsys, extra, message):
    model_path, prof, d, _ = files
    argv = [
        "--model",
        str(model_path),
        "--profile",
        str(prof),
        "--hardware",
        "rtx4090",
        "--out",
        str(d / "x.safetensors"),
        *extra,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_missing_files_exit_2(files, capsys, tmp_path):
    model_path, prof, d, _ = files
    assert (
        main(
            [
                "--model",
                str(tmp_path / "nope.gguf"),
                "--profile",
                str(prof),
                "--vram-budget",
                "0",
                "--hardware",
                "rtx4090",
            ]
        )
        == 2
    )
    assert (
        main(
            [
                "--model",
                str(model_path),
                "--profile",
                str(tmp_path),
                "--vram-budget",
                "0",
                "--hardware",
                "rtx4090",
            ]
        )
        == 2
    )
    errs = capsys.readouterr().err.strip().splitlines()
    assert len(errs) == 2 and all(e.startswith("error:") for e in errs)


def test_auto_budget_without_gpu_is_a_clean_error(files, capsys, monkeypatch):
    from powerinfer_rs.planning import gpu_probe

    monkeypatch.setattr(gpu_probe, "detect_gpu", lambda: None)
    monkeypatch.setattr("powerinfer_rs.stages.plan.detect_gpu", lambda: None)
    model_path, prof, d, _ = files
    assert (
        main(
            [
                "--model",
                str(model_path),
                "--profile",
                str(prof),
                "--vram-budget",
                "auto",
                "--out",
                str(d / "y.safetensors"),
            ]
        )
        == 2
    )
    assert "--vram-budget" in capsys.readouterr().err


def test_plan_error_is_a_value_error():
    assert issubclass(PlanError, ValueError)


def test_sparsity_sets_what_a_neuron_costs(files, capsys):
    """--sparsity exact-relu plans for a mode without predictors: none reserved or placed, the
    mode recorded; the default is predictor mode, whose predictors the budget holds."""
    model_path, prof, d, model = files
    base = ["--model", str(model_path), "--profile", str(prof), "--vram-budget", "400KiB"]
    base += ["--hardware", "rtx4090", "--context", "64", "--bucket", "32", "--min-neurons", "0"]
    base += ["--objective", "mass"]
    plans = {}
    for mode in (None, "exact-relu"):
        out = d / f"plan-{mode}.safetensors"
        assert main(base + ["--out", str(out)] + (["--sparsity", mode] if mode else [])) == 0
        plans[mode] = load_plan(out, model, budget_bytes=400 * 1024)
    capsys.readouterr()
    assert plans[None].predicted["sparsity"] == "predictor"
    assert any(plans[None].placement.predictor)
    assert plans["exact-relu"].predicted["sparsity"] == "exact-relu"
    assert not any(plans["exact-relu"].placement.predictor)
    assert plans["exact-relu"].predictors.layer_bytes(0) == 0


def test_a_detected_gpu_is_planned_with_this_machines_cpu(files, capsys, monkeypatch):
    """Planning for this machine (no --hardware, a GPU detected): the GPU's shipped profile,
    with the CPU's read bandwidth and cores measured here in place of the profile's."""
    from powerinfer_rs import _core
    from powerinfer_rs.planning.gpu_probe import GpuInfo
    from powerinfer_rs.stages import plan as stage

    model_path, prof, d, model = files
    gpu = GpuInfo("NVIDIA H200", 150 * 2**30, 140 * 2**30)
    monkeypatch.setattr(stage, "detect_gpu", lambda: gpu)
    calls = []

    def measure(nbytes, iters, threads):
        calls.append((nbytes, iters, threads))
        return 54.0

    def rate(dtype, nbytes, iters, threads):
        calls.append((dtype, threads))
        return 30.0  # the model's FFN format runs slower than the memory reads: it sets the rate

    def rows(dtype, listed, fire, nbytes, iters, threads):
        calls.append((dtype, listed, fire, threads))
        return 12.0 if fire == 1.0 else 20.0  # firing rows by index, the gate pass

    monkeypatch.setattr(_core, "measure_read_bandwidth", measure)
    monkeypatch.setattr(_core, "measure_format_bandwidth", rate)
    monkeypatch.setattr(_core, "measure_rows_bandwidth", rows)
    out = d / "plan-here.safetensors"
    argv = ["--model", str(model_path), "--profile", str(prof), "--vram-budget", "400KiB"]
    assert main(argv + ["--context", "64", "--bucket", "32", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "detected NVIDIA H200 -> profile h200" in text and "54 GB/s" in text
    ffn_format = str(model.tensors["blk.0.ffn_up"].dtype)
    assert f"{ffn_format} matvec 30 GB/s" in text
    plan = load_plan(out, model, budget_bytes=400 * 1024)
    assert plan.hardware["name"] == "h200" and plan.hardware["cpu_mem_bw"] == 30.0
    assert plan.hardware["cpu_cores"] == calls[0][2] and calls[1] == (ffn_format, calls[0][2])
    assert plan.hardware["cpu_dispatch_us"] > 0 and len(calls) == 4
    # The cold neurons' rates, probed on the model's format, are what the plan prices them at.
    assert plan.hardware["cpu_rows_bw"] == 12.0 and plan.hardware["cpu_gate_bw"] == 20.0
    assert [c[0] for c in calls[2:]] == [ffn_format] * 2 and "rows by index 12 GB/s" in text
