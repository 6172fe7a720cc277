"""File layout checks: every GGUF tensor's offset against the file's alignment and its type's
block size, inside the file and clear of the others; safetensors offsets likewise."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.loading import BLOCK_LAYOUT, load_model
from powerinfer_rs.loading.gguf_file import GGML_TYPES, GGUFFile
from powerinfer_rs.loading.safetensors_mmap import read_safetensors

from conftest import SMALL


def _info_pos(data: bytes, name: str) -> tuple[int, int]:
    """(position of the tensor info's u32 n_dims, n_dims) of tensor ``name`` in a GGUF file."""
    key = name.encode()
    i = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    (n_dims,) = struct.unpack_from("<I", data, i)
    return i, n_dims


def _field(data: bytes, name: str, what: str) -> int:
    """Position of the ``what`` field ("dims", "type" or "offset") of tensor ``name``."""
    i, n_dims = _info_pos(data, name)
    return {"dims": i + 4, "type": i + 4 + 8 * n_dims, "offset": i + 8 + 8 * n_dims}[what]


def _rel_offset(data: bytes, name: str) -> int:
    return struct.unpack_from("<Q", data, _field(data, name, "offset"))[0]


def _patched(data: bytes, pos: int, new: bytes) -> bytes:
    return data[:pos] + new + data[pos + len(new) :]


def _set_offset(data: bytes, name: str, rel: int) -> bytes:
    return _patched(data, _field(data, name, "offset"), struct.pack("<Q", rel))


def _write(tmp_path, name: str, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _layout_of(gguf, type_id: int, name: str) -> tuple[int, int]:
    """(block size, block bytes) of a ggml type by gguf-py, or, for a type newer than the
    installed gguf-py (Q2_0 in gguf 0.19), by ggml's own type traits."""
    try:
        qt = gguf.GGMLQuantizationType(type_id)
    except ValueError:
        pytest.importorskip("llama_cpp")
        from powerinfer_rs.testing.ggml_quantizer import ggml_traits

        t = ggml_traits(name)
        return int(t.blck_size), int(t.type_size)
    assert qt.name == name
    return gguf.GGML_QUANT_SIZES[qt]


def test_ggml_type_table_matches_gguf_package():
    gguf = pytest.importorskip("gguf")
    for type_id, (name, block, size) in GGML_TYPES.items():
        assert _layout_of(gguf, type_id, name) == (block, size), name
    # Every format the engine takes has ggml's block size, including the Q5 and K-quants.
    assert {"Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"} <= set(BLOCK_LAYOUT)
    ids = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}
    for name, layout in BLOCK_LAYOUT.items():
        assert _layout_of(gguf, ids[name], name) == layout, name


def test_gguf_good_file_sizes(synth_gguf):
    gf = GGUFFile(synth_gguf("Q8_0"))
    model = load_model(synth_gguf("Q8_0"))
    for t in gf.tensors:
        assert t.nbytes is not None and (t.offset - gf.data_start) % gf.alignment == 0
        canon = t.name.removesuffix(".weight")
        assert model.tensors[canon].data.size == t.nbytes, t.name


@pytest.mark.parametrize("dtype", ["F32", "Q8_0", "Q4_1"])
def test_gguf_offset_shifted_by_one_byte(synth_gguf, tmp_path, dtype):
    src = synth_gguf(dtype).read_bytes()
    name = "blk.1.ffn_up.weight"
    rel = _rel_offset(src, name)
    # before the check, this file loaded and its logits were NaN
    p = _write(tmp_path, "shift.gguf", _set_offset(src, name, rel + 1))
    with pytest.raises(ModelFileError, match=rf"'{name}'.*alignment 32"):
        load_model(p)
    with pytest.raises(ModelFileError, match=name):
        GGUFFile(p)


def test_gguf_offset_past_the_end(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    name = "blk.0.attn_q.weight"
    p = _write(tmp_path, "past.gguf", _set_offset(src, name, 32 * (len(src) // 32 + 1)))
    with pytest.raises(ModelFileError, match=rf"'{name}'.*past the end"):
        load_model(p)
    # the last bytes of the tensor just past the end
    gf = GGUFFile(synth_gguf("F32"))
    t = next(t for t in gf.tensors if t.name == name)
    last = (len(src) - gf.data_start - t.nbytes) // 32 * 32 + 32
    p = _write(tmp_path, "past2.gguf", _set_offset(src, name, last))
    with pytest.raises(ModelFileError, match=rf"'{name}'.*past the end"):
        GGUFFile(p)


def test_gguf_overlapping_tensors(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    a, b = "blk.0.ffn_up.weight", "blk.1.ffn_down.weight"
    p = _write(tmp_path, "overlap.gguf", _set_offset(src, b, _rel_offset(src, a)))
    with pytest.raises(ModelFileError, match="overlap") as e:
        load_model(p)
    assert a in str(e.value) and b in str(e.value)
    # a partial overlap: one alignment unit into the other tensor
    p = _write(tmp_path, "overlap2.gguf", _set_offset(src, b, _rel_offset(src, a) + 32))
    with pytest.raises(ModelFileError, match="overlap"):
        GGUFFile(p)


def test_gguf_row_not_whole_blocks(synth_gguf, tmp_path):
    src = synth_gguf("Q8_0").read_bytes()
    name = "blk.0.ffn_gate.weight"
    p = _write(
        tmp_path, "cols.gguf", _patched(src, _field(src, name, "dims"), struct.pack("<Q", 48))
    )
    with pytest.raises(ModelFileError, match=rf"'{name}'.*Q8_0.*multiple of 32"):
        load_model(p)


def test_gguf_truncated_names_the_tensor(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    gf = GGUFFile(synth_gguf("F32"))
    last = max(gf.tensors, key=lambda t: t.offset)
    p = _write(tmp_path, "cut.gguf", src[: last.offset + last.nbytes - 1])
    with pytest.raises(ModelFileError, match=rf"'{last.name}'.*truncated"):
        load_model(p)


def test_gguf_custom_alignment(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "a64.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.data_alignment = 64
    w.add_custom_alignment(64)
    for i in range(3):
        w.add_tensor(f"t{i}", np.full(5, i, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = GGUFFile(path)
    assert gf.alignment == 64 and [t.nbytes for t in gf.tensors] == [20, 20, 20]
    src = path.read_bytes()
    assert _rel_offset(src, "t1") == 64
    # 32-aligned, but not to this file's 64
    p = _write(tmp_path, "a64bad.gguf", _set_offset(src, "t1", 96))
    with pytest.raises(ModelFileError, match="'t1'.*alignment 64"):
        GGUFFile(p)


def test_gguf_unknown_type_still_checked_for_alignment(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    name = "blk.0.attn_k.weight"
    data = _patched(src, _field(src, name, "type"), struct.pack("<I", 200))
    GGUFFile(_write(tmp_path, "unknown.gguf", data))  # parses: sizes unknown, offsets fine
    data = _set_offset(data, name, _rel_offset(src, name) + 2)
    with pytest.raises(ModelFileError, match=name):
        GGUFFile(_write(tmp_path, "unknown2.gguf", data))


def test_powerinfer_gguf_layout_checked(tmp_path):
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf
    from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf

    path = write_powerinfer_gguf(tmp_path / "pwri.gguf", **SMALL)
    src = path.read_bytes()
    name = "blk.0.fc1.weight"
    p = _write(tmp_path, "pwri_shift.gguf", _set_offset(src, name, _rel_offset(src, name) + 4))
    with pytest.raises(ModelFileError, match=name):
        load_powerinfer_gguf(p)


# --------------------------------------------------------------------------- safetensors
def _rewrite(f, edit, extra: bytes = b"") -> None:
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header, len(raw) - 8 - n)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :] + extra)


@pytest.fixture
def st_file(synth_hf, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(synth_hf("f32"), d)
    return d / "model.safetensors"


def test_safetensors_overlap(st_file):
    def alias(h, _):
        h["model.layers.1.mlp.up_proj.weight"]["data_offsets"] = h[
            "model.layers.0.mlp.up_proj.weight"
        ]["data_offsets"]

    _rewrite(st_file, alias)
    with pytest.raises(ModelFileError, match="overlap") as e:
        read_safetensors(st_file)
    assert "model.layers.1.mlp.up_proj.weight" in str(e.value)
    with pytest.raises(ModelFileError, match="overlap"):
        load_model(st_file.parent)


def test_safetensors_partial_overlap(st_file):
    def shift(h, _):
        b, e = h["model.norm.weight"]["data_offsets"]
        # the same size, four bytes into whatever lies before it
        h["model.norm.weight"]["data_offsets"] = [b - 4, e - 4]

    _rewrite(st_file, shift)
    with pytest.raises(ModelFileError, match="overlap"):
        read_safetensors(st_file)


def test_safetensors_reversed_and_negative_offsets(st_file):
    orig = st_file.read_bytes()
    for offs in ([8, 4], [-4, 0], [0, 1.5]):

        def bad(h, _, offs=offs):
            h["model.norm.weight"]["data_offsets"] = offs

        st_file.write_bytes(orig)
        _rewrite(st_file, bad)
        with pytest.raises(ModelFileError, match="model.norm.weight"):
            read_safetensors(st_file)


def test_safetensors_size_mismatch(st_file):
    def grow(h, _):
        h["model.norm.weight"]["shape"] = [h["model.norm.weight"]["shape"][0] * 2]

    _rewrite(st_file, grow)
    with pytest.raises(ModelFileError, match="model.norm.weight.*needs"):
        read_safetensors(st_file)


def test_safetensors_header_length(st_file):
    orig = st_file.read_bytes()
    for n in (0, 1, len(orig), 2**63):
        st_file.write_bytes(struct.pack("<Q", n) + orig[8:])
        with pytest.raises(ModelFileError, match="header length"):
            read_safetensors(st_file)


def test_safetensors_extra_tensor_with_own_bytes_is_fine(st_file):
    extra = np.arange(4, dtype=np.float32).tobytes()

    def add(h, data_len):
        h["extra"] = {"dtype": "F32", "shape": [4], "data_offsets": [data_len, data_len + 16]}

    _rewrite(st_file, add, extra)
    t = read_safetensors(st_file)
    assert np.array_equal(t["extra"].data.view(np.float32), np.arange(4, dtype=np.float32))
