"""Models by hub id: ``org/repo[:QUANT]`` fetched into the Hugging Face cache through
``huggingface_hub`` (the maintained client: its cache, its progress bars, its token handling).

:func:`resolve_model` is what every entry point calls on the model it is given: a local path
that exists is returned as it is (a path always wins over a hub id); an id is fetched and the
local path of what it names is returned (the first shard of a GGUF file, or the snapshot
directory of a safetensors repo). Which file a tag names is :mod:`.hub_files`' choice.

The client's own settings apply: ``HF_HOME`` / ``HF_HUB_CACHE`` (where the cache is),
``HF_HUB_OFFLINE=1`` (no network: only what the cache holds, listed from its snapshot),
``HF_TOKEN`` (gated and private repos), ``HF_HUB_DISABLE_PROGRESS_BARS``. Online, the repo's
file list comes from the hub; when the hub cannot be reached the cached snapshot is used, as
the client itself falls back. Everything that goes wrong is a :class:`HubError` saying what to
do (an UnsupportedError when ``huggingface_hub`` is not installed).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .._lazy import optional_import
from ..errors import HubError
from .hub_files import choose_gguf, gguf_candidates, hf_model_files

HUB_EXTRA = "pip install 'powerinfer-rs[hub]'"
#: ``[hf.co/]org/repo[:tag]``: the forms llama.cpp (``-hf``), Ollama (``hf.co/...``) and the
#: hub's own URLs take. A tag may be a quant or a file's path in the repo.
HUB_ID = re.compile(
    r"^(?:(?:https?://)?(?:hf\.co|huggingface\.co)/)?"
    r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?::(?P<tag>[^:]+))?$"
)


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """``(repo, tag or None)`` when ``spec`` reads as a hub id, else None. A spec that looks
    like a path (starting with ``/``, ``.`` or ``~``, or naming a ``.gguf`` file without a tag)
    is not an id."""
    if spec.startswith(("/", ".", "~")):
        return None
    m = HUB_ID.match(spec)
    if m is None or ".." in m["repo"] or "--" in m["repo"]:
        return None
    if m["tag"] is None and m["repo"].lower().endswith(".gguf"):
        return None
    return m["repo"], m["tag"]


def is_hub_id(spec: object) -> bool:
    """Whether ``spec`` is a string that is not an existing path and reads as a hub id."""
    return isinstance(spec, str) and not os.path.exists(spec) and parse_hub_id(spec) is not None


def resolve_model(spec: Any) -> Any:
    """The local path of the model ``spec`` names: ``spec`` itself unless it is a hub id that
    is not an existing path (:func:`is_hub_id`), else what :func:`fetch` returns."""
    if not is_hub_id(spec):
        return spec
    repo, tag = parse_hub_id(spec)  # type: ignore[misc]
    return str(fetch(repo, tag))


def client(purpose: str = "a model given by hub id (org/repo)") -> Any:
    """The ``huggingface_hub`` module with its ``constants`` and ``errors`` submodules loaded
    (the package loads them lazily); UnsupportedError saying how to install it if absent."""
    hub = optional_import("huggingface_hub", purpose, HUB_EXTRA)
    for sub in ("constants", "errors"):
        optional_import(f"huggingface_hub.{sub}", purpose, HUB_EXTRA)
    return hub


def _errors(hub: Any) -> Any:
    return hub.errors


def cache_dir(hub: Any) -> str:
    """The client's cache directory (``HF_HUB_CACHE``, else ``$HF_HOME/hub``), as its
    ``constants`` say now: passed to every call, so all of them use the same one."""
    return str(hub.constants.HF_HUB_CACHE)


def offline(hub: Any) -> bool:
    """Whether the client is in offline mode (``HF_HUB_OFFLINE``)."""
    is_offline = getattr(hub.constants, "is_offline_mode", None)
    return bool(is_offline() if callable(is_offline) else hub.constants.HF_HUB_OFFLINE)


def _hub_error(hub: Any, repo: str, e: Exception) -> HubError:
    """The :class:`HubError` of a client error about ``repo`` (None-free: always one)."""
    err = _errors(hub)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, err.GatedRepoError):
        return HubError(
            f"{repo} is gated: accept its terms on https://huggingface.co/{repo} and set HF_TOKEN "
            f"to a token of that account (hf auth login also stores one) ({first})"
        )
    if isinstance(e, err.RepositoryNotFoundError):
        return HubError(
            f"{repo}: no such model repo on the hub, or it is private (set HF_TOKEN to a token "
            f"that may read it); not a local path either ({first})"
        )
    if isinstance(e, err.RevisionNotFoundError):
        return HubError(f"{repo}: no such revision ({first})")
    return HubError(f"{repo}: {type(e).__name__}: {first}")


def _cached_files(hub: Any, repo: str, why: str, remedy: str) -> tuple[list[str], Path]:
    """The files the cache's snapshot of ``repo`` (its ``main``) holds, and the snapshot
    directory, as the client resolves it offline; a :class:`HubError` saying ``why`` the hub
    was not asked and the ``remedy`` when there is none."""
    try:
        folder = Path(hub.snapshot_download(repo, local_files_only=True, cache_dir=cache_dir(hub)))
    except _errors(hub).LocalEntryNotFoundError:
        raise HubError(
            f"{repo}: {why}, and the Hugging Face cache ({cache_dir(hub)}) has no "
            f"copy of it: {remedy}, or point HF_HOME at the cache that holds it"
        ) from None
    files = []
    for root, _, names in os.walk(folder):
        for n in names:
            p = Path(root) / n
            if p.exists():  # a link into blobs/ whose blob was removed is not there
                files.append(p.relative_to(folder).as_posix())
    return sorted(files), folder


def _repo_files(hub: Any, repo: str) -> tuple[list[str], Path | None]:
    """``(files, snapshot directory or None)``: the hub's list of the repo's files, or (offline
    or the hub unreachable) the cached snapshot's with its directory."""
    if offline(hub):
        return _cached_files(
            hub, repo, "offline (HF_HUB_OFFLINE is set)", "unset HF_HUB_OFFLINE to download it"
        )
    err = _errors(hub)
    try:
        info = hub.HfApi().model_info(repo)
    except (err.RepositoryNotFoundError, err.RevisionNotFoundError) as e:
        raise _hub_error(hub, repo, e) from None
    except Exception as e:  # the network or the hub is down: what the cache has
        why = f"the hub cannot be reached ({type(e).__name__}: {str(e)[:160]})"
        return _cached_files(hub, repo, why, "check the network connection and try again")
    return sorted(s.rfilename for s in info.siblings or []), None


