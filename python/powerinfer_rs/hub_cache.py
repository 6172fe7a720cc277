"""``python -m powerinfer_rs models list | rm org/repo``: the models the Hugging Face cache
holds (fetched by hub id, :mod:`.loading.hub`, or by any other client sharing the cache), and
removing one.

``list`` prints each model repo with its size on disk and its files, and for each GGUF file in
it the id that runs it (``org/repo:QUANT``); it reads the cache with ``huggingface_hub``'s own
scanner (``scan_cache_dir``), so ``HF_HOME`` / ``HF_HUB_CACHE`` say where it is. ``rm`` deletes
every revision of a repo through the scanner's delete strategy (its blobs, snapshots and refs)
and says how much it freed.
"""

from __future__ import annotations

import argparse
from typing import Any

from .errors import HubError
from .loading.hub import cache_dir, client, parse_hub_id
from .loading.hub_files import gguf_candidates
from .planning.sizes import format_bytes


def _scan(hub: Any) -> tuple[str, list[Any]]:
    """(the cache directory, its model repos by id); none when the cache does not exist."""
    cache = cache_dir(hub)
    try:
        info = hub.scan_cache_dir(cache)
    except hub.errors.CacheNotFound:
        return cache, []
    repos = [r for r in info.repos if r.repo_type == "model"]
    return cache, sorted(repos, key=lambda r: r.repo_id.lower())


def _files(repo: Any) -> list[tuple[str, int]]:
    """(path in the repo, bytes) of every file of every cached revision, once each."""
    out: dict[str, int] = {}
    for rev in repo.revisions:
        for f in rev.files:
            out[f.file_path.relative_to(rev.snapshot_path).as_posix()] = f.size_on_disk
    return sorted(out.items())


def repo_lines(repo: Any) -> list[str]:
    """The lines ``list`` prints for one cached repo: its id and size, its files with their
    sizes, and the hub id of each GGUF model in it."""
    files = _files(repo)
    lines = [f"{repo.repo_id}  {format_bytes(repo.size_on_disk)}, {len(files)} files"]
    lines += [f"    {name}  {format_bytes(size)}" for name, size in files]
    try:
        cands = gguf_candidates([name for name, _ in files])
    except HubError:  # an incomplete split: its files are listed above
        cands = []
    for c in cands:
        tag = c.label or c.first
        shards = f" ({len(c.files)} shards)" if len(c.files) > 1 else ""
        lines.append(f"    run: --model {repo.repo_id}:{tag}{shards}")
    return lines


def list_models(hub: Any) -> str:
    """The text of ``models list``."""
    cache, repos = _scan(hub)
    total = sum(r.size_on_disk for r in repos)
    head = f"Hugging Face cache {cache}: {len(repos)} models, {format_bytes(total)}"
    if not repos:
        return head + "\n(fetch one with --model org/repo[:QUANT] on any command)"
    return "\n".join([head, *(line for r in repos for line in repo_lines(r))])


def remove_model(hub: Any, spec: str) -> str:
    """Delete every cached revision of the repo ``spec`` names; returns what was freed.
    :class:`HubError` for a tag (a repo is removed whole) or a repo the cache lacks."""
    parsed = parse_hub_id(spec)
    if parsed is None:
        raise HubError(f"{spec!r} is not a hub id (org/repo)")
    repo_id, tag = parsed
    if tag is not None:
        raise HubError(f"models rm removes a whole repo: models rm {repo_id} (without :{tag})")
    cache, repos = _scan(hub)
    found = [r for r in repos if r.repo_id.lower() == repo_id.lower()]
    if not found:
        have = ", ".join(r.repo_id for r in repos) or "nothing"
        raise HubError(f"{repo_id} is not in the Hugging Face cache {cache} (it holds: {have})")
    repo = found[0]
    strategy = hub.scan_cache_dir(cache).delete_revisions(*(r.commit_hash for r in repo.revisions))
    strategy.execute()
    freed = format_bytes(strategy.expected_freed_size)
    return f"removed {repo.repo_id} from {cache}: {freed} freed"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``models``' subcommands: ``list`` and ``rm REPO``."""
    sub = p.add_subparsers(dest="models_command", required=True, metavar="list|rm")
    sub.add_parser("list", help="the models the Hugging Face cache holds, their sizes and files")
    rm = sub.add_parser("rm", help="remove a model repo from the Hugging Face cache")
    rm.add_argument("repo", help="the repo id, org/repo")


def cmd_models(a: argparse.Namespace) -> int:
    """Run ``models list`` or ``models rm``."""
    hub = client("the models command")
    if a.models_command == "list":
        print(list_models(hub))
    else:
        print(remove_model(hub, a.repo))
    return 0
