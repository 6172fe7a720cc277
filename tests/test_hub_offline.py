"""Hub ids resolved offline (``HF_HUB_OFFLINE=1``) through the real ``huggingface_hub`` client,
from a cache laid out exactly as it lays one out (blobs, refs/main, snapshots of symbolic
links); the ``models`` command on that cache; every error that needs no network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.cli import main
from powerinfer_rs.errors import HubError, UnsupportedError
from powerinfer_rs.hub_cache import list_models, remove_model
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.hub import client, resolve_model
from powerinfer_rs.testing.hf_cache_layout import add_to_hf_cache
from powerinfer_rs.testing.synth import write_gguf_model, write_hf_model

from conftest import SMALL

pytest.importorskip("huggingface_hub")
hub = client()  # with its constants and errors loaded
SPEC = dict(SMALL, seed=3)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The files the cached repos hold: a Q8_0 GGUF, an F32 one split in three, a safetensors
    directory in two shards."""
    d = tmp_path_factory.mktemp("hub_src")
    first = write_gguf_model(d / "split" / "tiny-F32.gguf", split_max_tensors=8, **SPEC)
    (d / "README.md").write_text("# tiny\n")
    return {
        "q8": write_gguf_model(d / "tiny-Q8_0.gguf", dtype="Q8_0", **SPEC),
        "split": first,
        "readme": d / "README.md",
        "hf": write_hf_model(d / "hf", dtype="f32", shards=2, **SPEC),
    }


@pytest.fixture
def home(sources, tmp_path, monkeypatch) -> Path:
    """``HF_HOME`` with the two repos cached, offline, for this process and its children."""
    home = tmp_path / "hf_home"
    cache = home / "hub"
    shards = sorted(sources["split"].parent.glob("tiny-F32-*.gguf"))
    assert len(shards) == 3
    files = {"tiny-Q8_0.gguf": sources["q8"], "README.md": sources["readme"]}
    files.update({f"F32/{p.name}": p for p in shards})
    add_to_hf_cache(cache, "acme/tiny-GGUF", files, COMMIT)
    hf = {p.name: p for p in sources["hf"].iterdir()}
    add_to_hf_cache(cache, "acme/tiny-hf", hf, HF_COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The client read both when it was imported: what it reads them into, for this process.
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    return home


def test_a_quant_resolves_to_the_clients_own_cached_file(home, sources):
    path = resolve_model("acme/tiny-GGUF:q8_0")
    snap = home / "hub" / "models--acme--tiny-GGUF" / "snapshots" / COMMIT
    assert path == str(snap / "tiny-Q8_0.gguf") and os.path.islink(path)
    # The client itself resolves the same file offline.
    assert hub.hf_hub_download("acme/tiny-GGUF", "tiny-Q8_0.gguf") == path
    ids = [5, 9, 17, 33]
    want = Engine(load_model(sources["q8"]), threads=1).logits(ids)
    assert np.array_equal(
        Engine.from_pretrained("acme/tiny-GGUF:Q8_0", threads=1).logits(ids), want
    )


def test_a_split_tag_loads_every_shard_and_no_tag_takes_q8_0(home, sources):
    loaded = load_model("acme/tiny-GGUF:f32")
    assert [Path(f).name for f in loaded.files] == [
        f"tiny-F32-{i:05d}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert Path(loaded.files[0]).parent.name == "F32"
    assert loaded.fingerprint == load_model(sources["split"]).fingerprint
    # No tag: Q4_K_M, else Q8_0 (llama.cpp's defaults), though F32/... sorts first.
    assert resolve_model("acme/tiny-GGUF").endswith("/tiny-Q8_0.gguf")


def test_a_safetensors_repo_is_its_snapshot_directory(home, sources):
    path = resolve_model("hf.co/acme/tiny-hf")
    assert path == str(home / "hub" / "models--acme--tiny-hf" / "snapshots" / HF_COMMIT)
    assert hub.snapshot_download("acme/tiny-hf") == path
    assert load_model(path).fingerprint == load_model(sources["hf"]).fingerprint


def test_offline_errors_say_what_to_do(home):
    with pytest.raises(
        HubError,
        match=r"acme/absent: offline \(HF_HUB_OFFLINE is set\), and the Hugging Face cache .* "
        r"has no copy of it: unset HF_HUB_OFFLINE",
    ):
        resolve_model("acme/absent:Q4_K_M")
    with pytest.raises(
        HubError,
        match=r"no GGUF file for the tag 'Q5_K_M'; the repo has F32, Q8_0 .*"
        r"from the cached copy only",
    ):
        resolve_model("acme/tiny-GGUF:Q5_K_M")


def test_models_list_and_rm(home):
    text = list_models(client())
    assert f"Hugging Face cache {home / 'hub'}: 2 models" in text
    assert "acme/tiny-GGUF  " in text and "    F32/tiny-F32-00002-of-00003.gguf  " in text
    assert "    run: --model acme/tiny-GGUF:Q8_0\n" in text + "\n"
    assert "    run: --model acme/tiny-GGUF:F32 (3 shards)" in text
    assert "acme/tiny-hf  " in text and "    model-00001-of-00002.safetensors  " in text
    with pytest.raises(HubError, match="removes a whole repo: models rm acme/tiny-GGUF"):
        remove_model(client(), "acme/tiny-GGUF:Q8_0")
    with pytest.raises(
        HubError, match=r"acme/nope is not in the Hugging Face cache .*acme/tiny-GGUF, acme/tiny-hf"
    ):
        remove_model(client(), "acme/nope")
    assert remove_model(client(), "acme/tiny-hf").startswith("removed acme/tiny-hf from ")
    assert not (home / "hub" / "models--acme--tiny-hf").exists()
    assert ": 1 models" in list_models(client())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "powerinfer_rs", *args],
        capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip


def test_the_command_line_reads_the_clients_environment(home):
    """A fresh process: HF_HOME and HF_HUB_OFFLINE read by the client itself."""
    r = _cli("generate", "--model", "acme/tiny-GGUF:Q8_0", "-p", "a b", "-n", "3",
             "--temperature", "0", "-q", "-t", "1")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = _cli("models", "list")
    assert r.returncode == 0 and "run: --model acme/tiny-GGUF:F32 (3 shards)" in r.stdout, r.stderr


def test_commands_take_hub_ids_and_say_what_is_wrong(home, capsys):
    assert main(["info", "acme/tiny-GGUF:F32"]) == 0
    assert "shards       3 files: tiny-F32-00001-of-00003.gguf (" in capsys.readouterr().out
    assert main(["perplexity", "--model", "acme/missing", "--text", "a b c"]) == 2
    err = capsys.readouterr().err
    assert "error: HubError: acme/missing: offline (HF_HUB_OFFLINE is set)" in err
    assert main(["models", "rm", "acme/tiny-hf"]) == 0
    assert "removed acme/tiny-hf" in capsys.readouterr().out


class _Info:
    """What ``HfApi.model_info`` returns, as far as the resolver reads it."""

    def __init__(self, files):
        self.siblings = [type("Sibling", (), {"rfilename": f})() for f in files]


def _online(monkeypatch, model_info):
    """Online, with the hub's answers stubbed: ``model_info`` (a function of the repo id) and
    ``hf_hub_download`` (which records its calls and answers from the cache)."""
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub.HfApi, "model_info", lambda self, repo, **kw: model_info(repo))
    calls, real = [], hub.hf_hub_download

    def download(repo, filename, **kw):
        calls.append(filename)
        monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)  # answer from the cache
        try:
            return real(repo, filename, **kw)
        finally:
            monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)

    monkeypatch.setattr(hub, "hf_hub_download", download)
    return calls