def choose_files(repo: str, tag: str | None, files: list[str]) -> tuple[list[str], bool]:
    """``(files to fetch, whether the model is their directory)`` for ``repo:tag`` among the
    repo's ``files``: a GGUF choice (:func:`~.hub_files.choose_gguf`) where the repo has GGUF
    files, else a safetensors repo's files (no tag allowed)."""
    if gguf_candidates(files):
        return choose_gguf(repo, files, tag), False
    hf = hf_model_files(files)
    if hf is None:
        shown = ", ".join(files[:12]) + (", ..." if len(files) > 12 else "")
        raise HubError(
            f"{repo}: neither GGUF files nor a Hugging Face model (config.json + *.safetensors) "
            f"in the repo; it has: {shown or 'no files'}"
        )
    if tag is not None:
        raise HubError(
            f"{repo}: a safetensors repo, its weights are one model: drop the tag {tag!r}"
        )
    return hf, True


def fetch(repo: str, tag: str | None = None) -> Path:
    """Fetch what ``repo:tag`` names into the HF cache (every shard of a split GGUF file; a
    safetensors repo's configs, weights and tokenizer) with the client's progress bars, and
    return its local path: the GGUF file to open, or the snapshot directory."""
    hub = client()
    files, folder = _repo_files(hub, repo)
    try:
        chosen, is_dir = choose_files(repo, tag, files)
    except HubError as e:
        if folder is None:
            raise
        raise HubError(
            f"{e} (from the cached copy only, {folder}: online, the hub's list is "
            "searched and what is missing fetched)"
        ) from None
    if folder is not None:  # from the cache: every chosen file is there
        local = [folder / f for f in chosen]
    else:
        local = [_download(hub, repo, f) for f in chosen]
    return local[0].parent if is_dir else local[0]


def _download(hub: Any, repo: str, filename: str) -> Path:
    """One file of ``repo`` into the cache (the client's progress bar; nothing fetched when it
    is there already)."""
    try:
        return Path(hub.hf_hub_download(repo, filename, cache_dir=cache_dir(hub)))
    except Exception as e:
        raise _hub_error(hub, repo, e) from None
