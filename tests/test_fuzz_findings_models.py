"""Regression tests of the fuzzing findings (``fuzz/``) in the model-file readers: PyTorch
``.pt`` zips, PowerInfer's GGUF, GGUF / Hugging Face configs. Each input that escaped as an
untyped exception, a hang or a silent NaN must now end in a typed :class:`PowerInferError`
(the sample shards, zips as well, are here with the ``.pt`` files)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.formats.samples import SampleWriter, load_samples, shard_path
from powerinfer_rs.loading.torch_pt import load_pt, save_pt

from _helpers import toy_config


def _patch_central(data: bytes, offset: int, value: bytes) -> bytes:
    """``data`` (a zip) with ``value`` written at ``offset`` of every central directory
    record."""
    out = bytearray(data)
    pos = out.find(b"PK\x01\x02")
    while pos >= 0:
        out[pos + offset : pos + offset + len(value)] = value
        pos = out.find(b"PK\x01\x02", pos + 4)
    return bytes(out)


def _deflated_garbage(data: bytes) -> bytes:
    """``data`` (a zip) rewritten with every member deflated and its stream's first byte set
    to an invalid block type."""
    src = zipfile.ZipFile(io.BytesIO(data))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    out = bytearray(buf.getvalue())
    pos = out.find(b"PK\x03\x04")
    while pos >= 0:
        n_name = int.from_bytes(out[pos + 26 : pos + 28], "little")
        n_extra = int.from_bytes(out[pos + 28 : pos + 30], "little")
        out[pos + 30 + n_name + n_extra] = 0xFF  # BTYPE 11: reserved, zlib refuses it
        pos = out.find(b"PK\x03\x04", pos + 4)
    return bytes(out)


#: (what, zip mutation): each made load_pt / np.load raise an untyped exception before the fix.
BAD_ZIPS = [
    # found by fuzz_torch_pt / fuzz_powerinfer_dirs: NotImplementedError("zip file version 25.5")
    ("zip version", lambda b: _patch_central(b, 6, b"\xff")),
    # RuntimeError("File ... is encrypted, password required for extraction")
    ("encrypted", lambda b: _patch_central(b, 8, b"\x01")),
    # zlib.error("Error -3 while decompressing data: invalid block type")
    ("bad deflate", _deflated_garbage),
]


@pytest.mark.parametrize("what,mutate", BAD_ZIPS, ids=[w for w, _ in BAD_ZIPS])
def test_malformed_pt_zip_is_model_file_error(tmp_path, what, mutate):
    good = save_pt(tmp_path / "x.pt", {"w": np.ones((2, 3), np.float32)}).read_bytes()
    bad = tmp_path / "bad.pt"
    bad.write_bytes(mutate(good))
    with pytest.raises(ModelFileError, match="pt"):
        load_pt(bad)


@pytest.mark.parametrize("what,mutate", BAD_ZIPS, ids=[w for w, _ in BAD_ZIPS])
def test_malformed_sample_shard_is_model_file_error(tmp_path, what, mutate):
    with SampleWriter(tmp_path, 1, 4, 8, shard_rows=2) as w:
        w.add(0, np.ones((2, 4), np.float32), np.eye(2, 8, dtype=bool))
    shard = shard_path(tmp_path / "samples", 0, 0)
    shard.write_bytes(mutate(shard.read_bytes()))
    with pytest.raises(ModelFileError, match="malformed sample shard"):
        load_samples(tmp_path, 0)


def _pt_with_view(path: Path, size: tuple[int, ...], stride: tuple[int, ...]) -> Path:
    """A .pt file holding one float32 tensor of 4 stored elements viewed with ``size`` and
    ``stride`` (written opcode by opcode as ``save_pt`` does)."""
    from powerinfer_rs.loading import pickle_ops as po

    pid = po.tuple_op(
        [
            po.unicode_op("storage"),
            po.global_op("torch", "FloatStorage"),
            po.unicode_op("0"),
            po.unicode_op("cpu"),
            po.int_op(4),
        ]
    )
    args = po.tuple_op(
        [
            pid + b"Q",
            po.int_op(0),
            po.tuple_op([po.int_op(d) for d in size]),
            po.tuple_op([po.int_op(s) for s in stride]),
            b"\x89",
            po.global_op("collections", "OrderedDict") + b")R",
        ]
    )
    pkl = b"\x80\x02" + po.global_op("torch._utils", "_rebuild_tensor_v2") + args + b"R."
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("t/data.pkl", pkl)
        zf.writestr("t/data/0", np.arange(4, dtype=np.float32).tobytes())
    return path


def test_pt_expanded_view_is_refused(tmp_path):
    """A stride-0 view let a 300-byte file ask for a 1.6 GB tensor (a memory blow-up, the
    fuzzer's out-of-memory kind of finding); now only views within the storage load."""
    ok = load_pt(_pt_with_view(tmp_path / "ok.pt", (2, 2), (2, 1)))
    assert ok.tolist() == [[0, 1], [2, 3]]
    with pytest.raises(ModelFileError, match="more elements than its storage"):
        load_pt(_pt_with_view(tmp_path / "big.pt", (20_000, 20_000), (0, 0)))


def test_powerinfer_gguf_non_finite_values_are_typed_errors(tmp_path):
    """A PWRI file whose sparse threshold or predictor weights are NaN / infinite used to load,
    and its predictor then skipped every neuron silently (``idx >= nan`` is never true)."""
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import random_predictors, write_powerinfer_gguf

    shape = dict(dim=8, ffn=16, layers=1, heads=2, kv_heads=1, vocab=260)
    nan_thr = write_powerinfer_gguf(tmp_path / "t.gguf", **shape, sparse_threshold=float("nan"))
    with pytest.raises(ModelFileError, match="sparse_threshold must be a finite number"):
        load_powerinfer_gguf(nan_thr)
    preds = random_predictors(1, 8, 16, 2)
    preds[0].fc2[3, 1] = np.inf
    inf_w = write_powerinfer_gguf(tmp_path / "w.gguf", **shape, predictors=preds)
    with pytest.raises(ModelFileError, match="non-finite predictor weights"):
        load_powerinfer_gguf(inf_w)


@pytest.mark.parametrize("key", ["rms_eps", "rope_theta"])
def test_infinite_norm_eps_or_rope_base_is_a_shape_error(key):
    """``llama.attention.layer_norm_rms_epsilon`` / ``llama.rope.freq_base`` = inf passed the
    ``> 0`` check (norms then output zeros)."""
    from powerinfer_rs.errors import ShapeError

    cfg = toy_config(n_layers=1, vocab_size=260, max_context=64, activation="relu")
    cfg.validate()
    with pytest.raises(ShapeError, match="positive and finite"):
        cfg.replace(**{key: float("inf")}).validate()


def test_non_ascii_digit_layer_names_are_typed_errors(tmp_path):
    """``"²".isdigit()`` is true but ``int("²")`` raises ValueError: a tensor ``blk.².fc1``
    used to escape as a raw ValueError from both predictor readers."""
    from safetensors.numpy import save_file

    from powerinfer_rs.formats.predictors import FORMAT, load_predictors
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import random_predictors, write_powerinfer_gguf

    p = tmp_path / "p.safetensors"
    one = np.ones((1, 1), np.float32)
    save_file({"blk.².fc1": one}, str(p), {"format": FORMAT})
    with pytest.raises(ModelFileError, match="unexpected tensor"):
        load_predictors(p)
    shape = dict(dim=8, ffn=16, layers=1, heads=2, kv_heads=1, vocab=260)
    preds = {"²": random_predictors(1, 8, 16, 2)[0]}
    g = write_powerinfer_gguf(tmp_path / "g.gguf", **shape, predictors=preds)
    with pytest.raises(ModelFileError, match="bad predictor tensor name"):
        load_powerinfer_gguf(g)


def _set_block_count(path: Path, n: int) -> None:
    """Overwrite the u32 ``llama.block_count`` of a GGUF file in place."""
    data = bytearray(path.read_bytes())
    key = b"llama.block_count"
    pos = data.index(key) + len(key)
    assert int.from_bytes(data[pos : pos + 4], "little") == 4  # GGUF type u32
    data[pos + 4 : pos + 8] = n.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_huge_block_count_fails_fast(tmp_path):
    """fuzz_powerinfer_gguf's timeout: ``block_count`` = 11075585 in a 15 KB file spent
    minutes and 2 GB listing the tensors it needs before finding the first one missing."""
    import signal

    from powerinfer_rs.loading import load_model
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf
    from powerinfer_rs.testing.synth import write_gguf_model

    shape = dict(dim=8, ffn=16, layers=1, heads=2, kv_heads=1, vocab=260)
    pi = write_powerinfer_gguf(tmp_path / "pi.gguf", **shape)
    plain = write_gguf_model(tmp_path / "plain.gguf", dtype="F32", **shape)

    def hung(signum, frame):
        raise TimeoutError("the loader still walks the layers (took over 60 s)")

    # A hang guard, not a speed test: before the fix this took minutes.
    old = signal.signal(signal.SIGALRM, hung)
    try:
        for path, loader in ((pi, load_powerinfer_gguf), (plain, load_model)):
            _set_block_count(path, 11_075_585)
            signal.alarm(60)
            with pytest.raises(ModelFileError, match="11075585 layers need"):
                loader(path)
            signal.alarm(0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_hf_chat_template_list_with_unhashable_name(tmp_path):
    """A ``tokenizer_config.json`` ``chat_template`` list whose entry names a list raised a raw
    ``TypeError: unhashable type`` (building the name -> template map); such entries are now
    skipped like any other malformed one."""
    from powerinfer_rs.loading.hf_loader import _chat_template

    cfg = {"chat_template": [{"name": ["x"], "template": "bad"}, {"name": "tool", "template": "t"}]}
    assert _chat_template(tmp_path, cfg) == "t"


def test_hf_index_shard_name_too_long_is_model_file_error(tmp_path):
    """fuzz_hf_dir: a ``weight_map`` shard name longer than the file system allows raised a raw
    ``OSError: [Errno 36] File name too long`` from ``Path.is_file()``."""
    import json

    from powerinfer_rs.loading.hf_loader import _weight_files

    index = {"weight_map": {"model.norm.weight": "m" * 300 + ".safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFileError, match="is missing"):
        _weight_files(tmp_path)