def test_online_every_shard_is_downloaded_in_order(home, monkeypatch):
    names = [f"F32/tiny-F32-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    calls = _online(monkeypatch, lambda repo: _Info(["README.md", "tiny-Q8_0.gguf", *names[::-1]]))
    path = resolve_model("acme/tiny-GGUF:F32")
    assert calls == names and path.endswith(names[0])
    assert load_model(path).files[2].endswith(names[2])


def test_online_errors_say_what_to_do(home, monkeypatch):
    def gated(repo):
        raise hub.errors.GatedRepoError("403 Client Error: access to the repo is restricted")

    _online(monkeypatch, gated)
    with pytest.raises(
        HubError, match=r"acme/g is gated: accept its terms on .*acme/g and set HF_TOKEN"
    ):
        resolve_model("acme/g")

    def missing(repo):
        raise hub.errors.RepositoryNotFoundError("401 Client Error: Repository Not Found")

    _online(monkeypatch, missing)
    with pytest.raises(
        HubError, match=r"acme/m: no such model repo on the hub, or it is private \(set HF_TOKEN"
    ):
        resolve_model("acme/m:Q4_K_M")

    def down(repo):
        raise ConnectionError("connection refused")

    _online(monkeypatch, down)  # the hub unreachable: the cache answers, else says so
    assert resolve_model("acme/tiny-GGUF:Q8_0").endswith("tiny-Q8_0.gguf")
    with pytest.raises(
        HubError,
        match=r"acme/x: the hub cannot be reached \(ConnectionError: connection refused\).*"
        r"check the network",
    ):
        resolve_model("acme/x")


def test_without_huggingface_hub_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(UnsupportedError, match=r"hub id .*pip install 'powerinfer-rs\[hub\]'"):
        resolve_model("acme/never-there")
    assert resolve_model("/no/such/file.gguf") == "/no/such/file.gguf"  # paths need no client
