"""Auto-fit: ``--vram-budget`` without ``--plan`` prepares the model once (the pipeline's stages on
the shipped calibration text), caches it and runs the hybrid; the result equals running the
stages by hand with the same settings; ``prepare`` writes a directory ``--model``/``--plan``
accept; with "auto" and no GPU it says so and runs on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_cli_plan_flags import run

from powerinfer_rs import Engine
from powerinfer_rs.formats.plan import load_plan
from powerinfer_rs.planning.gpu_probe import detect_gpu
from powerinfer_rs.runtime import autofit
from powerinfer_rs.stages import calibrate, plan, profile, train_predictors

SHAPE = ["--dim", "128", "--ffn", "352", "--layers", "4", "--heads", "4", "--kv-heads", "2"]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    return tmp_path


def fast_gpu(tmp_path: Path) -> str:
    """A hardware profile on which the cost model puts even a tiny model's layers on the GPU
    (no launch or sync latency, a slow CPU): the plans then place something."""
    p = tmp_path / "fast-gpu.json"
    p.write_text(json.dumps({
        "name": "fast-gpu", "description": "test", "vram_bytes": 2**34, "gpu_mem_bw": 1000.0,
        "pcie_bw": 30.0, "cpu_mem_bw": 0.5, "cpu_cores": 2, "launch_latency_us": 0.0,
        "sync_latency_us": 0.0,
    }))  # fmt: skip
    return str(p)


def synth(tmp_path: Path, activation: str) -> str:
    out = tmp_path / f"{activation}.gguf"
    code, _, err = run(["synth", *SHAPE, "--vocab", "300", "--activation", activation,
                        "--format", "gguf-q8_0", "--out", str(out)])  # fmt: skip
    assert code == 0, err
    return str(out)


def generate(*extra: str) -> tuple[int, str, str]:
    return run(["generate", "--threads", "2", "--prompt", "the cat sat", "-n", "8",
                "--temperature", "0", "-q", *extra])  # fmt: skip


def prepared_dirs(cache: Path) -> list[Path]:
    root = cache / "cache" / "prepared"
    return sorted(p for p in root.iterdir() if (p / autofit.MANIFEST).is_file())


@pytest.mark.parametrize("activation", ["relu", "silu"])
def test_one_command_prepares_caches_and_runs_the_hybrid(cache, activation):
    model = synth(cache, activation)
    hw = ["--vram-budget", "2MiB", "--device", "gpu-sim", "--hardware", fast_gpu(cache)]
    code, out, err = generate("--model", model, *hw)
    assert code == 0, err
    assert "auto-fit: prepared in" in err
    (d,) = prepared_dirs(cache)
    man = json.loads((d / autofit.MANIFEST).read_text())
    relu = activation == "relu"
    assert man["sparsity"] == ("predictor" if relu else "threshold")
    assert (man["files"]["predictors"] is not None) == relu
    assert (man["files"]["thresholds"] is not None) != relu
    p = load_plan(d / "plan.safetensors")
    assert p.gpu_bytes > 0 and p.budget_bytes == 2 * 2**20
    # The same run by the API with the prepared files, on the GPU side.
    opts = autofit.read_prepared(d).engine_options()
    eng = Engine.from_pretrained(model, threads=2, device="gpu-sim", **opts)
    assert eng.gpu_info()["allocations"] == eng.plan.allocations
    assert out == eng.generate("the cat sat", max_new_tokens=8, temperature=0) + "\n"
    # Reused at once; --refresh rebuilds.
    stamp = (d / "plan.safetensors").stat().st_mtime_ns
    code, out2, err = generate("--model", model, *hw)
    assert (code, out2) == (0, out) and "auto-fit: prepared" not in err
    assert (d / "plan.safetensors").stat().st_mtime_ns == stamp
    code, out3, err = generate("--model", model, *hw, "--refresh")
    assert (code, out3) == (0, out) and "auto-fit: prepared in" in err
    assert prepared_dirs(cache) == [d]


def test_prepare_equals_the_stages_by_hand(cache):
    """The prepared files are what the five stages give by hand with the same settings."""
    model = synth(cache, "relu")
    out = cache / "prep"
    hw = fast_gpu(cache)
    code, text, err = run(["prepare", "--model", model, "--vram-budget", "2MiB", "--device",
                           "gpu-sim", "--hardware", hw, "--out", str(out), "-q"])  # fmt: skip
    assert code == 0, err
    assert str(out) in text
    man = json.loads((out / autofit.MANIFEST).read_text())
    cal_tokens, prof_tokens = man["key"]["tokens"]
    hand = cache / "hand"
    corpus = str(autofit.CORPUS)
    argv = ["--model", model, "--corpus", corpus, "--tokens", str(prof_tokens), "--out",
            str(hand / "profile"), "--no-plot", "--threads", "0", "--samples",
            "--quiet"]  # fmt: skip
    assert profile.main(argv) == 0
    argv = ["--model", model, "--profile", str(hand / "profile"), "--out",
            str(hand / "p.safetensors"), "--quiet"]  # fmt: skip
    assert train_predictors.main(argv) == 0
    argv = ["--model", model, "--profile", str(hand / "profile"), "--vram-budget",
            str(2 * 2**20), "--hardware", hw, "--context", str(man["key"]["context"]),
            "--kv-cache", "f16", "--out", str(hand / "plan.safetensors"), "--predictors",
            str(hand / "p.safetensors"), "--quiet"]  # fmt: skip
    assert plan.main(argv) == 0
    a, b = load_plan(out / "plan.safetensors"), load_plan(hand / "plan.safetensors")
    assert [list(x) for x in a.gpu_neurons] == [list(x) for x in b.gpu_neurons]
    assert a.placement.attention == b.placement.attention and a.gpu_bytes == b.gpu_bytes
    # The prepared directory runs as --model DIR and as --plan DIR, like the by-hand files.
    want = Engine.from_pretrained(
        model, threads=2, device="gpu-sim", plan=str(hand / "plan.safetensors"),
        sparsity="predictor", predictors=str(hand / "p.safetensors"),
    ).generate("the cat sat", max_new_tokens=8, temperature=0)  # fmt: skip
    for flags in (["--model", str(out)], ["--model", model, "--plan", str(out)]):
        code, got, err = generate(*flags, "--device", "gpu-sim")
        assert (code, got) == (0, want + "\n"), err
    assert calibrate.main  # SiLU models add calibrate (the other test runs it)


@pytest.mark.skipif(detect_gpu() is not None, reason="a GPU is present")
def test_auto_without_a_gpu_runs_on_the_cpu_and_a_size_asks_for_a_device(cache):
    model = synth(cache, "silu")
    code, out, err = generate("--model", model, "--vram-budget", "auto")
    assert code == 0, err
    assert "no GPU was found: running on the CPU" in err
    (d,) = prepared_dirs(cache)
    man = json.loads((d / autofit.MANIFEST).read_text())
    assert man["files"]["plan"] is None and man["files"]["thresholds"]
    assert man["sparsity"] == "threshold"
    code, _, err = generate("--model", model, "--vram-budget", "1MiB")
    assert code == 2 and "--device gpu-sim" in err


def test_stage_tokens_shrink_with_the_model():
    assert autofit.stage_tokens(100 * 2**20) == autofit.FULL_TOKENS
    cal, prof = autofit.stage_tokens(4 * 2**30)  # a 7B Q4
    assert autofit.MIN_TOKENS <= (cal, prof) < autofit.FULL_TOKENS
    assert autofit.stage_tokens(10**12) == autofit.MIN_TOKENS


def test_a_mixture_of_experts_is_profiled_by_its_routed_bytes(cache):
    """A token of a mixture of experts costs its routed experts' bytes, not every expert's: the
    stages' token counts follow those (each expert then sees its share of many tokens)."""
    from powerinfer_rs.loading import load_model

    model = str(cache / "st.gguf")
    code, _, err = run(["synth", *SHAPE, "--vocab", "300", "--activation", "relu", "--arch",
                        "smallthinker", "--experts", "8", "--experts-used", "2", "--format",
                        "gguf-q8_0", "--out", model])  # fmt: skip
    assert code == 0, err
    m = load_model(model)
    total = sum(t.nbytes for t in m.tensors.values())
    exps = sum(t.nbytes for n, t in m.tensors.items() if n.endswith("_exps"))
    assert exps > total / 2
    assert autofit.token_bytes(m) == int(total - exps * 6 / 8)


