"""The plan flags on every running command: generate, chat, perplexity and serve take
``--plan``, ``--device`` and ``--vram-budget`` and behave as the Python API does (the same
output, the same errors); ``--version`` prints the version."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from test_hybrid import SHAPE, plan_for

from powerinfer_rs import Engine, __version__, cli
from powerinfer_rs.loading import load_model

RUNNING = ("generate", "chat", "perplexity", "serve")


def run(argv: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if stdin is not None:
            import sys

            old, sys.stdin = sys.stdin, io.StringIO(stdin)
            try:
                code = cli.main(argv)
            finally:
                sys.stdin = old
        else:
            code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def model_and_plan(synth_gguf, tmp_path_factory):
    path = synth_gguf(dtype="Q8_0", seed=3, **SHAPE)
    model = load_model(path)
    plan = plan_for(model, tmp_path_factory.mktemp("cli_plan") / "half.safetensors", 0.5)
    return str(path), model, plan


@pytest.mark.parametrize("command", RUNNING)
def test_every_running_command_takes_the_plan_flags(command):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    flags = {s for a in sub._actions for s in a.option_strings}
    assert {"--plan", "--device", "--vram-budget"} <= flags


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"powerinfer-rs {__version__}"


def test_generate_runs_the_plan_as_the_api_does(model_and_plan):
    path, model, plan = model_and_plan
    prompt = "the cat sat on"
    want = Engine(model, threads=2, plan=plan, device="gpu-sim").generate(
        prompt, max_new_tokens=8, temperature=0
    )
    args = ["generate", "--model", path, "--threads", "2", "--prompt", prompt, "-n", "8"]
    code, out, err = run(args + ["--temperature", "0", "--plan", plan, "--device", "gpu-sim"])
    assert code == 0, err
    assert out == want + "\n"
    # A budget the plan fits in is taken, one it does not fit in refused as by the API.
    code, out2, _ = run(args + ["--temperature", "0", "--plan", plan, "--device", "gpu-sim",
                                "--vram-budget", "1GiB"])  # fmt: skip
    assert (code, out2) == (0, out)
    code, _, err = run(args + ["--plan", plan, "--device", "gpu-sim", "--vram-budget", "1KiB"])
    assert code == 2 and "VramBudgetError" in err


def test_the_cli_refuses_what_the_api_refuses(model_and_plan):
    path, model, plan = model_and_plan
    with pytest.raises(Exception) as api:
        Engine(model, threads=1, plan=plan, device="cpu")
    code, _, err = run(["generate", "--model", path, "--prompt", "x", "--plan", plan])
    assert code == 2
    assert err.strip() == f"error: {type(api.value).__name__}: {api.value}"


def test_chat_and_perplexity_run_the_plan(model_and_plan):
    path, model, plan = model_and_plan
    common = ["--model", path, "--threads", "2", "--plan", plan, "--device", "gpu-sim"]
    code, out, err = run(["chat", *common, "-n", "4", "--temperature", "0"], stdin="hello\n")
    assert code == 0 and out.strip(), err
    code, out, err = run(["perplexity", *common, "--text", "the cat sat on the mat", "-q"])
    assert code == 0, err
    cpu = Engine(model, threads=2, plan=plan, device="gpu-sim")
    ids = cpu.tokenizer.encode("the cat sat on the mat", add_bos=False)
    assert out.startswith(f"perplexity {cpu.perplexity_of_ids(ids, window=512):.4f} ")


def test_info_reports_family_formats_modes_and_a_plan_estimate(model_and_plan, synth_gguf):
    path, model, _ = model_and_plan
    code, out, err = run(["info", path, "--vram-budget", "1MiB", "--hardware", "rtx4090"])
    assert code == 0, err
    assert "family       llama (relu" in out and f"fingerprint  {model.fingerprint}" in out
    assert re.search(r"ffn_gate\s+Q8_0 x4\s", out), out
    assert re.search(r"exact-relu\s+yes", out) and re.search(r"predictor\s+yes", out)
    gpu = re.search(r"GPU\s+([\d.]+) (B|KiB|MiB):", out)
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    assert gpu and float(gpu.group(1)) * unit[gpu.group(2)] <= 2**20, out
    assert re.search(r"predicted\s+[\d.]+ tokens/s", out)
    silu = str(synth_gguf(dtype="F16", activation="silu"))
    code, out, _ = run(["info", silu])
    assert code == 0 and re.search(r"exact-relu\s+no", out) and "plan at" not in out
    code, _, err = run(["info", path, "--vram-budget", "lots"])
    assert code == 2 and err.startswith("error: ")
