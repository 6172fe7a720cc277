"""Model loading: GGUF and HF directories, zero copy, and every malformed input -> our errors."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.gguf_file import GGUFFile
from powerinfer_rs.loading.safetensors_mmap import read_safetensors
from powerinfer_rs.loading.types import expected_shapes, row_bytes
from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights, f32_to_bf16_bits, permute_qk

from conftest import SMALL


def _root_map(a: np.ndarray) -> np.ndarray:
    """The outermost ndarray in ``a``'s base chain."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def assert_zero_copy(model) -> None:
    maps = set()
    for name, t in model.tensors.items():
        root = _root_map(t.data)
        assert isinstance(root, np.memmap), name
        assert np.shares_memory(t.data, root), name
        lo = root.ctypes.data
        assert lo <= t.data.ctypes.data and t.data.ctypes.data + t.data.size <= lo + root.size
        assert not t.data.flags.writeable, name
        assert t.data.dtype == np.uint8 and t.data.ndim == 1 and t.data.flags.c_contiguous
        maps.add(id(root))
    return maps


# --------------------------------------------------------------------------- SmolLM2
def test_smol_config(smol):
    c = smol.config
    assert (c.arch, c.n_layers, c.dim, c.ffn_dim) == ("llama", 30, 576, 1536)
    assert (c.n_heads, c.n_kv_heads, c.head_dim) == (9, 3, 64)
    assert (c.vocab_size, c.max_context) == (49152, 8192)
    assert c.rope_theta == 100000.0 and abs(c.rms_eps - 1e-5) < 1e-9
    assert (c.rope_style, c.activation) == ("norm", "silu")
    assert (c.bos_token_id, c.eos_token_ids, c.add_bos) == (1, [2], False)
    assert c.tie_embeddings
    assert "<|im_start|>" in smol.chat_template


def test_smol_tensors(smol):
    t = smol.tensors
    assert t["output"] is t["token_embd"]
    assert t["token_embd"].dtype == "Q8_0"
    assert (t["token_embd"].rows, t["token_embd"].cols) == (49152, 576)
    assert t["blk.0.attn_q"].dtype == "Q4_1" and t["blk.29.ffn_down"].dtype == "Q4_1"
    assert (t["blk.0.ffn_down"].rows, t["blk.0.ffn_down"].cols) == (576, 1536)
    assert (t["blk.0.attn_k"].rows, t["blk.0.attn_k"].cols) == (192, 576)
    assert t["output_norm"].dtype == "F32" and t["blk.3.ffn_norm"].rows == 1
    for name, (rows, cols) in expected_shapes(smol.config).items():
        assert (t[name].rows, t[name].cols) == (rows, cols)
        assert t[name].data.size == rows * row_bytes(t[name].dtype, cols)


def test_smol_zero_copy(smol):
    assert len(assert_zero_copy(smol)) == 1  # every tensor is a view of the same file map


def test_gguf_parser_matches_gguf_reader(smol_path, synth_gguf):
    gguf = pytest.importorskip("gguf")
    for path in (smol_path, synth_gguf("Q4_1")):
        ours = GGUFFile(path)
        ref = gguf.GGUFReader(path)
        for key, fld in ref.fields.items():
            if not key.startswith("GGUF."):
                assert ours.metadata[key] == pytest.approx(fld.contents()), key
        assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
        for a, b in zip(ours.tensors, ref.tensors):
            assert a.offset == b.data_offset and list(a.dims) == b.shape.tolist()
            assert a.type_name == b.tensor_type.name


def test_fingerprint_stable(smol, smol_path):
    assert load_model(smol_path).fingerprint == smol.fingerprint


# --------------------------------------------------------------------------- synthetic HF
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_hf_dir(synth_hf, dtype):
    m = load_model(synth_hf(dtype))
    c = m.config
    assert (c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim) == (
        2,
        64,
        128,
        4,
        2,
        16,
    )
    assert (c.vocab_size, c.rope_style, c.activation, c.tie_embeddings) == (
        300,
        "neox",
        "relu",
        False,
    )
    assert (c.bos_token_id, c.eos_token_ids, c.add_bos) == (0, [2], False)
    assert m.chat_template and "<|im_start|>" in m.chat_template
    assert m.tensors["output"] is not m.tensors["token_embd"]
    st = {"bf16": "BF16", "f16": "F16", "f32": "F32"}[dtype]
    assert {t.dtype for t in m.tensors.values()} == {st}
    assert_zero_copy(m)
    # the bytes are the generator's values in the file's dtype
    w = SynthWeights(SynthSpec(**SMALL)).tensor("blk.1.attn_q")
    enc = {"BF16": f32_to_bf16_bits(w), "F16": w.astype(np.float16), "F32": w}[st]
    assert m.tensors["blk.1.attn_q"].data.tobytes() == enc.tobytes()


