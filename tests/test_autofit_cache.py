"""The auto-fit cache trusts neither its files nor its key (issue 57): every prepared file is
checked against the digest ``prepared.json`` records (an edited, deleted or damaged file, or a
broken manifest, is prepared again, saying so, or refused with a PlanError, never used or a raw
exception); the key sees a model changed at the same path; the model is always the caller's (a
moved model keeps its directory); ``prepare --out DIR`` checks DIR like the cache; budgets are
refused before any work; the cache honours ``XDG_CACHE_HOME``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from test_autofit import fast_gpu, generate, synth
from test_cli_plan_flags import run

from powerinfer_rs.errors import ModelFileError, PlanError
from powerinfer_rs.formats.plan import load_plan
from powerinfer_rs.loading.gguf_file import GGUFFile
from powerinfer_rs.runtime import autofit, prepared
from powerinfer_rs.runtime.default_model import cache_dir

BUDGET = "2MiB"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict:
    """A SiLU model (thresholds, profile and plan) and a ReLU one, each prepared once into a
    directory the tests copy before they change anything."""
    root = tmp_path_factory.mktemp("autofit-cache")
    hw = fast_gpu(root)
    out = {"root": root, "hw": hw}
    for act in ("silu", "relu"):
        model = synth(root, act)
        d = root / f"prep-{act}"
        autofit.prepare(model, BUDGET, device="gpu-sim", hardware=hw, out=d, quiet=True)
        out[act] = (model, d)
    return out


def prep(base: dict, model: str, out: Path, budget: str = BUDGET, **kw) -> prepared.Prepared:
    return autofit.prepare(
        model, budget, device="gpu-sim", hardware=base["hw"], out=out, quiet=True, **kw
    )


def copy_of(base: dict, tmp_path: Path, act: str = "silu") -> tuple[str, Path]:
    """A private copy of a prepared directory (its model is shared, unchanged)."""
    model, d = base[act]
    dst = tmp_path / "prep"
    shutil.copytree(d, dst)
    return model, dst


def stamps(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in d.rglob("*") if p.is_file()}


# --- budgets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "budget",
    ["1e30GiB", "-1", "-2MiB", "0", "0GiB", "0.1", "12parsecs", "", "  ", "nan", "inf",
     "1e400", "17TiB", "2MiB2", "0x10", 10**30, -5, 0, True, None, 1.5e300, float("nan"),
     [2**20]],
    ids=repr,
)  # fmt: skip
def test_a_nonsense_budget_is_refused_before_any_work(budget):
    """A model path that does not exist: were the model loaded (or a stage run) first, the
    error would be a ModelFileError."""
    t0 = time.perf_counter()
    with pytest.raises(PlanError, match="budget"):
        autofit.prepare("/nonexistent/model.gguf", budget, device="gpu-sim")
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize(
    "budget, want",
    [("auto", None), (" AUTO ", None), ("40MiB", 40 * 2**20), ("1.5 GiB", 3 * 2**29),
     (4096, 4096), ("16TiB", 2**44)],
)  # fmt: skip
def test_a_sane_budget_is_read(budget, want):
    assert autofit.check_budget(budget) == want


@pytest.mark.parametrize("command", ["prepare", "generate"])
def test_the_cli_refuses_a_nonsense_budget_at_once(tmp_path, monkeypatch, command):
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    argv = [command, "--model", str(tmp_path / "absent.gguf"), "--vram-budget", "1e30GiB",
            "--device", "gpu-sim"]  # fmt: skip
    if command == "generate":
        argv += ["--prompt", "x", "-q"]
    code, _, err = run(argv)
    assert code == 2 and "vram budget '1e30GiB' is more than 16.00 TiB" in err, err
    assert not (tmp_path / "cache" / "prepared").exists()


# --- prepared files and their digests -----------------------------------------------------


def test_a_prepared_directory_records_a_digest_of_every_file(base):
    model, d = base["silu"]
    man = json.loads((d / autofit.MANIFEST).read_text())
    assert man["format"] == prepared.MANIFEST_FORMAT
    assert {"thresholds.json", "plan.safetensors"} <= set(man["digests"])
    assert any(k.startswith("profile/") for k in man["digests"])
    for rel, digest in man["digests"].items():
        assert prepared.file_sha256(d / rel) == digest
    (rec,) = man["model_files"]
    assert rec["name"] == Path(model).name and rec["sha256"] == prepared.file_sha256(model)
    assert man["model"] == os.path.abspath(model)
    assert man["key"]["content"] == autofit.content_digest(_load(model).tensors)


def _load(model: str):
    from powerinfer_rs.loading import load_model

    return load_model(model)


def _profile_file(d: Path) -> str:
    man = json.loads((d / autofit.MANIFEST).read_text())
    return sorted(k for k in man["digests"] if k.startswith("profile/"))[0]


@pytest.mark.parametrize("what", ["thresholds.json", "plan.safetensors", "profile"])
@pytest.mark.parametrize("how", ["edited", "deleted", "truncated", "a directory"])
def test_a_changed_prepared_file_is_refused_and_prepared_again(base, tmp_path, capsys, what, how):
    """One edited byte in thresholds.json used to be used silently (blank answers)."""
    model, d = copy_of(base, tmp_path)
    rel = _profile_file(d) if what == "profile" else what
    f = d / rel
    if how == "edited":
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x01
        f.write_bytes(bytes(data))
    elif how == "deleted":
        f.unlink()
    elif how == "truncated":
        f.write_bytes(f.read_bytes()[:-1])
    else:
        f.unlink()
        f.mkdir()
    with pytest.raises(PlanError, match=rel.replace(".", r"\.")):
        autofit.read_prepared(d)
    code, _, err = generate("--model", str(d), "--device", "gpu-sim")
    assert code == 2 and rel in err and "prepare it again" in err, err
    if how != "edited":  # the reason is enough; the one rebuild below shows the rest
        man = json.loads((d / autofit.MANIFEST).read_text())
        assert autofit.reusable(d, man["key"], os.path.abspath(model))[1].endswith(
            {"deleted": "is missing", "truncated": "(edited or damaged)"}.get(how, "regular file")
        )
        return
    p = prep(base, model, d)
    err = capsys.readouterr().err
    assert f"{f}" in err and "preparing it again" in err and "prepared in" in err, err
    assert autofit.read_prepared(d).manifest["digests"] == p.manifest["digests"]
    if what == "thresholds.json":  # calibrate is deterministic: the same bytes again
        assert prepared.file_sha256(f) == prepared.file_sha256(base["silu"][1] / rel)


def _manifest_edits() -> dict:
    def set_(path: list, value):
        def edit(man: dict) -> dict:
            node = man
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = value
            return man

        return edit

    def drop(key: str):
        return lambda man: {k: v for k, v in man.items() if k != key}

    return {
        "files-a-list": set_(["files"], ["plan.safetensors"]),
        "unknown-sparsity": set_(["sparsity"], "fast"),
        "older-format": set_(["format"], 1),
        "no-digests": drop("digests"),
        "no-model-files": drop("model_files"),
        "digest-not-hex": set_(["digests", "thresholds.json"], "xyz"),
        "digests-a-list": set_(["digests"], []),
        "plan-outside": set_(["files", "plan"], "../plan.safetensors"),
        "plan-absolute": set_(["files", "plan"], "/etc/passwd"),
        "plan-not-digested": set_(["files", "plan"], "other.safetensors"),
        "digest-outside": set_(["digests", "../x"], "0" * 64),
        "model-a-number": set_(["model"], 3),
        "size-negative": lambda m: (m["model_files"][0].update(size=-1), m)[1],
        "size-a-float": lambda m: (m["model_files"][0].update(size=1.5), m)[1],
        "key-a-string": set_(["key"], "k"),
        "top-a-list": lambda m: [m],
    }


@pytest.mark.parametrize(
    "damage",
    ["truncated", "empty", "not-json", "not-utf8", "deep-nesting", "huge", *_manifest_edits()],
)
def test_a_broken_manifest_is_refused_and_prepared_again(base, tmp_path, capsys, damage):
    model, d = copy_of(base, tmp_path)
    m = d / autofit.MANIFEST
    raw = m.read_bytes()
    edits = _manifest_edits()
    if damage in edits:
        data = json.dumps(edits[damage](json.loads(raw))).encode()
    else:
        data = {
            "truncated": raw[: len(raw) // 2],
            "empty": b"",
            "not-json": b"plan = plan.safetensors\n",
            "not-utf8": b'{"model": "\xff\xfe"}',
            "deep-nesting": b"[" * 100_000,
            "huge": b" " * (prepared.MAX_MANIFEST_BYTES + 1) + raw,
        }[damage]
    m.write_bytes(data)
    with pytest.raises(PlanError, match="prepare it again"):
        autofit.read_prepared(d)
    if damage not in ("truncated", "plan-outside", "top-a-list"):  # the reason is enough
        key = json.loads(raw)["key"]
        assert autofit.reusable(d, key, os.path.abspath(model))[1]
        return
    p = prep(base, model, d)
    err = capsys.readouterr().err
    assert f"{d}: " in err and "preparing it again" in err and "prepared in" in err, err
    assert autofit.read_prepared(d).manifest["key"] == p.manifest["key"]


def test_an_intact_directory_is_reused_as_it_is(base, tmp_path, capsys):
    model, d = copy_of(base, tmp_path)
    before = stamps(d)
    p = prep(base, model, d)
    assert "auto-fit:" not in capsys.readouterr().err
    assert stamps(d) == before and p.model == os.path.abspath(model)


# --- the model ----------------------------------------------------------------------------


def _tensor_spans(model: str, part: str) -> list[tuple[int, int]]:
    return [(t.offset, t.nbytes) for t in GGUFFile(model).tensors if part in t.name]


def _rewrite(model: str, spans: list[tuple[int, int]], keep_mtime: bool) -> None:
    st = os.stat(model)
    with open(model, "r+b") as f:
        for off, n in spans:
            f.seek(off)
            data = bytearray(f.read(n))
            for i in range(len(data)):
                data[i] ^= 0x5A
            f.seek(off)
            f.write(data)
    if keep_mtime:
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("keep_mtime", [True, False], ids=["mtime-kept", "mtime-new"])
def test_a_model_partly_rewritten_at_the_same_path_is_seen(base, tmp_path, capsys, keep_mtime):
    """A quarter of every ffn_down rewritten (the old fingerprint sampled 3 x 64 bytes per
    tensor and returned the old directory); with the old modification time put back, the
    content digest alone sees it."""
    src, d = copy_of(base, tmp_path)
    model = str(tmp_path / "model.gguf")
    shutil.copy2(src, model)
    prep(base, model, d)  # the copy is recognised by its bytes
    capsys.readouterr()
    spans = [(off + n // 2, n // 4) for off, n in _tensor_spans(model, "ffn_down")]
    assert len(spans) == 4
    _rewrite(model, spans, keep_mtime)
    p = prep(base, model, d)
    err = capsys.readouterr().err
    assert "another model, or an older version of this one" in err and "prepared in" in err, err
    assert p.manifest["model_files"][0]["sha256"] == prepared.file_sha256(model)


def test_a_change_between_the_sampled_blocks_is_seen_by_the_files_hash(
    base, tmp_path, capsys, monkeypatch
):
    """A change the strided digest does not sample (here made coarse: 2 blocks of 64 bytes)
    is seen by the model file's new modification time and whole-file hash."""
    monkeypatch.setattr(prepared, "STRIDE_BLOCKS", 2)
    monkeypatch.setattr(prepared, "BLOCK_BYTES", 64)
    src, _ = base["silu"]
    model = str(tmp_path / "model.gguf")
    shutil.copy2(src, model)
    d = tmp_path / "prep"
    prep(base, model, d)
    key = json.loads((d / autofit.MANIFEST).read_text())["key"]
    ((off, n),) = _tensor_spans(model, "blk.1.ffn_down")
    _rewrite(model, [(off + n // 3, 16)], keep_mtime=False)  # no sample there
    assert autofit.content_digest(_load(model).tensors) == key["content"]
    capsys.readouterr()
    prep(base, model, d)
    err = capsys.readouterr().err
    assert "not the one it was prepared from" in err and "has changed" in err, err


def test_the_model_problem_check(tmp_path):
    f = tmp_path / "m.bin"
    f.write_bytes(b"abcdef" * 1000)
    rec = prepared.model_record(f)
    assert prepared.model_problem(f, rec) is None
    os.utime(f, ns=(0, 10**18))  # touched: hashed, the same bytes, the new time recorded
    assert prepared.model_problem(f, rec) is None and rec[0]["mtime_ns"] == 10**18
    f.write_bytes(b"abcdeX" * 1000)
    assert "has changed" in prepared.model_problem(f, rec)
    f.write_bytes(b"abc")
    assert "3 bytes" in prepared.model_problem(f, rec)
    f.unlink()
    assert "cannot read" in prepared.model_problem(f, rec)


def test_a_moved_model_keeps_its_prepared_directory(base, tmp_path, monkeypatch):
    """generate --model NEW --vram-budget ... used to fail with ModelFileError on the old
    path prepared.json recorded."""
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    src, _ = base["silu"]
    old = tmp_path / "old.gguf"
    shutil.copy2(src, old)
    hw = ["--vram-budget", BUDGET, "--device", "gpu-sim", "--hardware", base["hw"]]
    code, want, err = generate("--model", str(old), *hw)
    assert code == 0 and "prepared in" in err, err
    (d,) = (tmp_path / "cache" / "prepared").iterdir()
    new = tmp_path / "moved" / "new.gguf"
    new.parent.mkdir()
    os.rename(old, new)
    code, out, err = generate("--model", str(new), *hw)
    assert (code, out) == (0, want) and "auto-fit" not in err, err
    # A copy (a new modification time) too, recognised by its bytes.
    copy = tmp_path / "copy.gguf"
    shutil.copy(new, copy)
    code, out, err = generate("--model", str(copy), *hw)
    assert (code, out) == (0, want) and "auto-fit" not in err, err
    man = json.loads((d / autofit.MANIFEST).read_text())
    assert man["model_files"][0]["mtime_ns"] == copy.stat().st_mtime_ns
    # --model FILE --plan DIR runs FILE; --model DIR names the recorded model that is gone.
    code, out, err = generate("--model", str(new), "--plan", str(d), "--device", "gpu-sim")
    assert (code, out) == (0, want), err
    code, _, err = generate("--model", str(d), "--device", "gpu-sim")
    assert code == 2 and "which is not there" in err and "--plan" in err, err
    with pytest.raises(ModelFileError):
        autofit.read_prepared(d).check_model(autofit.read_prepared(d).model)


def test_a_plan_dir_for_another_model_is_refused(base):
    relu_model, _ = base["relu"]
    _, silu_dir = base["silu"]
    code, _, err = generate("--model", relu_model, "--plan", str(silu_dir), "--device", "gpu-sim")
    assert code == 2 and "prepared for another model" in err, err


# --- prepare --out DIR --------------------------------------------------------------------


def test_an_out_dir_for_another_budget_or_model_is_prepared_again(base, tmp_path, capsys):
    model, d = copy_of(base, tmp_path)
    p = prep(base, model, d, budget="3MiB")
    err = capsys.readouterr().err
    assert "another budget ('2097152', now '3145728')" in err and "prepared in" in err, err
    assert load_plan(p.plan).budget_bytes == 3 * 2**20
    relu_model, _ = base["relu"]
    p = prep(base, relu_model, d, budget="3MiB")
    err = capsys.readouterr().err
    assert "another model" in err and "prepared in" in err, err
    assert p.sparsity == "predictor" and p.thresholds is None
    assert set(p.manifest["digests"]) >= {"predictors.safetensors", "plan.safetensors"}
    assert "thresholds.json" not in p.manifest["digests"]  # the SiLU run's file, left there
    code, text, err = run(["prepare", "--model", relu_model, "--vram-budget", "3MiB", "--device",
                           "gpu-sim", "--hardware", base["hw"], "--out", str(d), "-q"])  # fmt: skip
    assert code == 0 and "auto-fit" not in err and str(d) in text, err


def test_an_out_path_that_is_a_file_is_a_plan_error(base, tmp_path):
    model, _ = base["silu"]
    (tmp_path / "file").write_text("mine")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(PlanError, match="cannot prepare into"):
            prep(base, model, out)
    assert (tmp_path / "file").read_text() == "mine"


def test_the_cache_prepares_a_changed_key_into_its_own_directory(base, tmp_path, monkeypatch):
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "cache"))
    model, _ = base["silu"]
    a = autofit.prepare(model, BUDGET, device="gpu-sim", hardware=base["hw"], quiet=True)
    b = autofit.prepare(model, "3MiB", device="gpu-sim", hardware=base["hw"], quiet=True)
    assert a.dir != b.dir and a.dir.parent == b.dir.parent == tmp_path / "cache" / "prepared"


# --- where the cache is -------------------------------------------------------------------


def test_the_cache_honours_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("POWERINFER_RS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "powerinfer_rs"
    assert autofit.prepared_root() == tmp_path / "xdg" / "powerinfer_rs" / "prepared"
    monkeypatch.setenv("POWERINFER_RS_CACHE", str(tmp_path / "own"))  # takes precedence
    assert cache_dir() == tmp_path / "own"
    monkeypatch.delenv("POWERINFER_RS_CACHE")
    for ignored in ("relative/cache", ""):  # the XDG rule: only an absolute path counts
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert cache_dir() == Path.home() / ".cache" / "powerinfer_rs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "powerinfer_rs"
