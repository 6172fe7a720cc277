"""A prepared directory: what :func:`.autofit.prepare` writes, and the checks before it is used.

A directory is prepared when it holds ``prepared.json`` (the manifest, written last). The
manifest records:

* ``files``: the files the engine runs with (``plan``, ``thresholds``, ``predictors``; null
  when not made) and ``sparsity``, the mode they run in;
* ``digests``: the SHA-256 of every file the stages wrote (the profile's files included), by
  path relative to the directory. :func:`read_prepared` checks each one: a missing or edited
  file is a :class:`PlanError` naming it (and :func:`.autofit.prepare` prepares again, saying
  why), never a file used silently;
* ``key``: what it was prepared for (the model's fingerprint and :func:`content_digest`, the
  budget, hardware, context, KV precision, version, pipeline revision, token counts);
* ``model`` and ``model_files``: the model's absolute path when it was prepared, and the size,
  modification time and SHA-256 of each of its files (:func:`model_problem` checks a model
  against them).

The model is always the caller's (``--model``): the recorded path only serves ``--model DIR``,
where there is no other. A model moved or copied elsewhere with the same bytes keeps its
prepared directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ModelFileError, PlanError
from ..loading.gguf_split import model_file_paths

#: The file a complete prepared directory holds.
MANIFEST = "prepared.json"
#: The manifest's layout (1: no digests, never trusted now).
MANIFEST_FORMAT = 2
#: The largest manifest read (a real one is a few KiB).
MAX_MANIFEST_BYTES = 1 << 20
#: The sparsity modes a manifest may name.
SPARSITY_MODES = ("threshold", "predictor", "exact-relu")
#: The engine files a manifest names (each a path relative to the directory, or null).
ENGINE_FILES = ("plan", "thresholds", "predictors")
#: Blocks of :data:`BLOCK_BYTES` hashed per tensor by :func:`content_digest`.
STRIDE_BLOCKS = 64
BLOCK_BYTES = 4096
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Prepared:
    """A prepared directory: the files its stages wrote and how to run them. ``model`` is the
    model to run: the caller's when :func:`.autofit.prepare` returned it, the recorded one when
    read back by :func:`read_prepared`."""

    dir: Path
    model: str
    plan: Path | None
    thresholds: Path | None
    predictors: Path | None
    sparsity: str
    manifest: dict

    def engine_options(self) -> dict:
        """``Engine.from_pretrained`` keyword arguments that run it."""
        return {
            "plan": None if self.plan is None else str(self.plan),
            "sparsity": self.sparsity,
            "thresholds": None if self.thresholds is None else str(self.thresholds),
            "predictors": None if self.predictors is None else str(self.predictors),
        }

    def check_model(self, model: str | os.PathLike[str]) -> None:
        """Raise unless ``model`` is the one this directory was prepared from (same bytes; it
        may have moved): :class:`ModelFileError` when it is not there, :class:`PlanError` when
        it differs."""
        if not os.path.exists(model):
            raise ModelFileError(
                f"{self.dir} was prepared from {model}, which is not there (moved?): run it "
                f"with --model MODEL --plan {self.dir}"
            )
        why = model_problem(model, self.manifest["model_files"])
        if why is not None:
            raise PlanError(
                f"{self.dir} was prepared for another model ({why}); prepare it again "
                "(prepare --refresh)"
            )


def content_digest(tensors: dict[str, Any]) -> str:
    """A digest of the weights' bytes, a strided sample of each tensor: a tensor of up to
    ``STRIDE_BLOCKS * BLOCK_BYTES`` (256 KiB) bytes is hashed whole, a larger one in
    :data:`STRIDE_BLOCKS` blocks of :data:`BLOCK_BYTES` spread evenly from its first byte to
    its last.

    The trade-off: it reads at most 256 KiB per tensor (about 70 MB for a 7B model's 291
    tensors), so the auto-fit key costs tens of milliseconds where a whole-model hash costs a
    second per 1-1.5 GB (SmolLM2-135M Q4_1, 273 tensors, 121 MiB of weights, page cache warm,
    2 cores: 50-70 ms here, against 85-170 ms for its whole file; a 4 GB 7B model would take
    3-4 s whole, on every start). It sees every change to a tensor's
    shape or type, any rewrite of a small tensor, and in a large one any change that spans more
    than 1/63 of it (a quarter of every ``ffn_down`` rewritten is seen), but not a change
    confined to the gaps between blocks. Those are caught by the model's files' size and
    modification time (:func:`model_problem`, which hashes the whole file when either moved),
    unless a tool rewrote the bytes and then restored the old modification time."""
    h = hashlib.sha256()
    span = STRIDE_BLOCKS * BLOCK_BYTES
    for name in sorted(tensors):
        t = tensors[name]
        data = t.data
        n = int(data.size)
        h.update(f"{name}|{t.dtype}|{t.rows}|{t.cols}|{n}\n".encode())
        if n <= span:
            h.update(memoryview(data))
            continue
        last = n - BLOCK_BYTES
        for i in range(STRIDE_BLOCKS):
            start = i * last // (STRIDE_BLOCKS - 1)
            h.update(memoryview(data[start : start + BLOCK_BYTES]))
    return h.hexdigest()[:32]


def model_paths(model: str | os.PathLike[str]) -> list[Path]:
    """The files a model is read from: the file itself (every shard of a split GGUF given by
    its first), or every regular file (not hidden) directly inside a model directory, sorted by
    name."""
    p = Path(model)
    if not p.is_dir():
        return model_file_paths(p)
    return sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes (read in 4 MiB pieces)."""
    h = hashlib.sha256()
    buf = bytearray(4 << 20)
    view = memoryview(buf)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def model_record(model: str | os.PathLike[str]) -> list[dict]:
    """What the manifest records of a model's files: name, size, modification time and
    SHA-256 of each (the whole file: it is read once, beside stages that read it many
    times)."""
    out = []
    for f in model_paths(model):
        st = f.stat()
        size, mtime = st.st_size, st.st_mtime_ns
        out.append({"name": f.name, "size": size, "mtime_ns": mtime, "sha256": file_sha256(f)})
    return out


