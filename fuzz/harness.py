"""Shared plumbing of the Python fuzz targets (``fuzz/targets/*.py``).

A target module defines ``load() -> one_input`` (the imports of the parser happen inside
``load`` so atheris can instrument them) and ends with ``if __name__ == "__main__":
fuzz_main(load)`` (a target whose check is one reader's call takes its ``load`` from
:func:`file_reader`). ``one_input(data)`` feeds the bytes to one parser's public entry point; a
:class:`~powerinfer_rs.errors.PowerInferError` is the expected answer to bad bytes, anything
else escaping ``one_input`` (a raw ``ValueError``, ``KeyError``, ``MemoryError``, a crash or a
hang) is a finding.

``python fuzz/targets/NAME.py [libFuzzer flags] CORPUS_DIR...`` fuzzes under atheris;
``python fuzz/targets/NAME.py --replay FILE_OR_DIR...`` only runs the given inputs (no atheris
needed). The package is the checkout's ``python/`` when its extension is built there, else the
installed one.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

OneInput = Callable[[bytes], None]

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
# The checkout's package when its extension is built in place (a development tree), else the
# installed wheel (CI).
if any((REPO / "python" / "powerinfer_rs").glob("_core*.so")):
    sys.path.insert(0, str(REPO / "python"))

_TMP: Path | None = None


def tmp_dir() -> Path:
    """A private scratch folder for this process (in ``/dev/shm`` when there is one)."""
    global _TMP
    if _TMP is None:
        base = os.environ.get("POWERINFER_FUZZ_TMP")  # run.py's, removed after the run
        if base is None and os.path.isdir("/dev/shm"):
            base = "/dev/shm"
        _TMP = Path(tempfile.mkdtemp(prefix="pirs-fuzz-", dir=base))
        atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
    return _TMP


def write(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, unlinking the old file first: a memory map of the previous
    input may still be alive, and truncating a mapped file would turn its reads into SIGBUS."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    path.write_bytes(data)
    return path


def temp_file(name: str, data: bytes) -> Path:
    """``data`` written to ``<scratch>/name``."""
    return write(tmp_dir() / name, data)


def file_reader(module: str, reader: str, name: str) -> Callable[[], OneInput]:
    """The ``load`` of a target whose check is one call: ``module.reader`` on the input written
    to the scratch file ``name`` (the reader imported when ``load`` runs, inside atheris's
    instrumentation)."""

    def load() -> OneInput:
        read = getattr(importlib.import_module(module), reader)

        def one_input(data: bytes) -> None:
            read(temp_file(name, data))

        return one_input

    return load


def guarded(one_input: OneInput) -> OneInput:
    """``one_input`` with :class:`PowerInferError` counted as a correct answer, except
    :class:`InternalError` (a bug by definition: a caught Rust panic, a broken invariant)."""
    from powerinfer_rs.errors import InternalError, PowerInferError

    def run(data: bytes) -> None:
        try:
            one_input(data)
        except InternalError:
            raise
        except PowerInferError:
            pass

    return run


def replay(one_input: OneInput, paths: list[str]) -> int:
    """Run every file under ``paths``; returns how many inputs ran. Findings propagate."""
    run = guarded(one_input)
    n = 0
    for p in paths:
        files = sorted(f for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir() else [p]
        for f in files:
            run(Path(f).read_bytes())
            n += 1
    return n


def safetensors_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """A structure-aware libFuzzer mutator for safetensors files: besides plain byte mutations,
    mutate only the JSON header, only one ``__metadata__`` string (the plan's JSON lives in
    one), or only the tensor bytes, keeping the 8-byte header length consistent, so mutations
    reach the checks behind the header parse."""
    import json

    import atheris

    how = seed % 4
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if how == 0 or not 0 <= n <= len(data) - 8:
        return atheris.Mutate(data, max_size)
    header, body = data[8 : 8 + n], data[8 + n :]
    if how == 1:
        header = atheris.Mutate(header, max(len(header) * 2, 64))
    elif how == 2:
        try:
            doc = json.loads(header)
            meta = doc["__metadata__"]
            if not isinstance(meta, dict):  # a mutated header's list or scalar: plain mutation
                return atheris.Mutate(data, max_size)
            key = sorted(meta)[(seed >> 2) % len(meta)]
            raw = meta[key].encode()
            meta[key] = atheris.Mutate(raw, max(len(raw) * 2, 64)).decode("utf-8", "replace")
            header = json.dumps(doc).encode()
        # the mutator's own parse of a header it mutated (deep nesting included) is no finding
        except (
            ValueError,
            KeyError,
            IndexError,
            TypeError,
            AttributeError,
            ZeroDivisionError,
            RecursionError,
        ):
            return atheris.Mutate(data, max_size)
    else:
        body = atheris.Mutate(body, max(len(body) * 2, 64))
    out = len(header).to_bytes(8, "little") + header + body
    return out[:max_size]


def fuzz_main(load: Callable[[], OneInput], *, mutator: Callable | None = None) -> None:
    """The command line of a target (see the module docstring); ``mutator`` is an optional
    structure-aware libFuzzer mutator (e.g. :func:`safetensors_mutator`)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--replay":
        n = replay(load(), sys.argv[2:])
        print(f"replayed {n} inputs, no findings")
        return
    import atheris

    with atheris.instrument_imports(include=["powerinfer_rs"]):
        one_input = load()
    if mutator is None:
        atheris.Setup(sys.argv, guarded(one_input))
    else:
        atheris.Setup(sys.argv, guarded(one_input), custom_mutator=mutator)
    atheris.Fuzz()


