"""Regression tests of the fuzzing findings (``fuzz/``) in the readers of our own files (plan,
profile, thresholds, predictors, samples) and the JSON they hold. Each input that escaped as an
untyped exception must now end in a typed :class:`PowerInferError`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.formats.samples import SampleWriter, load_samples, shard_path

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"


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
    # fuzz_plan: AttributeError ('int' object has no attribute 'get') in gpu_bytes
    "bytes.gpu not an object": lambda j: j.update(bytes={"gpu": 5}),
    "bytes.gpu.total not a count": lambda j: j.update(bytes={"gpu": {"total": [1]}}),
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


@pytest.mark.parametrize("dtype", [[2, 3], {"a": 1}], ids=["list", "object"])
def test_safetensors_unhashable_dtype_is_model_file_error(tmp_path, dtype):
    """fuzz_safetensors_mmap: a header entry whose ``dtype`` is a JSON list raised a raw
    ``TypeError: unhashable type`` from the dtype table lookup."""
    import json

    from powerinfer_rs.loading.safetensors_mmap import read_safetensors

    header = json.dumps({"a": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}).encode()
    p = tmp_path / "x.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
    with pytest.raises(ModelFileError, match="malformed dtype"):
        read_safetensors(p)


def test_predictor_metadata_must_be_strings(tmp_path):
    """Non-string ``__metadata__`` values (the safetensors spec allows strings only) reached
    the predictor set: a list ``dtype`` then raised ``TypeError: unhashable type`` in
    ``nbytes()``, a list fingerprint compared unequal to every model."""
    import json

    from powerinfer_rs.formats.predictors import FORMAT, load_predictors

    p = tmp_path / "p.safetensors"
    meta = {"format": FORMAT, "model_fingerprint": ["x"]}
    header = json.dumps({"__metadata__": meta}).encode()
    p.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelFileError, match="metadata values must be strings"):
        load_predictors(p)