def test_hf_sharded_matches_single(synth_hf):
    single = load_model(synth_hf("f32"))
    sharded_dir = synth_hf("f32", shards=2)
    assert (sharded_dir / "model.safetensors.index.json").is_file()
    sharded = load_model(sharded_dir)
    assert len(assert_zero_copy(sharded)) == 2
    assert sharded.fingerprint == single.fingerprint
    for name, t in single.tensors.items():
        assert sharded.tensors[name].data.tobytes() == t.data.tobytes()


def test_hf_tied(synth_hf):
    m = load_model(synth_hf("f32", tie=True))
    assert m.config.tie_embeddings and m.tensors["output"] is m.tensors["token_embd"]


def test_safetensors_readable_by_reference_lib(synth_hf):
    st = pytest.importorskip("safetensors.numpy")
    d = synth_hf("f16")
    ref = st.load_file(str(d / "model.safetensors"))
    ours = read_safetensors(d / "model.safetensors")
    assert set(ref) == set(ours)
    for k, v in ref.items():
        assert ours[k].shape == v.shape and ours[k].data.tobytes() == v.tobytes()


def test_gguf_synthetic_permuted(synth_gguf):
    m = load_model(synth_gguf("F32"))
    assert m.config.rope_style == "norm" and m.config.activation == "relu"
    assert_zero_copy(m)
    w = SynthWeights(SynthSpec(**SMALL)).tensor("blk.0.attn_k")
    assert m.tensors["blk.0.attn_k"].data.tobytes() == permute_qk(w, 2).tobytes()


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_0", "Q4_1"])
def test_gguf_dtypes(synth_gguf, dtype):
    m = load_model(synth_gguf(dtype))
    assert m.tensors["blk.1.ffn_up"].dtype == dtype
    assert m.tensors["blk.1.ffn_norm"].dtype == "F32"


# --------------------------------------------------------------------------- bad inputs
def test_missing_paths(tmp_path):
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "nope.gguf")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFileError):
        load_model(tmp_path / "notes.txt")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(ModelFileError, match="config.json"):
        load_model(tmp_path / "emptydir")


