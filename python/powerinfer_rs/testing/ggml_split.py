"""Split a GGUF file as llama.cpp's ``gguf-split --split --split-max-tensors N`` does, with
ggml's own GGUF writer (``libggml-base`` of an installed llama-cpp-python, through ctypes): the
same calls as ``tools/gguf-split/gguf-split.cpp``'s ``split_strategy``, so the shards' headers
are ggml's bytes, not gguf-py's. For tests; llama-cpp-python ships no ``gguf-split`` binary.

What gguf-split does, step by step: the first shard's context takes every key of the input
(``gguf_set_kv``), each shard gets ``split.no`` (u16), ``split.count`` (u16) and
``split.tensors.count`` (i32); a new shard starts every N tensors (``--no-tensor-first-split``:
the first shard holds only the keys); each shard is its metadata (``gguf_get_meta_data``) then
each tensor's bytes padded with zeros to the default alignment (32), named by
``llama_split_path``.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from ..errors import UnsupportedError

GGUF_DEFAULT_ALIGNMENT = 32


class _InitParams(ctypes.Structure):
    """``struct gguf_init_params``: ``bool no_alloc; struct ggml_context ** ctx``."""

    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


def _ggml() -> ctypes.CDLL:
    """``libggml-base`` of the installed llama-cpp-python, its GGUF functions typed."""
    try:
        import llama_cpp
    except ImportError as e:
        raise UnsupportedError(f"splitting with ggml needs llama-cpp-python ({e})") from None
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    p, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    sigs = {
        "gguf_init_from_file": (p, [ctypes.c_char_p, _InitParams]),
        "gguf_init_empty": (p, []),
        "gguf_free": (None, [p]),
        "gguf_set_kv": (None, [p, p]),
        "gguf_set_val_u16": (None, [p, ctypes.c_char_p, ctypes.c_uint16]),
        "gguf_set_val_i32": (None, [p, ctypes.c_char_p, ctypes.c_int32]),
        "gguf_add_tensor": (None, [p, p]),
        "gguf_get_n_tensors": (i64, [p]),
        "gguf_get_tensor_name": (ctypes.c_char_p, [p, i64]),
        "gguf_get_tensor_offset": (sz, [p, i64]),
        "gguf_get_data_offset": (sz, [p]),
        "gguf_get_meta_size": (sz, [p]),
        "gguf_get_meta_data": (None, [p, p]),
        "ggml_get_tensor": (p, [p, ctypes.c_char_p]),
        "ggml_nbytes": (sz, [p]),
        "ggml_free": (None, [p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def _pad(n: int) -> int:
    return -(-n // GGUF_DEFAULT_ALIGNMENT) * GGUF_DEFAULT_ALIGNMENT


def ggml_split(src: str | os.PathLike[str], out_prefix: str, max_tensors: int, *,
               no_tensor_first_split: bool = False) -> list[Path]:  # fmt: skip
    """Split ``src`` into shards ``<out_prefix>-0000i-of-0000N.gguf`` of at most
    ``max_tensors`` tensors each, as gguf-split does; returns the shards in order."""
    lib = _ggml()
    meta = ctypes.c_void_p()
    ctx_in = lib.gguf_init_from_file(os.fsencode(src), _InitParams(True, ctypes.pointer(meta)))
    if not ctx_in:
        raise UnsupportedError(f"{src}: ggml cannot read it")
    n = lib.gguf_get_n_tensors(ctx_in)
    names = [lib.gguf_get_tensor_name(ctx_in, i) for i in range(n)]
    outs: list[tuple[ctypes.c_void_p, list[int]]] = []

    def new_out() -> None:
        ctx = lib.gguf_init_empty()
        if not outs:
            lib.gguf_set_kv(ctx, ctx_in)  # every key in the first shard only
        lib.gguf_set_val_u16(ctx, b"split.no", len(outs))
        lib.gguf_set_val_u16(ctx, b"split.count", 0)  # placeholder
        lib.gguf_set_val_i32(ctx, b"split.tensors.count", n)
        outs.append((ctx, []))

    new_out()
    if no_tensor_first_split:
        new_out()
    for i, name in enumerate(names):
        if 0 < i < n and i % max_tensors == 0:
            new_out()
        lib.gguf_add_tensor(outs[-1][0], lib.ggml_get_tensor(meta, name))
        outs[-1][1].append(i)
    paths = []
    with open(src, "rb") as f_in:
        for k, (ctx, members) in enumerate(outs):
            lib.gguf_set_val_u16(ctx, b"split.count", len(outs))
            path = Path(f"{out_prefix}-{k + 1:05d}-of-{len(outs):05d}.gguf")
            head = ctypes.create_string_buffer(lib.gguf_get_meta_size(ctx))
            lib.gguf_get_meta_data(ctx, head)
            with open(path, "wb") as out:
                out.write(head.raw)
                for i in members:
                    nbytes = lib.ggml_nbytes(lib.ggml_get_tensor(meta, names[i]))
                    f_in.seek(
                        lib.gguf_get_data_offset(ctx_in) + lib.gguf_get_tensor_offset(ctx_in, i)
                    )
                    out.write(f_in.read(nbytes))
                    out.write(b"\0" * (_pad(nbytes) - nbytes))
            paths.append(path)
            lib.gguf_free(ctx)
    lib.gguf_free(ctx_in)
    lib.ggml_free(meta)
    return paths
