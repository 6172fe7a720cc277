"""Regression tests of the fuzzing findings (``fuzz/``): each input the fuzzers found to escape
as an untyped exception must now end in a typed :class:`PowerInferError`, and every committed
seed of every Python fuzz target still replays cleanly."""

from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, PowerInferError
from powerinfer_rs.formats.samples import SampleWriter, load_samples, shard_path
from powerinfer_rs.loading.torch_pt import load_pt, save_pt

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"


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


def _targets() -> list[Path]:
    return sorted((FUZZ / "targets").glob("fuzz_*.py"))


@pytest.mark.parametrize("target", _targets(), ids=lambda p: p.stem[len("fuzz_") :])
def test_fuzz_seeds_replay(target):
    """Every committed seed (valid files and past findings' inputs) of every Python target
    ends in a result or a PowerInferError."""
    spec = importlib.util.spec_from_file_location(f"_fuzz_{target.stem}", target)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    one_input = mod.load()
    seeds = sorted((FUZZ / "seeds" / target.stem[len("fuzz_") :]).iterdir())
    assert seeds, f"no seeds for {target.name}"
    valid = 0
    for seed in seeds:
        try:
            one_input(seed.read_bytes())
            valid += 1
        except PowerInferError:
            assert seed.name.startswith("regress-"), f"seed {seed.name} does not load"
    assert valid, "no seed loads"


DEEP = "[" * 100_000  # json raises RecursionError (not a ValueError) on this


def test_deeply_nested_json_is_a_typed_error(tmp_path):
    """Every JSON reader of untrusted files: a nesting deeper than the interpreter's recursion
    limit used to escape as a raw RecursionError."""
    from powerinfer_rs.errors import PlanError
    from powerinfer_rs.formats.samples import read_meta
    from powerinfer_rs.formats.thresholds import load_thresholds
    from powerinfer_rs.loading.hf_loader import load_json
    from powerinfer_rs.loading.powerinfer_dirs import read_sparse_threshold
    from powerinfer_rs.loading.safetensors_mmap import read_safetensors
    from powerinfer_rs.planning.hardware_profile import load_hardware

    j = tmp_path / "deep.json"
    j.write_text(DEEP)
    with pytest.raises(ModelFileError, match="thresholds"):
        load_thresholds(j)
    with pytest.raises(ModelFileError, match="JSON"):
        load_json(j)
    with pytest.raises(PlanError, match="hardware profile"):
        load_hardware(j)
    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(ModelFileError, match="unreadable"):
        read_sparse_threshold(tmp_path)
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "meta.json").write_text(DEEP)
    with pytest.raises(ModelFileError, match="unreadable"):
        read_meta(tmp_path)
    header = DEEP.encode()
    st = tmp_path / "deep.safetensors"
    st.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelFileError, match="not valid JSON"):
        read_safetensors(st)


def test_deeply_nested_predictor_metadata_is_a_typed_error(tmp_path):
    from safetensors.numpy import save_file

    from powerinfer_rs.formats.predictors import FORMAT, load_predictors

    p = tmp_path / "p.safetensors"
    save_file({}, str(p), {"format": FORMAT, "layers": DEEP})
    with pytest.raises(ModelFileError, match="malformed predictor metadata"):
        load_predictors(p)


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
    import dataclasses

    from powerinfer_rs.errors import ShapeError
    from powerinfer_rs.loading.types import ModelConfig

    cfg = ModelConfig(
        arch="llama",
        n_layers=1,
        dim=8,
        ffn_dim=16,
        n_heads=2,
        n_kv_heads=1,
        head_dim=4,
        vocab_size=260,
        max_context=64,
        rms_eps=1e-5,
        rope_theta=1e4,
        rope_style="norm",
        activation="relu",
        bos_token_id=None,
    )
    cfg.validate()
    with pytest.raises(ShapeError, match="positive and finite"):
        dataclasses.replace(cfg, **{key: float("inf")}).validate()


def _plan_variant(tmp_path, edit):
    """The plan seed with its ``plan`` JSON edited by ``edit``."""
    import json

    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(str(FUZZ / "seeds" / "plan" / "plan-l2-f16.safetensors"), "numpy") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    j = json.loads(meta["plan"])
    edit(j)
    meta["plan"] = json.dumps(j)
    out = tmp_path / "plan.safetensors"
    save_file(tensors, str(out), meta)
    return out


PLAN_EDITS = {
    # IndexError in the GPU byte accounting of load_plan(path, model) before the fix
    "short predictor flags": lambda j: j["placement"].update(predictor=[True]),
    "short allocations": lambda j: j["predictors"].update(allocations=[[1, 2]]),
    "short ranks": lambda j: j["predictors"].update(ranks=[1]),
    "empty allocation": lambda j: j["predictors"].update(allocations=[[], []]),
    "negative allocation": lambda j: j["predictors"].update(allocations=[[-5, 2], [1, 2]]),
    # silently truncated by int() before the fix (the engine's Rust reader refuses them)
    "float bucket": lambda j: j.update(bucket=2.5),
    "float ffn_buckets": lambda j: j["placement"].update(ffn_buckets=[3.7, 3]),
    "bool context": lambda j: j.update(context=True),
}


@pytest.mark.parametrize("what", list(PLAN_EDITS))
def test_malformed_plan_placement_is_plan_error(tmp_path, what):
    import sys

    from powerinfer_rs.errors import PlanError
    from powerinfer_rs.formats.plan import load_plan

    sys.path.insert(0, str(FUZZ))
    from harness import plan_shape

    path = _plan_variant(tmp_path, lambda j: None)
    load_plan(path, plan_shape(), 1 << 30)  # the seed itself is good
    path = _plan_variant(tmp_path, PLAN_EDITS[what])
    for args in ((), (plan_shape(), 1 << 30)):
        with pytest.raises(PlanError, match=str(path)):
            load_plan(path, *args)


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


