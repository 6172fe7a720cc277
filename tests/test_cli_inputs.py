"""Every command on bad input: a missing, directory, unreadable or garbage file ends in one
``error: ...`` line on stderr and exit status 2 (no traceback); out-of-range numbers are
argparse errors naming the flag; HiGHS's banner stays off stdout unless ``--verbose``."""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import subprocess
import sys

import pytest

from powerinfer_rs import cli
from powerinfer_rs.stages import calibrate, evaluate, plan, profile, train_predictors
from powerinfer_rs.testing import synth

MAINS = {
    "calibrate": calibrate.main,
    "profile": profile.main,
    "train_predictors": train_predictors.main,
    "evaluate": evaluate.main,
    "plan": plan.main,
    "synth": synth.main,
    "cli": cli.main,
}


@pytest.fixture(scope="module")
def files(synth_gguf, tmp_path_factory):
    """A ReLU model, a corpus, thresholds, a profile with samples, predictors; bad inputs."""
    d = tmp_path_factory.mktemp("cli_inputs")
    model = str(synth_gguf("F32", activation="relu"))
    corpus = d / "corpus.txt"
    corpus.write_text(" ".join(["the cat sat on a mat and the dog ran"] * 200))
    f = {"model": model, "corpus": str(corpus), "out": str(d / "out")}
    f["thresholds"] = str(d / "t.json")
    assert (
        calibrate.main(
            ["--model", model, "--corpus", f["corpus"], "--tokens", "300", "--out", f["thresholds"]]
            + ["--quiet", "--heldout-fraction", "0"]
        )
        == 0
    )
    f["profile"] = str(d / "prof")
    argv = ["--model", model, "--corpus", f["corpus"], "--tokens", "300", "--out", f["profile"]]
    assert profile.main(argv + ["--samples", "--quiet", "--no-plot"]) == 0
    f["predictors"] = str(d / "p.safetensors")
    argv = ["--model", model, "--profile", f["profile"], "--out", f["predictors"]]
    assert train_predictors.main(argv + ["--epochs", "1", "--quiet"]) == 0
    bad = d / "bad"
    bad.mkdir()
    (bad / "dir").mkdir()
    (bad / "garbage").write_bytes(bytes(range(256)) * 8)
    (bad / "empty").write_bytes(b"")
    (bad / "locked").write_text("the cat sat")
    (bad / "locked").chmod(0)
    f["bad"] = {k: str(bad / k) for k in ("dir", "garbage", "empty", "locked")}
    f["bad"]["missing"] = str(bad / "missing")
    return f


def _argv(f: dict, stage: str) -> list[str]:
    """A command line of ``stage`` that runs on the good files."""
    out = os.path.join(f["out"], stage)
    m, c = f["model"], f["corpus"]
    return {
        "calibrate": ["--model", m, "--corpus", c, "--tokens", "100", "--out", out + ".json"],
        "profile": ["--model", m, "--corpus", c, "--tokens", "100", "--out", out, "--no-plot"]
        + ["--thresholds", f["thresholds"]],
        "train_predictors": ["--model", m, "--profile", f["profile"], "--out", out]
        + ["--epochs", "1"],
        "evaluate": ["--model", m, "--text", c, "--tokens", "100"]
        + ["--thresholds", f["thresholds"], "--predictors", f["predictors"]],
        "plan": ["--model", m, "--profile", f["profile"], "--vram-budget", "1MiB"]
        + ["--hardware", "rtx4090", "--out", out, "--predictors", f["predictors"]],
        "generate": ["generate", "--model", m, "--prompt", "x", "-n", "1"],
        "generate-thresholds": ["generate", "--model", m, "--prompt", "x", "-n", "1"]
        + ["--sparsity", "threshold", "--thresholds", f["thresholds"]],
        "generate-predictors": ["generate", "--model", m, "--prompt", "x", "-n", "1"]
        + ["--sparsity", "predictor", "--predictors", f["predictors"]],
        "perplexity": ["perplexity", "--model", m, "--file", c, "--max-tokens-scored", "20"],
        "chat": ["chat", "--model", m, "-n", "1"],
        "thresholds": ["thresholds", f["thresholds"], "--model", m],
    }[stage]