def model_problem(model: str | os.PathLike[str], record: list[dict]) -> str | None:
    """Why ``model`` is not the model of ``record`` (:func:`model_record`), or None when it
    is. A file whose size and modification time are the recorded ones is taken as unchanged
    (moving a file keeps both); otherwise its bytes are hashed and compared, so a copy is
    recognised and a rewrite at the same path is not missed. A match found by hashing updates
    ``record`` in place (the caller may save it, so that the next check is a ``stat``)."""
    try:
        files = model_paths(model)
        names = [f.name for f in files]
        if len(files) != len(record) or (
            Path(model).is_dir() and names != [r["name"] for r in record]
        ):  # a single file's name may change (moved, copied)
            return f"its files are {names}, not {[r['name'] for r in record]}"
        for f, r in zip(files, record):
            st = f.stat()
            if st.st_size != r["size"]:
                return f"{f} is {st.st_size} bytes, not {r['size']}"
            if st.st_mtime_ns == r["mtime_ns"]:
                continue
            if file_sha256(f) != r["sha256"]:
                return f"{f} has changed"
            r["mtime_ns"] = st.st_mtime_ns
    except OSError as e:
        return f"cannot read it: {e}"
    return None


def file_digests(d: Path) -> dict[str, str]:
    """The SHA-256 of every regular file under ``d`` (but the manifest and temporary files),
    by POSIX path relative to ``d``."""
    out = {}
    for f in sorted(d.rglob("*")):
        rel = f.relative_to(d).as_posix()
        if f.is_file() and rel != MANIFEST and not rel.endswith(".tmp"):
            out[rel] = file_sha256(f)
    return out


def write_manifest(d: Path, manifest: dict) -> None:
    """Write ``manifest`` as ``d``'s ``prepared.json`` atomically (a temporary file renamed)."""
    tmp = d / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2))
    tmp.replace(d / MANIFEST)


