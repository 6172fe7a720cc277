"""A Hugging Face cache directory laid out exactly as ``huggingface_hub`` lays it out, for tests
that resolve hub ids offline through the real client (``HF_HUB_OFFLINE=1``).

``<cache>/models--<org>--<name>/`` holds ``blobs/<etag>`` (each file's bytes once, named by
its etag: the SHA-256 for files stored in LFS, the git blob SHA-1 for the others),
``refs/main`` (the commit the branch points at, no newline) and ``snapshots/<commit>/<path>``,
each file a relative symbolic link into ``blobs/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

#: Files the hub stores in LFS (their etag is their SHA-256), as ``.gitattributes`` says.
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".model")


def etag(path: Path) -> str:
    """The hub's etag of a file: SHA-256 for an LFS file, else the git blob SHA-1."""
    data = path.read_bytes()
    if path.name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_to_hf_cache(cache: Path, repo_id: str, files: dict[str, Path], commit: str) -> Path:
    """Put ``files`` (path in the repo -> a local file to take the bytes of) into ``cache`` as
    the snapshot ``commit`` of model repo ``repo_id``, and point ``refs/main`` at it. Returns
    the snapshot directory."""
    repo_dir = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    blobs, snap = repo_dir / "blobs", repo_dir / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    for rel, src in files.items():
        blob = blobs / etag(Path(src))
        if not blob.exists():
            shutil.copyfile(src, blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snap