def test_truncated_gguf(synth_gguf, tmp_path):
    src = synth_gguf("Q8_0").read_bytes()
    header_end = GGUFFile(synth_gguf("Q8_0")).data_start
    data_end = max(
        t.data.ctypes.data - _root_map(t.data).ctypes.data + t.data.size
        for t in load_model(synth_gguf("Q8_0")).tensors.values()
    )
    assert data_end <= len(src)  # the file may end with alignment padding
    for cut in (0, 3, 10, 30, 200, header_end // 2, header_end - 5, header_end + 100, data_end - 1):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(src[:cut])
        with pytest.raises(ModelFileError):
            load_model(p)


def test_garbage_gguf(tmp_path):
    rng = np.random.default_rng(1)
    for i in range(20):
        body = rng.integers(0, 256, size=int(rng.integers(0, 4000)), dtype=np.uint8).tobytes()
        p = tmp_path / f"g{i}.gguf"
        # valid magic and version, then random counts and bytes
        p.write_bytes(b"GGUF" + struct.pack("<I", 3) + body)
        with pytest.raises((ModelFileError, UnsupportedError)):
            load_model(p)


def test_corrupt_gguf_counts(synth_gguf, tmp_path):
    src = bytearray(synth_gguf("F32").read_bytes())
    src[16:24] = struct.pack("<Q", 2**40)  # absurd key/value count
    p = tmp_path / "counts.gguf"
    p.write_bytes(bytes(src))
    with pytest.raises(ModelFileError):
        load_model(p)


def _patch_after(data: bytes, needle: bytes, skip: int, new: bytes) -> bytes:
    i = data.index(needle) + len(needle) + skip
    return data[:i] + new + data[i + len(new) :]


def test_gguf_unsupported_arch(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    needle = b"general.architecture"
    # value: u32 type (8) + u64 length (5) + "llama"
    patched = _patch_after(src, needle, 12, b"mamba")
    p = tmp_path / "mamba.gguf"
    p.write_bytes(patched)
    with pytest.raises(UnsupportedError, match="llama"):
        load_model(p)


def test_gguf_unsupported_tensor_type(synth_gguf, tmp_path):
    src = synth_gguf("F32").read_bytes()
    # tensor info: name, u32 n_dims (2), 2 x u64 dims, then u32 type -> 9 (Q8_1)
    patched = _patch_after(src, b"blk.0.ffn_gate.weight", 4 + 16, struct.pack("<I", 9))
    p = tmp_path / "q8_1.gguf"
    p.write_bytes(patched)
    with pytest.raises(UnsupportedError, match="blk.0.ffn_gate.weight.*Q8_1"):
        load_model(p)


def _copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors(synth_hf, tmp_path):
    d = _copy_dir(synth_hf("bf16"), tmp_path / "m")
    f = d / "model.safetensors"
    full = f.read_bytes()
    for cut in (0, 5, 8, 40, len(full) // 2, len(full) - 1):
        f.write_bytes(full[:cut])
        with pytest.raises(ModelFileError):
            load_model(d)


def _rewrite_header(f, edit, extra: bytes = b"") -> None:
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    edit(header)
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :] + extra)


def test_bad_safetensors_header(synth_hf, tmp_path):
    d = _copy_dir(synth_hf("f32"), tmp_path / "m")
    f = d / "model.safetensors"
    orig = f.read_bytes()
    (n,) = struct.unpack("<Q", orig[:8])
    f.write_bytes(orig[:8] + b"{not json" + orig[17:])
    with pytest.raises(ModelFileError, match="JSON"):
        load_model(d)
    f.write_bytes(struct.pack("<Q", 2**62) + orig[8:])
    with pytest.raises(ModelFileError):
        load_model(d)
    f.write_bytes(orig)

    def bad_offsets(h):
        h["model.norm.weight"]["data_offsets"] = [0, 10**12]

    _rewrite_header(f, bad_offsets)
    with pytest.raises(ModelFileError, match="model.norm.weight"):
        load_model(d)
    f.write_bytes(orig)

    def bad_dtype(h):
        h["model.norm.weight"]["dtype"] = "F64"
        h["model.norm.weight"]["shape"] = [32]

    _rewrite_header(f, bad_dtype)
    with pytest.raises(UnsupportedError, match="F64"):
        load_model(d)
    f.write_bytes(orig)

    def drop(h):
        del h["model.layers.1.mlp.up_proj.weight"]

    _rewrite_header(f, drop)
    with pytest.raises(ModelFileError, match="blk.1.ffn_up"):
        load_model(d)
    f.write_bytes(orig)

    data_len = len(orig) - 8 - n

    def bias(h):
        # its own bytes after the others' (sharing theirs is an overlap, a ModelFileError)
        norm = h["model.norm.weight"]
        size = norm["data_offsets"][1] - norm["data_offsets"][0]
        h["model.layers.0.self_attn.q_proj.bias"] = dict(
            norm, data_offsets=[data_len, data_len + size]
        )

    norm_size = json.loads(orig[8 : 8 + n])["model.norm.weight"]["data_offsets"]
    _rewrite_header(f, bias, bytes(norm_size[1] - norm_size[0]))
    with pytest.raises(UnsupportedError, match="bias"):
        load_model(d)


def test_bad_config(synth_hf, tmp_path):
    d = _copy_dir(synth_hf("f32"), tmp_path / "m")
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text("{ nope")
    with pytest.raises(ModelFileError, match="config.json"):
        load_model(d)
    cfg_path.write_text(
        json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(UnsupportedError, match="LlamaForCausalLM"):
        load_model(d)
    cfg_path.write_text(json.dumps({**cfg, "intermediate_size": 100}))
    with pytest.raises(ShapeError, match="blk.0.ffn_gate"):
        load_model(d)
    cfg_path.write_text(json.dumps({**cfg, "hidden_act": "tanh"}))
    with pytest.raises(UnsupportedError, match="tanh"):
        load_model(d)
    cfg_path.write_text(json.dumps({**cfg, "num_key_value_heads": 3}))
    with pytest.raises(ShapeError):
        load_model(d)
    cfg_path.write_text(
        json.dumps({**cfg, "rope_scaling": {"type": "ntk-by-parts", "factor": 2.0}})
    )
    with pytest.raises(UnsupportedError, match="RoPE scaling type 'ntk-by-parts'"):
        load_model(d)
    del cfg["hidden_size"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="hidden_size"):
        load_model(d)


def test_bad_index_and_tokenizer(synth_hf, tmp_path):
    d = _copy_dir(synth_hf("f32", shards=2), tmp_path / "m")
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelFileError, match="00002"):
        load_model(d)
    d2 = _copy_dir(synth_hf("f32"), tmp_path / "m2")
    (d2 / "tokenizer.json").write_text("{]")
    with pytest.raises(ModelFileError, match="tokenizer"):
        load_model(d2)