def _relative(d: Path, rel: Any, what: str) -> Path:
    """``d / rel`` for a manifest's relative path; a PlanError for anything that is not one
    (absolute, ``..``, empty, not a string)."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        raise PlanError(f"{what} is not a relative path: {rel!r}")
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or str(p) != rel:
        raise PlanError(f"{what} is not a plain relative path: {rel!r}")
    return d / rel


def _check_types(man: Any) -> None:
    """A PlanError naming the first field of a manifest with the wrong type."""

    def need(ok: bool, field: str, want: str) -> None:
        if not ok:
            raise PlanError(f"field {field!r} must be {want}")

    need(isinstance(man, dict), "(top)", "an object")
    need(man.get("format") == MANIFEST_FORMAT, "format", f"{MANIFEST_FORMAT} (an older layout)")
    need(isinstance(man.get("model"), str) and bool(man["model"]), "model", "a path")
    need(isinstance(man.get("key"), dict), "key", "an object")
    need(man.get("sparsity") in SPARSITY_MODES, "sparsity", f"one of {SPARSITY_MODES}")
    files = man.get("files")
    ok = isinstance(files, dict) and set(files) == set(ENGINE_FILES)
    need(ok, "files", "an object of plan, thresholds and predictors")
    digests = man.get("digests")
    need(isinstance(digests, dict), "digests", "an object")
    for v in digests.values():
        need(isinstance(v, str) and bool(_HEX64.match(v)), "digests", "SHA-256 hex digests")
    record = man.get("model_files")
    need(isinstance(record, list) and bool(record), "model_files", "a non-empty list")
    for r in record:
        need(isinstance(r, dict), "model_files", "a list of objects")
        need(isinstance(r.get("name"), str), "model_files.name", "a string")
        for k in ("size", "mtime_ns"):
            need(type(r.get(k)) is int and r[k] >= 0, f"model_files.{k}", "an integer >= 0")
        ok = isinstance(r.get("sha256"), str) and bool(_HEX64.match(r["sha256"]))
        need(ok, "model_files.sha256", "a SHA-256 hex digest")


def load_manifest(d: Path) -> dict:
    """``d``'s manifest, its fields' types checked; a PlanError saying what is wrong."""
    m = d / MANIFEST
    try:
        with open(m, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
        if len(raw) > MAX_MANIFEST_BYTES:
            raise PlanError(f"larger than {MAX_MANIFEST_BYTES} bytes")
        man = json.loads(raw)
        _check_types(man)
    except (OSError, ValueError, RecursionError) as e:  # PlanError is a ValueError
        raise PlanError(f"{m}: not a prepared directory's manifest ({e})") from None
    return man


def files_problem(d: Path, man: dict) -> str | None:
    """Why the files of ``d`` are not those its manifest records (missing, or not matching
    their digests: the first one named), or None when every one matches."""
    digests = man["digests"]
    for kind in ENGINE_FILES:
        rel = man["files"][kind]
        if rel is not None and rel not in digests:
            return f"the {kind} file {rel!r} has no digest"
    for rel, want in digests.items():
        f = _relative(d, rel, "a digested file")
        try:
            if not f.is_file():
                return f"{f} is not a regular file" if f.exists() else f"{f} is missing"
            got = file_sha256(f)
        except OSError as e:  # a name too long, a permission, an I/O error
            return f"{f} cannot be read ({e})"
        if got != want:
            return f"{f} does not match its digest in {MANIFEST} (edited or damaged)"
    return None


def checked(d: Path) -> Prepared:
    """The prepared directory ``d`` (its manifest present), every file checked against its
    digest; a PlanError saying what is wrong (``model`` is the recorded one)."""
    man = load_manifest(d)
    files = {
        k: (None if v is None else _relative(d, v, f"the {k} file"))
        for k, v in man["files"].items()
    }
    why = files_problem(d, man)
    if why is not None:
        raise PlanError(why)
    return Prepared(
        dir=d,
        model=man["model"],
        plan=files["plan"],
        thresholds=files["thresholds"],
        predictors=files["predictors"],
        sparsity=man["sparsity"],
        manifest=man,
    )


def read_prepared(path: str | os.PathLike[str]) -> Prepared | None:
    """The prepared directory at ``path``, its files checked against their digests, or None
    when ``path`` is not one (no manifest). A manifest that cannot be read or has wrong types,
    a missing file, or one that does not match its digest is a :class:`PlanError` naming it
    (prepare it again: ``prepare --refresh``). ``model`` is the recorded one."""
    d = Path(path)
    try:
        if not (d.is_dir() and (d / MANIFEST).is_file()):
            return None
    except (OSError, ValueError):  # a name the OS refuses
        return None
    try:
        return checked(d)
    except PlanError as e:
        raise PlanError(f"{d}: {e}; prepare it again (prepare --refresh)") from None