#: The files of the prepared directory the ``prepared_dir`` target reads (and its seeds name):
#: relative path -> bytes; and the bytes of its model file.
PREPARED_FILES = {
    "thresholds.json": b'{"format": "thresholds", "layers": [0.5, 0.25]}\n',
    "plan.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
    "profile/counts.npy": bytes(range(64)),
}
PREPARED_MODEL = b"GGUF" + bytes(range(256)) * 4


def prepared_dir(root: Path) -> tuple[Path, Path, dict]:
    """Write :data:`PREPARED_FILES` into ``root/prep`` and :data:`PREPARED_MODEL` into
    ``root/model.gguf``; the directory, the model and the manifest that describes them (the
    ``prepared.json`` :func:`powerinfer_rs.runtime.autofit.prepare` would write)."""
    from powerinfer_rs.runtime import prepared

    d = root / "prep"
    for rel, data in PREPARED_FILES.items():
        write(d / rel, data)
    model = write(root / "model.gguf", PREPARED_MODEL)
    os.utime(model, ns=(10**18, 10**18))  # a fixed time: the seeds are the same every time
    manifest = {
        "format": prepared.MANIFEST_FORMAT,
        "model": "/models/model.gguf",
        "model_files": prepared.model_record(model),
        "key": {"fingerprint": "fp", "content": "c", "budget": "2097152"},
        "files": {"plan": "plan.safetensors", "thresholds": "thresholds.json", "predictors": None},
        "digests": prepared.file_digests(d),
        "sparsity": "threshold",
        "seconds": {"calibrate": 1.0},
        "corpus": "seed",
    }
    return d, model, manifest


def plan_shape():
    """The model the plan seeds are made for (``make_seeds.py``) and the plan target checks
    plans against: 2 layers of 16 neurons, fingerprint ``fp``."""
    from powerinfer_rs.loading.types import ModelConfig
    from powerinfer_rs.planning.model_shape import ModelShape

    sizes = dict(n_layers=2, dim=32, ffn_dim=16, n_heads=2, n_kv_heads=1, head_dim=16)
    rest = dict(vocab_size=64, max_context=64, rms_eps=1e-5, rope_theta=1e4, bos_token_id=None)
    cfg = ModelConfig(arch="llama", rope_style="norm", activation="relu", **sizes, **rest)
    return ModelShape.from_config(cfg, "Q8_0", fingerprint="fp")


#: The neuron-store target's model: a small synthetic ReLU llama in Q8_0 (three layers).
STORE_SHAPE = dict(dim=64, ffn=160, layers=3, heads=4, kv_heads=2, vocab=300)


def store_engine(root: Path):
    """An exact-relu engine on a small synthetic model and its neuron store's bytes (clusters of
    8), written under ``root``: the fixed files of the neuron-store target and its seeds."""
    from powerinfer_rs import Engine
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.testing.synth import write_gguf_model

    model = write_gguf_model(root / "store-model.gguf", dtype="Q8_0", activation="relu", seed=3,
                             **STORE_SHAPE)  # fmt: skip
    eng = Engine(load_model(model), threads=1, sparsity="exact-relu")
    store = eng.write_neuron_store(root / "valid.neurons", cluster=8)
    return eng, store.read_bytes()