def test_the_calibration_text_ships_with_its_licence():
    data = Path(autofit.CORPUS).parent
    assert autofit.CORPUS.stat().st_size > 100_000
    lic = (data / "CALIBRATION-LICENSE.txt").read_text()
    assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in lic
    assert os.fspath(autofit.CORPUS).endswith("calibration.txt")


def test_a_mixture_of_experts_plans_exact_relu_and_trains_experts_on_the_cpu(cache):
    """ReLU experts (SmallThinker): with a budget the GPU side runs them exact-relu (it has no
    predictors inside experts: none are trained, the plan is for exact-relu); on the CPU alone
    the predictors are trained per expert and run."""
    model = str(cache / "st.gguf")
    code, _, err = run(["synth", *SHAPE, "--vocab", "300", "--activation", "relu", "--arch",
                        "smallthinker", "--experts", "8", "--experts-used", "2", "--format",
                        "gguf-q8_0", "--out", model])  # fmt: skip
    assert code == 0, err
    hw = ["--vram-budget", "2MiB", "--device", "gpu-sim", "--hardware", fast_gpu(cache)]
    code, out, err = generate("--model", model, *hw)
    assert code == 0, err
    (d,) = prepared_dirs(cache)
    man = json.loads((d / autofit.MANIFEST).read_text())
    assert man["sparsity"] == "exact-relu" and man["files"]["predictors"] is None
    assert load_plan(d / "plan.safetensors").gpu_bytes > 0
    opts = autofit.read_prepared(d).engine_options()
    eng = Engine.from_pretrained(model, threads=2, device="gpu-sim", **opts)
    assert eng.gpu_info()["allocations"] == eng.plan.allocations
    assert out == eng.generate("the cat sat", max_new_tokens=8, temperature=0) + "\n"
    cpu = autofit.prepare(model, out=cache / "cpu", vram_budget="auto", device="cpu", quiet=True)
    assert cpu.sparsity == "predictor" and cpu.plan is None and cpu.predictors is not None
    man = json.loads((cache / "cpu" / autofit.MANIFEST).read_text())
    assert "train-predictors" in man["seconds"] and "plan" not in man["seconds"]
    eng = Engine.from_pretrained(model, threads=2, **cpu.engine_options())
    assert eng.sparsity == "predictor" and eng.predictors.experts  # planted gates: some pay