@contextlib.contextmanager
def unprivileged(paths: list[str], keep_locked: str):
    """As root (who reads files whatever their mode), run the block as the user ``nobody`` so
    a file of mode 000 is unreadable as it is for any user: ``paths`` and everything under them
    (but ``keep_locked``) are opened to others, and the directories above them made
    traversable, for the block only. As any other user: nothing to do."""
    if os.geteuid() != 0:
        yield
        return
    changed: list[tuple[str, int]] = []

    def grant(path: str, bits: int) -> None:
        mode = os.stat(path).st_mode
        if path != keep_locked and mode | bits != mode:
            changed.append((path, mode))
            os.chmod(path, stat.S_IMODE(mode | bits))

    rwx = stat.S_IROTH | stat.S_IWOTH | stat.S_IXOTH
    for path in paths:
        up = os.path.dirname(os.path.abspath(path))
        while up != os.path.dirname(up):
            grant(up, stat.S_IXOTH)
            up = os.path.dirname(up)
        if os.path.isfile(path):
            grant(path, stat.S_IROTH)
        for root, _, names in os.walk(path):
            grant(root, rwx)
            for name in names:
                grant(os.path.join(root, name), stat.S_IROTH)
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        for path, mode in reversed(changed):
            os.chmod(path, stat.S_IMODE(mode))


def _main(stage: str):
    return MAINS.get(stage, cli.main)


INPUTS = [
    ("calibrate", "--model"),
    ("calibrate", "--corpus"),
    ("profile", "--model"),
    ("profile", "--corpus"),
    ("profile", "--thresholds"),
    ("train_predictors", "--model"),
    ("train_predictors", "--profile"),
    ("evaluate", "--model"),
    ("evaluate", "--text"),
    ("evaluate", "--thresholds"),
    ("evaluate", "--predictors"),
    ("plan", "--model"),
    ("plan", "--profile"),
    ("plan", "--predictors"),
    ("plan", "--hardware"),
    ("generate", "--model"),
    ("generate-thresholds", "--thresholds"),
    ("generate-predictors", "--predictors"),
    ("perplexity", "--model"),
    ("perplexity", "--file"),
    ("chat", "--model"),
    ("thresholds", "--model"),
    ("thresholds", "FILE"),
]


@pytest.mark.parametrize("kind", ["missing", "dir", "garbage", "empty", "locked"])
@pytest.mark.parametrize("stage,flag", INPUTS)
def test_bad_input_file_is_one_error_line(files, capsys, monkeypatch, stage, flag, kind):
    if (stage, flag, kind) in {("perplexity", "--file", "garbage")}:
        pytest.skip("any bytes are a text to score (invalid UTF-8 replaced)")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # chat: no conversation
    argv = _argv(files, stage)
    assert _main(stage)(argv) == 0, "the good command line must run"
    capsys.readouterr()
    bad = files["bad"][kind]
    i = 1 if flag == "FILE" else argv.index(flag) + 1
    argv[i] = bad
    if kind == "locked":
        with unprivileged([files["model"], os.path.dirname(files["corpus"])], bad):
            with pytest.raises(PermissionError):
                open(bad, "rb").close()
            rc = _main(stage)(argv)
    else:
        rc = _main(stage)(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    if kind != "locked":  # the file named, or (a directory) something inside it
        assert os.path.basename(bad) in lines[0] or bad in lines[0], lines[0]


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300
    )


