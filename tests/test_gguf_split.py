"""Split GGUF files, as gguf-py's writer splits them (``convert_hf_to_gguf.py
--split-max-tensors``; the same layout as llama.cpp's ``gguf-split``): found from the first
shard by name, each tensor a view of its own shard's map, the same logits as the unsplit file
bit for bit, and every inconsistency a ModelFileError naming the shard."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.info import report
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.gguf_loader import open_gguf
from powerinfer_rs.loading.gguf_split import shard_of_name, split_path, split_prefix
from powerinfer_rs.runtime.prepared import model_paths, model_problem, model_record
from powerinfer_rs.testing.synth import write_gguf_model

from conftest import SMALL

SPEC = dict(SMALL, seed=5, activation="silu")  # llama.cpp's own: its logits compare
#: tensors per shard: the small model's 23 tensors in 5 shards
PER_SHARD = 5


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """(the unsplit file, the first shard of the same model split) in Q8_0."""
    d = tmp_path_factory.mktemp("split")
    whole = write_gguf_model(d / "whole" / "m-Q8_0.gguf", dtype="Q8_0", **SPEC)
    first = write_gguf_model(
        d / "split" / "m-Q8_0.gguf", dtype="Q8_0", split_max_tensors=PER_SHARD, **SPEC
    )
    return whole, first


def _copy_split(first: Path, dest: Path) -> list[Path]:
    """Copy every shard of ``first`` into ``dest``; returns the copies in shard order."""
    dest.mkdir()
    out = []
    for p in sorted(first.parent.glob("*-of-*.gguf")):
        out.append(Path(shutil.copy(p, dest / p.name)))
    return out


def test_the_writer_names_and_keys_shards_as_llama_cpp(files):
    _, first = files
    assert first.name == "m-Q8_0-00001-of-00005.gguf"
    f = open_gguf(first)
    assert [Path(p).name for p in f.paths] == [
        f"m-Q8_0-{i:05d}-of-00005.gguf" for i in (1, 2, 3, 4, 5)
    ]
    total = sum(len(s.tensors) for s in f.shards)
    for i, s in enumerate(f.shards):
        assert (s.metadata["split.no"], s.metadata["split.count"]) == (i, 5)
        assert s.metadata["split.tensors.count"] == total == len(f.tensors)
    # The model's keys are in the first shard only, as gguf-split and gguf-py write them.
    assert "general.architecture" in f.shards[0].metadata
    assert "general.architecture" not in f.shards[1].metadata
    assert f.metadata is f.shards[0].metadata


def test_split_names_are_llama_cpps():
    """Ours against llama.cpp's own llama_split_path / llama_split_prefix where the bindings
    are installed, else against the format string they print."""
    assert split_path("/m/x", 0, 3) == "/m/x-00001-of-00003.gguf"
    assert split_prefix("/m/x-00002-of-00003.gguf", 1, 3) == "/m/x"
    assert split_prefix("/m/x-00002-of-00003.gguf", 0, 3) is None
    assert split_prefix("-00001-of-00003.gguf", 0, 3) is None  # an empty prefix, as llama.cpp
    assert shard_of_name("a/b-00003-of-00004.gguf") == ("a/b", 2, 4)
    assert shard_of_name("a/b-00001-of-00001.gguf") is None
    assert shard_of_name("a/b.gguf") is None
    try:
        import llama_cpp
    except ImportError:
        return
    buf = ctypes.create_string_buffer(512)
    for prefix, no, count in (("/m/x", 0, 3), ("rel/y-z", 11, 12)):
        n = llama_cpp.llama_split_path(buf, 512, prefix.encode(), no, count)
        assert buf.value.decode() == split_path(prefix, no, count) and n == len(buf.value)
        n = llama_cpp.llama_split_prefix(
            buf, 512, split_path(prefix, no, count).encode(), no, count
        )
        assert buf.value.decode()[:n] == split_prefix(split_path(prefix, no, count), no, count)


def test_split_file_runs_as_the_unsplit_one_bit_for_bit(files):
    whole, first = files
    a, b = load_model(whole), load_model(first)
    assert a.fingerprint == b.fingerprint
    assert b.files == open_gguf(first).paths and len(b.files) == 5 and a.files == [str(whole)]
    # Zero copy: each tensor is a view of the map of the shard that holds it.
    f = open_gguf(first)
    shard_of = {t.name.removesuffix(".weight"): t.shard for t in f.tensors}
    assert len(set(shard_of.values())) == 5
    maps = [np.memmap(p, dtype=np.uint8, mode="r") for p in f.paths]
    for name, t in b.tensors.items():
        if name == "output" and b.config.tie_embeddings:
            continue
        base = t.data
        while getattr(base, "base", None) is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap) and base.filename == os.path.abspath(
            f.paths[shard_of[name]]
        ), name
    del maps
    ids = [int(i) for i in np.random.default_rng(0).integers(3, SPEC["vocab"], 9)]
    want = Engine(a, threads=1).logits(ids)
    got = Engine(b, threads=1).logits(ids)
    assert np.array_equal(want, got)


def test_prepared_records_and_info_show_every_shard(files, tmp_path):
    _, first = files
    assert [p.name for p in model_paths(first)] == [
        f"m-Q8_0-{i:05d}-of-00005.gguf" for i in range(1, 6)
    ]
    # A prepared directory's record of the model: every shard, and a rewrite of any is seen.
    shards = _copy_split(first, tmp_path / "c")
    record = model_record(shards[0])
    assert [r["name"] for r in record] == [p.name for p in shards]
    assert model_problem(shards[0], record) is None
    data = bytearray(shards[3].read_bytes())
    data[-1] ^= 1
    shards[3].write_bytes(bytes(data))
    assert model_problem(shards[0], record) == f"{shards[3]} has changed"
    text = report(load_model(first), None, None, 64)
    assert "shards       5 files: m-Q8_0-00001-of-00005.gguf (" in text
    assert "m-Q8_0-00005-of-00005.gguf (" in text


def test_a_missing_shard_is_named(files, tmp_path):
    _, first = files
    shards = _copy_split(first, tmp_path / "c")
    shards[3].unlink()
    with pytest.raises(
        ModelFileError, match=r"m-Q8_0-00004-of-00005\.gguf: shard 4 of 5 .*missing"
    ):
        load_model(shards[0])


def test_a_later_shard_given_names_the_first(files):
    _, first = files
    later = first.with_name("m-Q8_0-00003-of-00005.gguf")
    with pytest.raises(
        ModelFileError, match="shard 3 of 5.*open the first shard, .*m-Q8_0-00001-of-00005"
    ):
        load_model(later)


def test_a_shard_of_another_position_or_count_is_named(files, tmp_path):
    _, first = files
    shards = _copy_split(first, tmp_path / "c")
    shutil.copy(shards[2], shards[1])  # shard 3 in shard 2's place
    with pytest.raises(ModelFileError, match=r"00002-of-00005\.gguf: says it is shard 3 of 5"):
        load_model(shards[0])
    # A shard of a split of another count (the same model in 4 shards) in shard 2's place.
    other = write_gguf_model(
        tmp_path / "o" / "m-Q8_0.gguf", dtype="Q8_0", split_max_tensors=6, **SPEC
    )
    shutil.copy(other.with_name("m-Q8_0-00002-of-00004.gguf"), shards[1])
    with pytest.raises(ModelFileError, match=r"00002-of-00005\.gguf: says it is shard 2 of 4"):
        load_model(shards[0])


def test_a_first_shard_not_named_as_one_is_refused(files, tmp_path):
    _, first = files
    shards = _copy_split(first, tmp_path / "c")
    renamed = shards[0].with_name("model.gguf")
    shards[0].rename(renamed)
    with pytest.raises(ModelFileError, match="not named '<name>-00001-of-00005.gguf'"):
        load_model(renamed)


def _write_shards(d: Path, shards: list[list[str]], total: int) -> Path:
    """A split of F32 vectors named by ``shards`` (one list of names per shard), its keys
    saying ``total`` tensors; returns the first shard."""
    count = len(shards)
    for i, names in enumerate(shards):
        w = gguf.GGUFWriter(split_path(str(d / "t"), i, count), "llama")
        w.add_uint16("split.no", i)
        w.add_uint16("split.count", count)
        w.add_int32("split.tensors.count", total)
        for n in names:
            w.add_tensor(n, np.zeros(32, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return Path(split_path(str(d / "t"), 0, count))


def test_duplicate_and_missing_tensors_are_named(tmp_path):
    (tmp_path / "dup").mkdir()
    first = _write_shards(tmp_path / "dup", [["a.weight", "b.weight"], ["b.weight"]], 3)
    with pytest.raises(
        ModelFileError,
        match=r"t-00002-of-00002\.gguf: tensor 'b.weight' is also in .*t-00001-of-00002\.gguf",
    ):
        open_gguf(first)
    (tmp_path / "few").mkdir()
    first = _write_shards(tmp_path / "few", [["a.weight"], ["b.weight"]], 3)
    with pytest.raises(
        ModelFileError,
        match=r"t-00001-of-00002\.gguf: split.tensors.count says 3 tensors, its 2 shards hold 2",
    ):
        open_gguf(first)
    (tmp_path / "ok").mkdir()
    assert (
        len(open_gguf(_write_shards(tmp_path / "ok", [["a.weight"], ["b.weight"]], 2)).tensors) == 2
    )


def test_gguf_split_output_runs_bit_for_bit(files, tmp_path):
    """Shards written by ggml's own GGUF writer, as gguf-split writes them (with and without
    --no-tensor-first-split: a first shard of keys only), run as the unsplit file."""
    pytest.importorskip("llama_cpp")
    from powerinfer_rs.testing.ggml_split import ggml_split

    whole, _ = files
    ids = [int(i) for i in np.random.default_rng(2).integers(3, SPEC["vocab"], 7)]
    want = Engine(load_model(whole), threads=1).logits(ids)
    for first_empty in (False, True):
        d = tmp_path / f"ggml{int(first_empty)}"
        d.mkdir()
        shards = ggml_split(whole, str(d / "m"), 7, no_tensor_first_split=first_empty)
        f = open_gguf(shards[0])
        counts = [len(s.tensors) for s in f.shards]
        assert counts[0] == (0 if first_empty else 7) and sum(counts) == len(f.tensors)
        assert "general.architecture" not in f.shards[1].metadata
        got = Engine(load_model(shards[0]), threads=1).logits(ids)
        assert np.array_equal(got, want)


def test_llama_cpp_loads_the_same_split(files, tmp_path):
    """llama.cpp opens both splits (gguf-py's, ggml's) from their first shard and computes the
    unsplit file's logits bit for bit; ours are close to its."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from powerinfer_rs.testing.ggml_split import ggml_split

    whole, first = files
    ids = [int(i) for i in np.random.default_rng(1).integers(3, SPEC["vocab"], 6)]

    def scores(path):
        llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=32, n_threads=2, logits_all=True, verbose=False,
            type_k=0, type_v=0,
        )  # fmt: skip
        llm.eval(ids)
        return np.asarray(llm.scores[: len(ids)])

    theirs = scores(whole)
    assert np.array_equal(scores(first), theirs)
    assert np.array_equal(scores(ggml_split(whole, str(tmp_path / "g"), 6)[0]), theirs)
    ours = Engine(load_model(first), threads=1, kv_cache="f32").logits(ids)
    # Both quantize x their own way over Q8_0 weights: close, not equal.
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) <= 1e-2


def test_the_real_model_split_by_ggml_runs_bit_for_bit(smol_path, smol, tmp_path):
    """SmolLM2-135M-Instruct Q4_1, split in three by ggml's writer as gguf-split splits it."""
    pytest.importorskip("llama_cpp")
    from powerinfer_rs.testing.ggml_split import ggml_split

    n = len(open_gguf(smol_path).tensors)
    shards = ggml_split(smol_path, str(tmp_path / "smol"), -(-n // 3))
    assert len(shards) == 3
    split = load_model(shards[0])
    assert split.fingerprint == smol.fingerprint and len(split.files) == 3
    ids = split.tokenizer.encode("The capital of France is", add_bos=True)
    want = Engine(smol, threads=2).logits(ids)
    assert np.array_equal(Engine(split, threads=2).logits(ids), want)