@pytest.mark.parametrize(
    "ffn", [np.array([8, 8]), np.array([[8]]), np.array(8 + 0j), np.array(8.0)], ids=str
)
def test_sample_shard_ffn_must_be_an_integer_scalar(tmp_path, ffn):
    """A shard whose ``ffn`` entry is an array or a complex number raised a raw TypeError from
    ``int()``; a float was silently truncated."""
    with SampleWriter(tmp_path, 1, 4, 8, shard_rows=2) as w:
        w.add(0, np.ones((2, 4), np.float32), np.eye(2, 8, dtype=bool))
    shard = shard_path(tmp_path / "samples", 0, 0)
    with np.load(shard) as z:
        x, mask = z["x"], z["mask"]
    np.savez(shard, x=x, mask=mask, ffn=ffn)
    with pytest.raises(ModelFileError, match="ffn must be an integer scalar"):
        load_samples(tmp_path, 0)


def _pt_with_view(path: Path, size: tuple[int, ...], stride: tuple[int, ...]) -> Path:
    """A .pt file holding one float32 tensor of 4 stored elements viewed with ``size`` and
    ``stride`` (written opcode by opcode as ``save_pt`` does)."""
    from powerinfer_rs.loading import torch_pt as tp

    pid = tp._tuple(
        [
            tp._unicode("storage"),
            tp._global("torch", "FloatStorage"),
            tp._unicode("0"),
            tp._unicode("cpu"),
            tp._intop(4),
        ]
    )
    args = tp._tuple(
        [
            pid + b"Q",
            tp._intop(0),
            tp._tuple([tp._intop(d) for d in size]),
            tp._tuple([tp._intop(s) for s in stride]),
            b"\x89",
            tp._global("collections", "OrderedDict") + b")R",
        ]
    )
    pkl = b"\x80\x02" + tp._global("torch._utils", "_rebuild_tensor_v2") + args + b"R."
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


BIG = "1" + "0" * 400  # a JSON integer too large for a float: float() raises OverflowError


def test_json_numbers_out_of_float_range_are_typed_errors(tmp_path):
    """Integers beyond the float range (OverflowError from float()), non-list ``architectures``
    (TypeError from iterating an int) and huge dimensions (ValueError from numpy) used to
    escape the JSON readers untyped."""
    import json

    from powerinfer_rs.formats.samples import read_meta
    from powerinfer_rs.formats.thresholds import load_thresholds
    from powerinfer_rs.loading.hf_loader import config_from_hf
    from powerinfer_rs.loading.powerinfer_dirs import read_sparse_threshold

    t = tmp_path / "t.json"
    for doc in (
        f'{{"thresholds": [{BIG}]}}',
        f'{{"thresholds": [0.1], "target_sparsity": {BIG}}}',
        f'{{"thresholds": [0.1], "measured_sparsity": [{BIG}]}}',
    ):
        t.write_text(doc)
        with pytest.raises(ModelFileError, match="out of range"):
            load_thresholds(t)
    (tmp_path / "config.json").write_text(f'{{"sparse_threshold": {BIG}}}')
    with pytest.raises(ModelFileError, match="finite number"):
        read_sparse_threshold(tmp_path)
    base = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "intermediate_size": 128,
        "vocab_size": 300,
    }
    config_from_hf(base).validate()
    for bad in ({"architectures": 5}, {"rope_theta": int(BIG)}, {"rms_norm_eps": int(BIG)}):
        with pytest.raises(ModelFileError, match="config.json"):
            config_from_hf({**base, **bad})
    with SampleWriter(tmp_path / "s", 1, 4, 8) as w:
        w.add(0, np.ones((1, 4)), np.ones((1, 8)))
    meta_path = tmp_path / "s" / "samples" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for key in ("dim", "ffn_dim"):
        meta_path.write_text(json.dumps({**meta, key: 10**30}))
        with pytest.raises(ModelFileError, match=f"{key} must be an integer in"):
            read_meta(tmp_path / "s")


def test_profile_token_count_beyond_int64_is_a_typed_error(tmp_path):
    """A 400-digit ``tokens`` loaded, and ``frequencies()`` then raised OverflowError."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from powerinfer_rs.formats.profile import read_profile, write_profile

    p = write_profile(tmp_path, [np.arange(4)], 10)
    with safe_open(str(p), "numpy") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    save_file(tensors, str(p), {**meta, "tokens": BIG})
    with pytest.raises(ModelFileError, match="tokens must be in"):
        read_profile(p)


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
    import time

    from powerinfer_rs.loading import load_model
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf
    from powerinfer_rs.testing.synth import write_gguf_model

    shape = dict(dim=8, ffn=16, layers=1, heads=2, kv_heads=1, vocab=260)
    pi = write_powerinfer_gguf(tmp_path / "pi.gguf", **shape)
    plain = write_gguf_model(tmp_path / "plain.gguf", dtype="F32", **shape)
    for path, loader in ((pi, load_powerinfer_gguf), (plain, load_model)):
        _set_block_count(path, 11_075_585)
        t0 = time.perf_counter()
        with pytest.raises(ModelFileError, match="11075585 layers need"):
            loader(path)
        assert time.perf_counter() - t0 < 2.0