def test_bad_input_subprocess(files):
    for args in (
        ("powerinfer_rs", "generate", "--model", files["bad"]["missing"], "--prompt", "x"),
        ("powerinfer_rs", "perplexity", "--model", files["model"], "--file", files["bad"]["dir"]),
        ("powerinfer_rs.plan", "--model", files["bad"]["garbage"], "--profile", files["profile"])
        + ("--vram-budget", "0"),
        ("powerinfer_rs.calibrate", "--model", files["model"], "--corpus", files["bad"]["dir"])
        + ("--out", os.path.join(files["out"], "x.json")),
        ("powerinfer_rs.synth", "--out", os.path.join(files["bad"]["garbage"], "m.gguf"))
        + ("--format", "gguf-f32", "--dim", "64", "--ffn", "64", "--layers", "1"),
    ):
        out = _run(*args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2, (args, out.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, out.stderr)


BAD_NUMBERS = [
    ("calibrate", "--sparsity", "2.0"),
    ("calibrate", "--sparsity", "nan"),
    ("calibrate", "--tokens", "0"),
    ("calibrate", "--threads", "-1"),
    ("calibrate", "--heldout-fraction", "1.5"),
    ("profile", "--sample-tokens", "0"),
    ("profile", "--window", "-1"),
    ("train_predictors", "--recall", "1.5"),
    ("train_predictors", "--recall", "0"),
    ("train_predictors", "--max-bytes-fraction", "0"),
    ("train_predictors", "--max-bytes-fraction", "inf"),
    ("train_predictors", "--epochs", "0"),
    ("train_predictors", "--max-rows", "-5"),
    ("train_predictors", "--layers", "-1"),
    ("evaluate", "--recall-tokens", "0"),
    ("evaluate", "--threads", "-2"),
    ("plan", "--context", "0"),
    ("plan", "--time-limit", "nan"),
    ("plan", "--time-limit", "-1"),
    ("plan", "--mip-gap", "1"),
    ("plan", "--min-neurons", "-1"),
    ("plan", "--vram-budget", "-1"),
    ("plan", "--vram-budget", "lots"),
    ("generate", "--threads", "-1"),
    ("generate", "--ctx", "0"),
    ("generate", "--max-tokens", "-1"),
    ("generate", "--temperature", "-0.5"),
    ("generate", "--temperature", "nan"),
    ("generate", "--top-k", "-1"),
    ("generate", "--top-p", "1.5"),
    ("generate", "--top-p", "0"),
    ("generate", "--min-p", "-0.1"),
    ("generate", "--min-p", "1.5"),
    ("generate", "--typical-p", "0"),
    ("generate", "--typical-p", "1.1"),
    ("generate", "--repetition-penalty", "0"),
    ("perplexity", "--window", "1"),
    ("perplexity", "--max-tokens-scored", "-1"),
    ("chat", "--threads", "-1"),
    ("chat", "--top-p", "2"),
]


@pytest.mark.parametrize("stage,flag,value", BAD_NUMBERS)
def test_bad_number_names_the_flag(files, capsys, stage, flag, value):
    argv = _argv(files, stage)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    try:  # argparse exits; plan's own checks return 2 after one line
        rc = _main(stage)(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert re.search(rf"(argument |error: ){flag}[:/ ]", err), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "flag,value",
    [("--dim", "0"), ("--layers", "-1"), ("--active", "1.5"), ("--vocab", "x"), ("--heads", "0")],
)
def test_synth_bad_numbers(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        synth.main(["--out", str(tmp_path / "m.gguf"), "--format", "gguf-f32", flag, value])
    assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_synth_bad_shape_is_one_error_line(tmp_path, capsys):
    argv = ["--out", str(tmp_path / "m.gguf"), "--format", "gguf-f32", "--dim", "64"]
    argv += ["--heads", "3"]
    assert synth.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_highs_banner_silent_unless_verbose(files):
    pytest.importorskip("highspy")
    argv = ("powerinfer_rs.plan", "--model", files["model"], "--profile", files["profile"])
    argv += ("--vram-budget", "1MiB", "--hardware", "rtx4090", "--solver", "highs")
    argv += ("--out", os.path.join(files["out"], "banner.safetensors"))
    for extra in (("--quiet",), ()):
        out = _run(*argv, *extra)
        assert out.returncode == 0, out.stderr
        assert "HiGHS" not in out.stdout and "HiGHS" not in out.stderr, out.stdout
    out = _run(*argv, "--verbose")
    assert out.returncode == 0 and "Running HiGHS" in out.stdout


# --------------------------------------------------------------------------- modes and plans
def test_threshold_file_without_mode_selects_it(files, capsys):
    argv = _argv(files, "generate") + ["--thresholds", files["thresholds"], "--quiet"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("note: --thresholds given: using --sparsity threshold") == 1, err
    # the file is read, not ignored: a bad one is refused
    argv[argv.index("--thresholds") + 1] = files["bad"]["garbage"]
    assert cli.main(argv) == 2
    assert "\nerror: ModelFileError:" in capsys.readouterr().err


def test_kv_cache_option_reaches_the_engine(files, capsys, monkeypatch):
    from powerinfer_rs.runtime.engine import Engine

    seen = []
    real = Engine.from_pretrained.__func__

    def spy(cls, *args, **kw):
        eng = real(cls, *args, **kw)
        seen.append(eng.kv_cache)
        return eng

    monkeypatch.setattr(Engine, "from_pretrained", classmethod(spy))
    for extra, want in (([], "f16"), (["--kv-cache", "f32"], "f32")):
        assert cli.main(_argv(files, "generate") + extra + ["--quiet"]) == 0
        assert seen[-1] == want
    with pytest.raises(SystemExit):
        cli.main(_argv(files, "generate") + ["--kv-cache", "q5_1"])
    assert "invalid choice" in capsys.readouterr().err


def test_min_p_and_typical_p_reach_the_engine(files, monkeypatch):
    from powerinfer_rs.runtime.engine import Engine

    seen = []
    real = Engine.stream_tokens

    def spy(self, prompt, **kw):
        seen.append((kw["min_p"], kw["typical_p"]))
        return real(self, prompt, **kw)

    monkeypatch.setattr(Engine, "stream_tokens", spy)
    assert cli.main(_argv(files, "generate") + ["--quiet"]) == 0
    assert cli.main(_argv(files, "generate") + ["--min-p", "0.1", "--typical-p", "0.9"]) == 0
    assert seen == [(0.0, 1.0), (0.1, 0.9)]


def test_predictor_file_without_mode_selects_it(files, capsys):
    argv = _argv(files, "generate") + ["--predictors", files["predictors"], "--quiet"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().err.count("using --sparsity predictor") == 1
    assert cli.sparsity_mode(None, None, None) is None


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--thresholds", "T", "--predictors", "P"], "both given"),
        (["--sparsity", "dense", "--thresholds", "T"], "--thresholds is used only with"),
        (["--sparsity", "threshold", "--thresholds", "T", "--predictors", "P"], "--predictors"),
        (["--sparsity", "exact-relu", "--predictors", "P"], "--predictors is used only with"),
    ],
)
def test_files_the_mode_would_ignore_are_refused(files, capsys, extra, message):
    extra = [
        files["thresholds"] if x == "T" else files["predictors"] if x == "P" else x for x in extra
    ]
    assert cli.main(_argv(files, "generate") + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PlanError:") and message in err and err.count("\n") == 1, err


def test_plan_kv_cache_sized_from_the_models_context(files, capsys):
    from powerinfer_rs.formats.plan import load_plan
    from powerinfer_rs.loading import load_model

    max_ctx = load_model(files["model"]).config.max_context
    assert max_ctx < 4096  # else the two cases below are the same
    out = os.path.join(files["out"], "ctx.safetensors")
    argv = _argv(files, "plan")
    argv[argv.index("--out") + 1] = out
    assert plan.main(argv) == 0
    assert load_plan(out).context == max_ctx
    assert plan.main(argv + ["--context", str(10 * max_ctx)]) == 0
    assert f"KV cache sized for {max_ctx}" in capsys.readouterr().out
    assert load_plan(out).context == max_ctx
    assert plan.main(argv + ["--context", "64"]) == 0
    assert load_plan(out).context == 64


def test_unreadable_model_is_a_typed_error_from_the_api(files):
    from powerinfer_rs import Engine
    from powerinfer_rs.errors import ModelFileError
    from powerinfer_rs.loading import load_model

    locked = files["bad"]["locked"]
    # the file itself unreadable, then a directory on its way that may not be entered
    for opened in ([files["model"], os.path.dirname(locked)], [files["model"]]):
        with unprivileged(opened, locked):
            for load in (load_model, Engine.from_pretrained):
                with pytest.raises(ModelFileError, match="cannot read"):
                    load(locked)


# -- the Python API follows the command line's rule for files given without their mode ---------


def test_api_file_without_mode_selects_it_and_says_so(files):
    from powerinfer_rs import Engine

    for arg, mode in (("thresholds", "threshold"), ("predictors", "predictor")):
        with pytest.warns(UserWarning, match=f"{arg}= given: using sparsity= {mode}") as rec:
            eng = Engine.from_pretrained(files["model"], **{arg: files[arg]})
        assert eng.sparsity == mode and len(rec) == 1
        assert rec[0].filename == __file__  # said at the caller's line


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"thresholds": "T", "predictors": "P"}, "both given"),
        ({"sparsity": "dense", "thresholds": "T"}, "thresholds= is used only with"),
        ({"sparsity": "threshold", "thresholds": "T", "predictors": "P"}, "predictors="),
        ({"sparsity": "exact-relu", "predictors": "P"}, "predictors= is used only with"),
    ],
)
def test_api_files_the_mode_would_ignore_are_refused(files, kwargs, message):
    from powerinfer_rs import Engine
    from powerinfer_rs.errors import PlanError
    from powerinfer_rs.loading import load_model

    kw = {
        k: files["thresholds"] if v == "T" else files["predictors"] if v == "P" else v
        for k, v in kwargs.items()
    }
    with pytest.raises(PlanError, match=message):
        Engine.from_pretrained(files["model"], **kw)
    with pytest.raises(PlanError, match=message):
        Engine(load_model(files["model"]), **kw)
    eng = Engine.from_pretrained(files["model"])
    if "sparsity" in kw:
        with pytest.raises(PlanError, match=message):
            eng.set_sparsity(**{"mode": kw.pop("sparsity")}, **kw)
    assert eng.sparsity == "dense"
